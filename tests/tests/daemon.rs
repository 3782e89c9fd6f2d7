//! `spanprof daemon`: continuous profiling exported to real receivers (a tonic gRPC server and
//! the OTLP/HTTP receiver `tests/tools/otlp_http_sink.py`), every export decoded by the
//! independent decoder (PyPI `opentelemetry-proto`). Checked: the functions, resources and
//! links of known workloads; windows kept and dropped while the endpoint is down, with the
//! counters saying so; 50 short-lived processes with a resource each; SIGTERM flushing the last
//! window; SIGHUP applying a new selector.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::daemon::Daemon;
use spanprof_tests::otlp::{self, read_otel_truth, ready_pid, GrpcSink, HttpSink};
use spanprof_tests::{
    profiling_lock, py_workload_source, pyenv_python, require_root, require_span_libs, span_libs,
    spanprof_bin, spanprof_command, start_py_workload, start_py_workload_with_libs, Background,
    TempDir,
};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// `CapEff` and `CapPrm` of every thread of `pid`, by thread id.
fn thread_capabilities(pid: u32) -> BTreeMap<u32, (u64, u64)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let entry = entry.unwrap();
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or_else(|| panic!("no {name} in {status}"))
        };
        out.insert(tid, (field("CapEff:"), field("CapPrm:")));
    }
    out
}

/// CAP_DAC_READ_SEARCH, CAP_NET_BIND_SERVICE, CAP_SYS_PTRACE and CAP_SYSLOG
/// (linux/capability.h): what the daemon keeps after loading without allocation probes.
const KEPT_CAPABILITIES: u64 = 1 << 2 | 1 << 10 | 1 << 19 | 1 << 34;

/// The resource attributes of every resource of a decoded request, by `process.pid`.
fn resources(decoded: &Value) -> BTreeMap<u64, Value> {
    decoded["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| {
            Some((
                r["attributes"]["process.pid"].as_u64()?,
                r["attributes"].clone(),
            ))
        })
        .collect()
}

/// Weight of the on-CPU samples of process `pid` whose stack has function `name`.
fn weight_of(decoded: &Value, pid: u64, name: &str) -> i64 {
    otlp::profiles(decoded)
        .into_iter()
        .filter(|(attrs, p)| {
            attrs["process.pid"].as_u64() == Some(pid) && p["sample_type"] == "samples/count"
        })
        .flat_map(|(_, p)| p["samples"].as_array().unwrap().iter())
        .filter(|s| otlp::functions(s).contains(&name))
        .map(otlp::sample_weight)
        .sum()
}

fn split_workload(seconds: &str) -> Background {
    start_py_workload(&pyenv_python(12), "py_split.py", &[seconds])
}

