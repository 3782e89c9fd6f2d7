//! OTLP profiles export (`-o FILE.otlp`, `--otlp-endpoint`): the bytes spanprof writes or sends
//! are decoded by an independent decoder (PyPI `opentelemetry-proto`, `tests/tools/decode_otlp.py`)
//! and their contents checked against what the workloads did: the functions of a known
//! workload, the resource attributes of the process, the links of a traced workload. The
//! transports are checked against real receivers: a tonic gRPC server run by the test and the
//! OTLP/HTTP receiver `tests/tools/otlp_http_sink.py` (Python's http.server).

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use prost::Message;
use serde_json::Value;
use spanprof_tests::otlp::{self, read_otel_truth, ready_pid, GrpcSink, HttpSink};
use spanprof_tests::{
    parse_summary, profiling_lock, py_workload_source, pyenv_python, require_root,
    require_span_libs, run_with_timeout, span_libs, spanprof_bin, spanprof_command, RunOutput,
    TempDir,
};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The resource attributes of the resource whose `process.pid` is `pid`.
fn resource_of(decoded: &Value, pid: u32) -> &Value {
    decoded["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| &r["attributes"])
        .find(|a| a["process.pid"].as_u64() == Some(u64::from(pid)))
        .unwrap_or_else(|| panic!("no resource with process.pid {pid} in {decoded:#}"))
}

/// Python function names of a decoded sample, leaf first.
fn functions(sample: &Value) -> Vec<String> {
    otlp::functions(sample)
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Weight of the samples of `sample_type` whose stack has a function named `name` (exactly).
fn weight_of(decoded: &Value, sample_type: &str, name: &str) -> i64 {
    otlp::samples(decoded, sample_type)
        .into_iter()
        .filter(|s| functions(s).iter().any(|f| f == name))
        .map(otlp::sample_weight)
        .sum()
}

/// An OpenTelemetry-traced workload (two threads running spans) profiled on- and off-CPU into
/// an OTLP file: the decoder finds every table well formed, the resource of the process with
/// its service name and environment's attributes, one profile per sample type with a
/// timestamp per event, and samples in spans linked to exactly their span's ids.
#[test]
fn otlp_file_of_a_traced_workload() {
    require_root();
    spanprof_bin();
    let python = pyenv_python(12);
    let libs = span_libs(12);
    require_span_libs(&python, &libs);
    let _lock = profiling_lock();
    let dir = TempDir::new("otlp-file");
    let out = dir.join("run.otlp");
    let truth = dir.join("truth.jsonl");
    let mut cmd = spanprof_command([
        "profile",
        "--event",
        "cpu,offcpu",
        "--frequency",
        "499",
        "-o",
    ]);
    cmd.arg(&out)
        .arg("--")
        .arg(&python)
        .arg(py_workload_source("py_span_workload.py"))
        .args(["otel_threads", "4"])
        .arg(&truth)
        .env("PYTHONPATH", &libs)
        .env("PYTHONNOUSERSITE", "1")
        .env("OTEL_SERVICE_NAME", "otlp-test-service")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=ci%20run,service.name=ignored",
        );
    let run = run_with_timeout(cmd, RUN_TIMEOUT);
    run.assert_success();
    let summary = parse_summary(&run.stderr).unwrap();
    let pid = ready_pid(&run.stderr);
    assert!(run.stderr.contains("(otlp)"), "{}", run.stderr);
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );

    let decoded = otlp::decode_file(&out);
    otlp::assert_valid(&decoded);
    assert_eq!(
        otlp::sample_types(&decoded),
        ["samples/count", "off_cpu/nanoseconds"]
    );

    // The resource, as the process described itself.
    let attrs = resource_of(&decoded, pid);
    let exe = std::fs::canonicalize(&python).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let checks: [(&str, Value); 8] = [
        ("service.name", "otlp-test-service".into()),
        ("deployment.environment", "ci run".into()),
        ("process.executable.name", "python3.12".into()),
        ("process.executable.path", exe.to_string_lossy().into()),
        ("process.runtime.name", "cpython".into()),
        ("host.name", host.trim().into()),
        ("host.arch", "amd64".into()),
        ("os.type", "linux".into()),
    ];
    for (key, want) in checks {
        assert_eq!(attrs[key], want, "resource attribute {key} in {attrs:#}");
    }
    let version = attrs["process.runtime.version"].as_str().unwrap_or("");
    assert!(
        version.starts_with("3.12."),
        "process.runtime.version {version:?}"
    );
    let cmdline = attrs["process.command_line"].as_str().unwrap_or("");
    assert!(
        cmdline.contains("py_span_workload.py otel_threads 4"),
        "process.command_line {cmdline:?}"
    );
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        assert_eq!(attrs["host.id"], id.trim());
    }
    for (_, profile) in otlp::profiles(&decoded) {
        let start = profile["time_unix_nano"].as_u64().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(
            start > now - 600_000_000_000 && start < now,
            "time_unix_nano {start} is not within the last 10 minutes"
        );
    }

    // On-CPU: a timestamp per sample (each counts 1), as many as the summary counted.
    let cpu = otlp::samples(&decoded, "samples/count");
    assert!(cpu
        .iter()
        .all(|s| s["values"].as_array().unwrap().is_empty()
            && !s["timestamps"].as_array().unwrap().is_empty()));
    let timestamps: u64 = cpu
        .iter()
        .map(|s| s["timestamps"].as_array().unwrap().len() as u64)
        .sum();
    assert_eq!(timestamps, summary.samples);
    // Off-CPU: a value (nanoseconds) per timestamp, with its reason.
    let off = otlp::samples(&decoded, "off_cpu/nanoseconds");
    assert!(!off.is_empty());
    for s in &off {
        let reason = s["attributes"]["off_cpu.reason"].as_str().unwrap_or("");
        assert!(
            ["sleep", "lock", "io", "gil", "asyncio_idle", "other"].contains(&reason),
            "off_cpu.reason {reason:?}"
        );
    }

    // Links: every on-CPU sample in a span's function carries that span's ids (and its name as
    // the attribute `span.name`, but for names that are not ASCII); none outside.
    let spans = read_otel_truth(&truth);
    assert!(spans.len() >= 4, "{} spans in the truth file", spans.len());
    let tids: Vec<u64> = spans.values().map(|s| s.tid).collect();
    let (mut in_span, mut right, mut outside, mut outside_linked) = (0, 0, 0, 0);
    let mut seen_tids = std::collections::BTreeSet::new();
    let number = |f: &str| -> u64 { f.trim_start_matches("span_work_").parse().unwrap_or(0) };
    let first_spans: Vec<String> = tids
        .iter()
        .filter_map(|tid| {
            spans
                .iter()
                .filter(|(_, s)| s.tid == *tid)
                .map(|(f, _)| f.clone())
                .min_by_key(|f| number(f))
        })
        .collect();
    for s in &cpu {
        let fns = functions(s);
        let n = otlp::sample_weight(s);
        // The first span of each thread starts as the process starts, before spanprof has
        // found OpenTelemetry's objects (its modules are looked for every drain): left out.
        if fns.iter().any(|f| first_spans.contains(f)) {
            continue;
        }
        if let Some(span) = fns.iter().find_map(|f| spans.get(f)) {
            in_span += n;
            let link = &s["link"];
            if link["trace_id"] == span.trace_id.as_str()
                && link["span_id"] == span.span_id.as_str()
                && s["attributes"]["thread.id"].as_u64() == Some(span.tid)
                && s["attributes"]["span.name"].as_str() == span.kept_name()
            {
                right += n;
            }
        } else if fns.iter().any(|f| f == "outside_work") {
            outside += n;
            if !s["link"].is_null() {
                outside_linked += n;
            }
        }
        let tid = s["attributes"]["thread.id"].as_u64().expect("thread.id");
        seen_tids.insert(tid);
        assert!(s["attributes"]["thread.name"].is_string(), "{s:#}");
    }
    for tid in &tids {
        assert!(seen_tids.contains(tid), "no sample of span thread {tid}");
    }
    eprintln!(
        "on-CPU samples in spans: {in_span}, with their span's link, thread and name: {right}; \
         outside spans: {outside}, linked: {outside_linked}"
    );
    assert!(in_span >= 100, "only {in_span} samples in spans");
    assert!(
        right as f64 >= 0.98 * in_span as f64,
        "{right} of {in_span} samples in spans carry their span's link and name"
    );
    assert!(outside > 0);
    assert!(
        outside_linked as f64 <= 0.02 * outside as f64,
        "{outside_linked} of {outside} samples outside spans carry a link"
    );
}