/// Windows of 2 s of a py_split.py process go to the HTTP receiver: each decodes with no
/// problem, has the process's resource (service.name from its environment) and its three
/// functions; /healthz is ok; SIGTERM sends the current window before the daemon exits.
#[test]
fn daemon_exports_windows_over_http_and_flushes_on_sigterm() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let mut cmd = Command::new(pyenv_python(12));
    cmd.arg(py_workload_source("py_split.py"))
        .arg("20")
        .env("OTEL_SERVICE_NAME", "split-service");
    let mut workload = Background::spawn(cmd);
    let line = workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid = u64::from(ready_pid(&line));
    let dir = TempDir::new("daemon-http");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"2s\"\n[scope]\npids = [{pid}]\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"{}\"\n\
             [privacy]\nredact_paths = \"basename\"\ndrop_labels = [\"process.command_line\"]\n",
            sink.endpoint()
        ),
    );
    sink.wait_for_requests(2, Duration::from_secs(30));
    // Its overhead, as a session's summary gives it: the kernel's BPF statistics (root may
    // enable them), its own CPU per sample and the share of the targets' sampled CPU.
    let bpf = daemon.metric("spanprof_bpf_run_seconds_total");
    let kernel = daemon.metric("spanprof_window_kernel_seconds_per_sample");
    let own = daemon.metric("spanprof_window_cpu_seconds_per_sample");
    let ratio = daemon.metric("spanprof_window_overhead_ratio");
    assert!(bpf > 0.0, "spanprof_bpf_run_seconds_total {bpf}");
    assert!(
        kernel > 0.0 && kernel < 1e-3 && own > 0.0 && own < 0.1,
        "per sample: {kernel} s in the kernel, {own} s of its own CPU"
    );
    assert!(ratio > 0.0 && ratio < 1.0, "overhead ratio {ratio}");
    // Root, but after loading it holds only what finding and reading processes needs, in
    // every thread (the exporter's and the metrics server's were started after the drop).
    let threads = thread_capabilities(daemon.process.pid());
    assert!(threads.len() >= 2, "{threads:?}");
    for (tid, (eff, prm)) in &threads {
        assert_eq!(
            (*eff, *prm),
            (KEPT_CAPABILITIES, KEPT_CAPABILITIES),
            "thread {tid}: CapEff {eff:#x}, CapPrm {prm:#x}"
        );
    }
    let (status, body) = daemon.get("/healthz");
    assert!(status.contains("200") && body == "ok\n", "{status} {body}");
    let windows = daemon.metric("spanprof_windows_total");
    let stderr = daemon.stop();
    assert!(stderr.contains("every window exported"), "{stderr}");
    let bins = sink.requests();
    // The flush: the window open at SIGTERM arrived too.
    assert!(
        bins.len() as f64 > windows,
        "{} requests, {windows} windows before SIGTERM",
        bins.len()
    );
    let (mut found, mut full) = (0, 0);
    for bin in &bins {
        let decoded = otlp::decode_file(bin);
        otlp::assert_valid(&decoded);
        let Some(attrs) = resources(&decoded).remove(&pid) else {
            continue;
        };
        found += 1;
        assert_eq!(attrs["service.name"], "split-service");
        assert_eq!(attrs["process.executable.name"], "python3.12");
        // [privacy]: paths reduced to base names, the command line left out.
        assert_eq!(attrs["process.executable.path"], "python3.12");
        assert!(attrs.get("process.command_line").is_none(), "{attrs:#}");
        let (a, b, g) = (
            weight_of(&decoded, pid, "alpha"),
            weight_of(&decoded, pid, "Worker.beta"),
            weight_of(&decoded, pid, "gamma"),
        );
        // A window cut short (the first, or the one SIGTERM closed) may be too small for
        // gamma's fifth: the three are checked in windows of 60 samples or more (a whole 2 s
        // window at 99 Hz has about 200).
        if a + b + g >= 60 {
            full += 1;
            assert!(
                a > 0 && b > 0 && g > 0 && a > g,
                "alpha {a} beta {b} gamma {g} in {bin:?}"
            );
        }
    }
    assert!(
        found >= 2,
        "the process in {found} of {} windows",
        bins.len()
    );
    assert!(full >= 2, "{full} windows of 60 samples or more");
    workload.signal(libc::SIGKILL);
}

/// An OpenTelemetry-traced workload profiled by the daemon over gRPC (gzip): its samples in
/// spans link to exactly their span's ids.
#[test]
fn daemon_exports_links_of_a_traced_workload_over_grpc() {
    require_root();
    spanprof_bin();
    let python = pyenv_python(12);
    let libs = span_libs(12);
    require_span_libs(&python, &libs);
    let _lock = profiling_lock();
    let dir = TempDir::new("daemon-grpc");
    let truth = dir.join("truth.jsonl");
    let workload = start_py_workload_with_libs(
        &python,
        &libs,
        "py_span_workload.py",
        &["otel_threads", "12", truth.to_str().unwrap()],
    );
    let pid = u64::from(workload.pid());
    let server = GrpcSink::start();
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 199\nwindow = \"3s\"\n[scope]\npids = [{pid}]\n\
             [export]\nprotocol = \"grpc\"\nendpoint = \"{}\"\n",
            server.endpoint()
        ),
    );
    let requests = server.wait_for_requests(2, Duration::from_secs(40));
    daemon.stop();
    let spans = read_otel_truth(&truth);
    let (mut in_span, mut right) = (0, 0);
    for (request, metadata) in &requests {
        assert_eq!(
            metadata.get("grpc-encoding").and_then(|v| v.to_str().ok()),
            Some("gzip")
        );
        let decoded = otlp::decode_grpc(request);
        otlp::assert_valid(&decoded);
        for s in otlp::samples(&decoded, "samples/count") {
            let fns = otlp::functions(s);
            let Some(span) = fns.iter().find_map(|f| spans.get(*f)) else {
                continue;
            };
            let n = otlp::sample_weight(s);
            in_span += n;
            if s["link"]["trace_id"] == span.trace_id.as_str()
                && s["link"]["span_id"] == span.span_id.as_str()
            {
                right += n;
            }
        }
        if let Some(attrs) = resources(&decoded).get(&pid) {
            assert_eq!(attrs["process.runtime.name"], "cpython");
        }
    }
    eprintln!("samples in spans: {in_span}, linked to their span: {right}");
    assert!(in_span >= 100, "{in_span} samples in spans");
    assert!(
        right as f64 >= 0.98 * in_span as f64,
        "{right} of {in_span} samples in spans link to their span"
    );
    workload.signal(libc::SIGKILL);
}

/// The endpoint goes down for several windows, then comes back: the daemon keeps sampling
/// (samples keep counting, /healthz stays ok), keeps the newest `queue` windows and counts the
/// dropped ones and the failures, its memory stays bounded, and the kept windows (made while
/// the endpoint was down) arrive once it is back.
#[test]
fn endpoint_down_then_back() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let workload = split_workload("40");
    let pid = workload.pid();
    let dir = TempDir::new("daemon-down");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"1s\"\n[scope]\npids = [{pid}]\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"{}\"\ntimeout = \"2s\"\n\
             queue = 3\nmax_backoff = \"1s\"\n",
            sink.endpoint()
        ),
    );
    sink.wait_for_requests(1, Duration::from_secs(30));
    sink.set_down(true);
    let down_at = std::time::SystemTime::now();
    let before = daemon.metrics();
    std::thread::sleep(Duration::from_secs(8));
    let during = daemon.metrics();
    let (status, _) = daemon.get("/healthz");
    assert!(status.contains("200"), "{status}");
    let up_at = std::time::SystemTime::now();
    let received_before_up = sink.requests().len();
    sink.set_down(false);
    let delta = |k: &str| during[k] - before[k];
    eprintln!(
        "while down: windows {}, dropped {}, failures {}, samples {}, queue {}, rss {} MB",
        delta("spanprof_windows_total"),
        delta("spanprof_windows_dropped_total"),
        delta("spanprof_export_failures_total"),
        delta("spanprof_samples_total"),
        during["spanprof_export_queue_windows"],
        during["spanprof_resident_memory_bytes"] / 1e6
    );
    assert!(delta("spanprof_windows_total") >= 6.0);
    assert!(delta("spanprof_samples_total") >= 300.0, "sampling went on");
    assert!(delta("spanprof_export_failures_total") >= 2.0);
    assert!(delta("spanprof_windows_dropped_total") >= 2.0);
    assert!(during["spanprof_export_queue_windows"] <= 3.0);
    assert!(
        sink.rejected() >= 2,
        "the sink refused {} requests",
        sink.rejected()
    );
    assert!(during["spanprof_resident_memory_bytes"] < 150e6);

    // Back: the kept windows arrive (their profiles began while the endpoint was down).
    sink.wait_for_requests(received_before_up + 3, Duration::from_secs(30));
    let stderr = daemon.stop();
    assert!(stderr.contains("cannot export to"), "{stderr}");
    assert!(stderr.contains("works again"), "{stderr}");
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    };
    let made_while_down = sink.requests()[received_before_up..]
        .iter()
        .filter(|bin| {
            let decoded = otlp::decode_file(bin);
            otlp::assert_valid(&decoded);
            otlp::profiles(&decoded).iter().any(|(_, p)| {
                let t = p["time_unix_nano"].as_u64().unwrap();
                t >= unix(down_at) && t < unix(up_at)
            })
        })
        .count();
    assert!(
        made_while_down >= 2,
        "{made_while_down} windows made while the endpoint was down arrived"
    );
    workload.signal(libc::SIGKILL);
}