/// The shares of py_split.py's functions in a decoded on-CPU profile, checked loosely (the
/// shares themselves are the subject of other tests): each function is there and alpha, with
/// half of the CPU, outweighs gamma, with a fifth.
fn check_split(decoded: &Value, pid: u32) {
    otlp::assert_valid(decoded);
    let attrs = resource_of(decoded, pid);
    assert_eq!(attrs["process.runtime.name"], "cpython");
    let alpha = weight_of(decoded, "samples/count", "alpha");
    let beta = weight_of(decoded, "samples/count", "Worker.beta");
    let gamma = weight_of(decoded, "samples/count", "gamma");
    eprintln!("alpha {alpha}, Worker.beta {beta}, gamma {gamma} samples");
    assert!(alpha > 0 && beta > 0 && gamma > 0);
    assert!(alpha > gamma, "alpha {alpha} <= gamma {gamma}");
}

/// A profile command of py_split.py sent to `endpoint` with `extra` arguments.
fn split_command(dir: &TempDir, endpoint: &str, extra: &[&str]) -> Command {
    let python = pyenv_python(12);
    let mut cmd = spanprof_command(["profile", "--frequency", "499", "-o"]);
    cmd.arg(dir.join("run.folded"))
        .args(["--otlp-endpoint", endpoint])
        .args(extra)
        .arg("--")
        .arg(python)
        .arg(py_workload_source("py_split.py"))
        .arg("1.5");
    cmd
}