/// A password in the export endpoint's URL shows on no daemon line: the start line, the
/// failures while nobody listens (gRPC), nor the shutdown.
#[test]
fn daemon_lines_show_no_password() {
    const PASSWORD: &str = "N0t-for-logs-7f3a";
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let workload = split_workload("20");
    let pid = workload.pid();
    let dir = TempDir::new("daemon-password");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"1s\"\n[scope]\npids = [{pid}]\n\
             [export]\nprotocol = \"grpc\"\n\
             endpoint = \"http://spanuser:{PASSWORD}@127.0.0.1:{port}\"\ntimeout = \"1s\"\n\
             max_backoff = \"1s\"\n"
        ),
    );
    daemon.wait_metric(
        "spanprof_export_failures_total",
        2.0,
        Duration::from_secs(30),
    );
    let stderr = daemon.stop();
    workload.signal(libc::SIGKILL);
    assert!(
        stderr.contains(&format!("cannot export to http://***@127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(
        !stderr.contains(PASSWORD),
        "the password is on the daemon's stderr:\n{stderr}"
    );
}

/// 50 short-lived Python processes (150 ms of CPU each), started one after the other by a
/// profiled parent during one window, each appear with a resource of their own (pid, command
/// line, executable, runtime), delivered by the SIGTERM flush.
#[test]
fn short_lived_processes_get_their_own_resources() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("daemon-short");
    let launcher = dir.join("launcher.py");
    let go = dir.join("go");
    std::fs::write(
        &launcher,
        r#"import json, os, subprocess, sys, time
go = sys.argv[1]
print("ready", os.getpid(), file=sys.stderr, flush=True)
while not os.path.exists(go):
    time.sleep(0.05)
busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.15: pass"
pids = []
for i in range(50):
    p = subprocess.Popen([sys.executable, "-c", busy, "short-%d" % i])
    pids.append(p.pid)
    p.wait()
print(json.dumps(pids), flush=True)
"#,
    )
    .unwrap();
    let mut cmd = Command::new(pyenv_python(12));
    cmd.arg(&launcher)
        .arg(&go)
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES");
    let mut parent = Background::spawn(cmd);
    let line = parent.wait_for_stderr("ready ", Duration::from_secs(30));
    let ppid = ready_pid(&line);
    let server = GrpcSink::start();
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"120s\"\n[scope]\npids = [{ppid}]\n\
             [export]\nendpoint = \"{}\"\n",
            server.endpoint()
        ),
    );
    daemon.wait_metric("spanprof_targets", 1.0, Duration::from_secs(10));
    std::fs::write(&go, "").unwrap();
    let out = parent.finish(RUN_TIMEOUT);
    out.assert_success();
    let children: Vec<u64> = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(children.len(), 50);
    let stderr = daemon.stop();
    assert!(stderr.contains("every window exported"), "{stderr}");
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "one window, sent at SIGTERM");
    let decoded = otlp::decode_grpc(&requests[0].0);
    otlp::assert_valid(&decoded);
    let found = resources(&decoded);
    let (mut with_runtime, mut with_cmdline) = (0, 0);
    let mut missing = Vec::new();
    for (i, pid) in children.iter().enumerate() {
        let Some(attrs) = found.get(pid) else {
            missing.push(*pid);
            continue;
        };
        // The command line, executable and environment are read from /proc at the process's
        // first drain: a child that exited before it (a stalled daemon) has its comm only.
        // Without OTEL_SERVICE_NAME, the service is OpenTelemetry's `unknown_service:EXE`.
        let cmdline = attrs["process.command_line"].as_str().unwrap_or("");
        if cmdline.ends_with(&format!("short-{i}"))
            && attrs["process.executable.name"] == "python3.12"
            && attrs["service.name"] == "unknown_service:python3.12"
        {
            with_cmdline += 1;
        }
        if attrs["process.runtime.name"] == "cpython" {
            with_runtime += 1;
        }
    }
    eprintln!(
        "{} of 50 children with a resource, {with_cmdline} with their command line and \
         service.name unknown_service:python3.12, \
         {with_runtime} recognized as CPython",
        50 - missing.len()
    );
    assert!(
        with_cmdline >= 45,
        "{with_cmdline} of 50 with their command line and service.name"
    );
    assert!(
        missing.is_empty(),
        "children without a resource: {missing:?}"
    );
    assert!(
        with_runtime >= 45,
        "{with_runtime} of 50 recognized as CPython"
    );
    // NB: the parent, which mostly waits for its children, may have no sample of its own in
    // the window (a CI run had none): the 50 children are what is checked.
    let distinct: BTreeSet<u64> = found.keys().copied().collect();
    assert!(distinct.len() >= 50, "50 children: {distinct:?}");
}

/// SIGHUP applies a new selector: windows before it have no sample of the workload (the scope
/// names another program), windows after it do.
#[test]
fn sighup_applies_a_new_selector() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let workload = split_workload("30");
    let pid = u64::from(workload.pid());
    let dir = TempDir::new("daemon-hup");
    let export = format!(
        "[export]\nprotocol = \"http/protobuf\"\nendpoint = \"{}\"\n",
        sink.endpoint()
    );
    let mut daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"1s\"\n[scope]\nexecutables = \
             [\"no-such-program-*\"]\n{export}"
        ),
    );
    sink.wait_for_requests(2, Duration::from_secs(30));
    for bin in &sink.requests() {
        assert!(!resources(&otlp::decode_file(bin)).contains_key(&pid));
    }
    let metrics_port = daemon.metrics_port;
    std::fs::write(
        &daemon.config,
        format!(
            "[sampling]\nfrequency = 99\nwindow = \"1s\"\n[scope]\nexecutables = \
             [\"python3.1?\"]\n{export}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
        ),
    )
    .unwrap();
    daemon.process.signal(libc::SIGHUP);
    daemon
        .process
        .wait_for_stderr("configuration reloaded", Duration::from_secs(10));
    // Windows from the reload on (the one open at the reload may hold the workload or not).
    let before = sink.requests().len();
    sink.wait_for_requests(before + 3, Duration::from_secs(30));
    let after: Vec<PathBuf> = sink.requests()[before..].to_vec();
    let with = after
        .iter()
        .filter(|bin| weight_of(&otlp::decode_file(bin), pid, "alpha") > 0)
        .count();
    daemon.stop();
    assert!(
        with >= 2,
        "{with} of {} windows after SIGHUP have the workload",
        after.len()
    );
    workload.signal(libc::SIGKILL);
}

/// A configuration mistake stops the daemon at start with the field it is about.
#[test]
fn bad_configuration_is_named() {
    spanprof_bin();
    let dir = TempDir::new("daemon-bad");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[sampling]\nwindow = \"soon\"\n").unwrap();
    let mut cmd = spanprof_command(["daemon", "--config"]);
    cmd.arg(&path);
    let out = spanprof_tests::run_with_timeout(cmd, RUN_TIMEOUT);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("sampling.window"), "{}", out.stderr);
    assert!(out.stderr.contains("bad.toml"), "{}", out.stderr);
}