/// `--otlp-endpoint` over gRPC: a tonic server gets one gzip-compressed request with the
/// headers of OTEL_EXPORTER_OTLP_HEADERS and --otlp-header, whose bytes (as the server
/// decoded them, encoded again) the independent decoder reads as the workload's profile.
#[test]
fn grpc_export_reaches_a_tonic_server() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("otlp-grpc");
    let server = GrpcSink::start();
    let endpoint = server.endpoint();
    let mut cmd = split_command(&dir, &endpoint, &["--otlp-header", "x-extra=from-flag"]);
    cmd.env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret%20value")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    let run = run_with_timeout(cmd, RUN_TIMEOUT);
    run.assert_success();
    assert!(
        run.stderr.contains(&format!("to {endpoint} (grpc)")),
        "{}",
        run.stderr
    );
    let received = server.requests();
    assert_eq!(received.len(), 1);
    let (request, metadata) = &received[0];
    let header = |k: &str| {
        metadata
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    assert_eq!(header("grpc-encoding").as_deref(), Some("gzip"));
    assert_eq!(header("x-api-key").as_deref(), Some("secret value"));
    assert_eq!(header("x-extra").as_deref(), Some("from-flag"));
    let decoded = otlp::decode(&request.encode_to_vec());
    check_split(&decoded, ready_pid(&run.stderr));
}

/// `--otlp-endpoint` over HTTP/protobuf: the receiver gets `POST /v1development/profiles`,
/// gzip-compressed, with the configured headers, and the body decodes as the workload's
/// profile. A receiver that rejects profiles (partial success) or does not answer makes the
/// run fail with an error that says so, the files still written.
#[test]
fn http_export_reaches_an_otlp_http_receiver() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let dir = TempDir::new("otlp-http");
    let mut cmd = split_command(
        &dir,
        &sink.endpoint(),
        &["--otlp-protocol", "http/protobuf"],
    );
    cmd.env(
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
        "authorization=Bearer%20t0ken",
    );
    let run = run_with_timeout(cmd, RUN_TIMEOUT);
    run.assert_success();
    let bins = sink.wait_for_requests(1, Duration::from_secs(10));
    assert_eq!(bins.len(), 1);
    let headers = sink.headers(&bins[0]);
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["authorization"], "Bearer t0ken");
    let decoded = otlp::decode_file(&bins[0]);
    check_split(&decoded, ready_pid(&run.stderr));

    // Partial success with rejected profiles: an error, exit status 1, the file written.
    sink.set_reject(2);
    let dir = TempDir::new("otlp-http-reject");
    let run = run_with_timeout(
        split_command(
            &dir,
            &sink.endpoint(),
            &["--otlp-protocol", "http/protobuf"],
        ),
        RUN_TIMEOUT,
    );
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("rejected 2 of"), "{}", run.stderr);
    assert!(dir.join("run.folded").is_file());

    // Nobody listening: one clear error.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new("otlp-http-down");
    let run = run_with_timeout(
        split_command(
            &dir,
            &format!("http://127.0.0.1:{port}"),
            &["--otlp-protocol", "http/protobuf"],
        ),
        RUN_TIMEOUT,
    );
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot send the profile to"),
        "{}",
        run.stderr
    );
    assert!(dir.join("run.folded").is_file());
}

/// Bad exporter settings are usage errors (exit 2) before anything is profiled.
#[test]
fn bad_otlp_settings_are_refused() {
    spanprof_bin();
    for (env, args, needle) in [
        (
            Some(("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")),
            vec!["--otlp-endpoint", "http://127.0.0.1:1"],
            "http/json",
        ),
        (
            None,
            vec!["--otlp-endpoint", "127.0.0.1:4317"],
            "must start with http:// or https://",
        ),
        (
            None,
            vec!["--otlp-protocol", "grpc"],
            "need --otlp-endpoint",
        ),
        (
            None,
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:1",
                "--otlp-header",
                "novalue",
            ],
            "expected KEY=VALUE",
        ),
    ] {
        let mut cmd = spanprof_command(["profile"]);
        cmd.args(&args).args(["--", "/bin/true"]);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let run = run_with_timeout(cmd, RUN_TIMEOUT);
        assert_eq!(run.code(), 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
}

/// Makes a CA and a server certificate it signed for 127.0.0.1 with openssl: (CA PEM,
/// server certificate PEM, server key PEM).
fn make_certificates(dir: &TempDir) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let run = |args: &[&str]| {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(dir.path());
        let out = run_with_timeout(cmd, RUN_TIMEOUT);
        assert!(out.status.success(), "openssl {args:?}: {out}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=spanprof test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
    ]);
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    (read("ca.pem"), read("server.pem"), read("server.key"))
}