/// `events = ["alloc"]`: a window of py_alloc.py's allocations (5 rounds of 64 × 1 MiB in
/// big_buffers) has alloc_objects/count and alloc_space/bytes profiles whose big_buffers
/// bytes are within ±25% of what it asked malloc for (the allocation tests check the accuracy
/// itself; this checks the daemon carries it).
#[test]
fn daemon_alloc_profiles_allocations() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let mut cmd = Command::new(pyenv_python(12));
    cmd.arg(py_workload_source("py_alloc.py"))
        .args(["--wait", "32"]);
    let mut workload = Background::spawn(cmd);
    let line = workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid = ready_pid(&line);
    let server = GrpcSink::start();
    let dir = TempDir::new("daemon-alloc");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nevents = [\"alloc\"]\nwindow = \"120s\"\n[scope]\npids = [{pid}]\n\
             [export]\nendpoint = \"{}\"\n",
            server.endpoint()
        ),
    );
    daemon.wait_metric("spanprof_targets", 1.0, Duration::from_secs(10));
    workload.signal(libc::SIGUSR1);
    let out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    let truth: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let want = truth["big_buffers"]["malloc_bytes"].as_f64().unwrap();
    daemon.stop();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let decoded = otlp::decode_grpc(&requests[0].0);
    otlp::assert_valid(&decoded);
    assert_eq!(
        otlp::sample_types(&decoded),
        ["alloc_objects/count", "alloc_space/bytes"]
    );
    let got: i64 = otlp::samples(&decoded, "alloc_space/bytes")
        .into_iter()
        .filter(|s| otlp::functions(s).contains(&"big_buffers"))
        .map(otlp::sample_weight)
        .sum();
    eprintln!("big_buffers: {got} bytes sampled and scaled, truth {want}");
    assert!(
        (got as f64 - want).abs() <= 0.25 * want,
        "big_buffers {got} bytes, truth {want}"
    );
}

/// `events = ["offcpu"]`, windows of 1 s, a process none of whose threads ever wakes (the main
/// thread sleeping in `longsleep`, ten threads waiting in `idle_wait`: py_idle_threads.py):
/// each window holds the sleep up to its end, so in every whole window (not the first, cut by
/// the process's addition, nor the last, cut by SIGTERM) `longsleep`'s off-CPU time is within
/// 90-102% of the window's duration, and all its threads' together within 90-102% of eleven
/// times it. Without the count at the window's end, such a thread was in no window at all.
#[test]
fn daemon_windows_hold_threads_blocked_throughout() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let mut cmd = Command::new(pyenv_python(12));
    cmd.arg(py_workload_source("py_idle_threads.py")).arg("60");
    let mut workload = Background::spawn(cmd);
    workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid = u64::from(workload.pid());
    let dir = TempDir::new("daemon-idle");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nevents = [\"offcpu\"]\nwindow = \"1s\"\n[scope]\npids = [{pid}]\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"{}\"\n",
            sink.endpoint()
        ),
    );
    sink.wait_for_requests(5, Duration::from_secs(30));
    daemon.stop();
    workload.signal(libc::SIGKILL);
    let bins = sink.requests();
    let mut whole = Vec::new();
    for bin in &bins {
        let decoded = otlp::decode_file(bin);
        otlp::assert_valid(&decoded);
        for (attrs, p) in otlp::profiles(&decoded) {
            if attrs["process.pid"].as_u64() != Some(pid)
                || p["sample_type"] != "off_cpu/nanoseconds"
            {
                continue;
            }
            let window = p["duration_nano"].as_f64().unwrap_or(0.0);
            let samples = p["samples"].as_array().expect("samples");
            let sleep: i64 = samples
                .iter()
                .filter(|s| otlp::functions(s).contains(&"longsleep"))
                .map(otlp::sample_weight)
                .sum();
            let all: i64 = samples.iter().map(otlp::sample_weight).sum();
            whole.push((window, sleep as f64, all as f64));
        }
    }
    println!("windows (duration, longsleep, all threads; ns): {whole:?}");
    // The first window starts before the process was added; the last ends at SIGTERM.
    let inner = whole.get(1..whole.len().saturating_sub(1)).unwrap_or(&[]);
    assert!(inner.len() >= 2, "windows of the process: {whole:?}");
    for &(window, sleep, all) in inner {
        assert!(
            (0.9 * window..=1.02 * window).contains(&sleep)
                && (0.9 * 11.0 * window..=1.02 * 11.0 * window).contains(&all),
            "a window of {:.1} ms holds {:.1} ms of longsleep and {:.1} ms in all (11 threads): \
             {whole:?}",
            window / 1e6,
            sleep / 1e6,
            all / 1e6
        );
    }
}