/// TLS: a collector whose certificate a private CA signed is reached over `https://` when
/// OTEL_EXPORTER_OTLP_CERTIFICATE names that CA, and refused (exit 1, a certificate error)
/// without it.
#[test]
fn grpc_export_over_tls_trusts_the_configured_ca() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("otlp-tls");
    let (_, cert, key) = make_certificates(&dir);
    let server = GrpcSink::start_tls(&cert, &key);
    let endpoint = server.endpoint();
    assert!(endpoint.starts_with("https://"));

    let mut cmd = split_command(&dir, &endpoint, &[]);
    cmd.env("OTEL_EXPORTER_OTLP_CERTIFICATE", dir.join("ca.pem"));
    let run = run_with_timeout(cmd, RUN_TIMEOUT);
    run.assert_success();
    let received = server.requests();
    assert_eq!(received.len(), 1);
    check_split(&otlp::decode_grpc(&received[0].0), ready_pid(&run.stderr));

    // Without the CA the server's certificate is not trusted.
    let other = TempDir::new("otlp-tls-untrusted");
    let run = run_with_timeout(split_command(&other, &endpoint, &[]), RUN_TIMEOUT);
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot send the profile to"),
        "{}",
        run.stderr
    );
    assert_eq!(server.requests().len(), 1, "nothing more arrived");
}

/// A password in the endpoint's URL (`user:password@`): HTTP sends it as basic authentication,
/// and no line of any run shows it (`***` stands for it) — the summary of a sent profile, the error of a collector
/// nobody listens on (HTTP and gRPC), a refused endpoint — nor does any output file.
#[test]
fn no_line_shows_the_collector_s_password() {
    const PASSWORD: &str = "N0t-for-logs-7f3a";
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let with_password = |url: &str| url.replacen("://", &format!("://spanuser:{PASSWORD}@"), 1);
    let no_password = |what: &str, run: &RunOutput, dir: &TempDir| {
        for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            assert!(
                !text.contains(PASSWORD),
                "{what}: the password is on {stream}:\n{text}"
            );
        }
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes
                    .windows(PASSWORD.len())
                    .any(|w| w == PASSWORD.as_bytes()),
                "{what}: the password is in {}",
                path.display()
            );
        }
    };

    // Sent over HTTP: the receiver gets basic authentication; the line names the host only.
    let sink = HttpSink::start();
    let dir = TempDir::new("otlp-password-sent");
    let run = run_with_timeout(
        split_command(
            &dir,
            &with_password(&sink.endpoint()),
            &["--otlp-protocol", "http/protobuf"],
        ),
        RUN_TIMEOUT,
    );
    run.assert_success();
    no_password("sent", &run, &dir);
    assert!(
        run.stderr.contains(&format!(
            "to {}",
            sink.profiles_url().replace("://", "://***@")
        )),
        "{}",
        run.stderr
    );
    let bins = sink.wait_for_requests(1, Duration::from_secs(10));
    // base64("spanuser:N0t-for-logs-7f3a")
    assert_eq!(
        sink.headers(&bins[0])["authorization"],
        "Basic c3BhbnVzZXI6TjB0LWZvci1sb2dzLTdmM2E="
    );

    // Nobody listening, over both protocols: an error line, without the password.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for protocol in ["http/protobuf", "grpc"] {
        let dir = TempDir::new("otlp-password-down");
        let run = run_with_timeout(
            split_command(
                &dir,
                &with_password(&format!("http://127.0.0.1:{port}")),
                &["--otlp-protocol", protocol],
            ),
            RUN_TIMEOUT,
        );
        assert_eq!(run.code(), 1, "{}", run.stderr);
        assert!(
            run.stderr
                .contains("cannot send the profile to http://***@127.0.0.1:"),
            "{}",
            run.stderr
        );
        no_password(protocol, &run, &dir);
    }

    // A refused endpoint: a usage error, without the password.
    let dir = TempDir::new("otlp-password-refused");
    let run = run_with_timeout(
        split_command(&dir, &with_password("ftp://collector:4317"), &[]),
        RUN_TIMEOUT,
    );
    assert_eq!(run.code(), 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("ftp://***@collector:4317"),
        "{}",
        run.stderr
    );
    no_password("refused", &run, &dir);
}
