//! OTLP profiles in the integration tests: the independent decoder
//! `tests/tools/decode_otlp.py` and the OTLP/HTTP receiver
//! `tests/tools/otlp_http_sink.py`, both built on the message classes of PyPI
//! `opentelemetry-proto` (OpenTelemetry proto v1.10.0, `v1development`), which
//! `cargo xtask deps` installs into the tests' venv ([`python`]).
//!
//! The decoder prints one JSON object (see [`decode`]); [`assert_valid`] fails on
//! the format problems it lists, and the accessors below ([`profiles`],
//! [`sample_types`], [`samples`], [`stacks_with`], …) read it. Without the venv or
//! the package the helpers fail with [`missing_prerequisite`]; they never skip.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use serde_json::Value;

use crate::{
    drain, lines, missing_prerequisite, python, run_with_timeout, workspace_root, TempDir,
};

/// How long the decoder may take on one request.
pub const DECODE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long [`HttpSink::start`] waits for the sink's `listening PORT` line.
pub const SINK_START_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP/HTTP path of profiles, appended to the endpoint (as exporters do).
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// The exit status of both scripts when `opentelemetry-proto` does not import.
const MISSING_PACKAGE_EXIT: i32 = 3;

/// A tool script of `tests/tools`, which must exist.
#[track_caller]
fn tool_script(name: &str) -> PathBuf {
    let path = workspace_root().join("tests/tools").join(name);
    if !path.is_file() {
        missing_prerequisite(
            &format!("the test tool {}", path.display()),
            "restore it from the repository",
        );
    }
    path
}

/// The decoder, `tests/tools/decode_otlp.py`.
#[track_caller]
pub fn decoder_script() -> PathBuf {
    tool_script("decode_otlp.py")
}

/// The OTLP/HTTP receiver, `tests/tools/otlp_http_sink.py`.
#[track_caller]
pub fn sink_script() -> PathBuf {
    tool_script("otlp_http_sink.py")
}

/// Fails the test: `python` cannot import `opentelemetry-proto` (the scripts said so on
/// `stderr` and exited with status 3).
#[track_caller]
fn missing_package(python: &Path, stderr: &str) -> ! {
    missing_prerequisite(
        &format!(
            "PyPI opentelemetry-proto (OTLP profiles messages) for {}: {}",
            python.display(),
            stderr.trim()
        ),
        "`cargo xtask deps` (pip-installs opentelemetry-proto==1.45.2 into target/venv)",
    );
}

/// The decoder's JSON from how it ended. `Err` when it did not parse the input (exit 1, the
/// JSON's problems say why) or misbehaved; a missing package fails the test.
#[track_caller]
fn decoder_result(
    python: &Path,
    status: ExitStatus,
    stdout: &str,
    stderr: &str,
    what: &str,
) -> Result<Value, String> {
    if status.code() == Some(MISSING_PACKAGE_EXIT) {
        missing_package(python, stderr);
    }
    let json: Result<Value, _> = serde_json::from_str(stdout.trim());
    match (status.code(), json) {
        (Some(0), Ok(json)) => Ok(json),
        (Some(0), Err(e)) => Err(format!(
            "decode_otlp.py on {what} printed invalid JSON ({e}):\n{stdout}\n--- stderr ---\n{stderr}"
        )),
        (_, Ok(json)) => Err(format!(
            "decode_otlp.py on {what} failed ({status}): {}\n--- stderr ---\n{stderr}",
            problem_list(&json).join("; ")
        )),
        (_, Err(_)) => Err(format!(
            "decode_otlp.py on {what} failed ({status})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )),
    }
}

/// Decodes a serialized `ExportProfilesServiceRequest` (gzipped or not), fed to the decoder
/// on stdin. `Err` (with the decoder's complaint and stderr) when it does not parse; format
/// problems of a request that parses are in the JSON's `problems`.
#[track_caller]
pub fn try_decode(bytes: &[u8]) -> Result<Value, String> {
    let python = python();
    let mut child = Command::new(&python)
        .arg(decoder_script())
        .arg("-")
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} decode_otlp.py: {e}", python.display()));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = bytes.to_vec();
    // A thread writes, so that a decoder that prints much before reading all does not
    // deadlock against us; a decoder that exits early only breaks the pipe.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for decode_otlp.py") {
            break status;
        }
        if start.elapsed() > DECODE_TIMEOUT {
            // SAFETY: kill(2) on the process group we created for the child; it is not
            // reaped yet, so its pid (the pgid) cannot have been reused.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("decode_otlp.py did not finish within {DECODE_TIMEOUT:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    decoder_result(
        &python,
        status,
        &stdout,
        &stderr,
        &format!("{} bytes", bytes.len()),
    )
}

/// Decodes a serialized `ExportProfilesServiceRequest` (gzipped or not) with the independent
/// decoder and returns its JSON; panics with the decoder's complaint and stderr when the
/// bytes do not parse. The JSON (leaf-first frames, one per `Line`):
///
/// ```text
/// {"dictionary": {"mapping": N, "location": N, "function": N, "link": N, "string": N,
///                 "attribute": N, "stack": N},
///  "problems": ["..."],
///  "resources": [{"attributes": {KEY: VALUE}, "schema_url": "...",
///    "scopes": [{"name": "...", "version": "...", "schema_url": "...",
///      "profiles": [{"sample_type": "TYPE/UNIT", "period_type": "TYPE/UNIT" | null,
///        "period": N, "time_unix_nano": N, "duration_nano": N, "attributes": {..},
///        "samples": [{"frames": [{"function": "...", "system_name": "...", "file": "...",
///                                 "line": N, "address": N, "mapping": "FILE" | "",
///                                 "attributes": {..}}],
///                     "values": [N], "timestamps": [N], "attributes": {..},
///                     "link": {"trace_id": "32 hex", "span_id": "16 hex"} | null}]}]}]}]}
/// ```
///
/// It does not check `problems`: see [`assert_valid`].
#[track_caller]
pub fn decode(bytes: &[u8]) -> Value {
    try_decode(bytes).unwrap_or_else(|e| panic!("cannot decode the OTLP request:\n{e}"))
}

/// [`decode`] of a file (a request body, gzipped or not).
#[track_caller]
pub fn decode_file(path: &Path) -> Value {
    let python = python();
    let mut cmd = Command::new(&python);
    cmd.arg(decoder_script()).arg(path);
    let out = run_with_timeout(cmd, DECODE_TIMEOUT);
    decoder_result(
        &python,
        out.status,
        &out.stdout,
        &out.stderr,
        &path.display().to_string(),
    )
    .unwrap_or_else(|e| panic!("cannot decode the OTLP request {}:\n{e}", path.display()))
}

/// The problems the decoder found (empty for a valid request).
pub fn problem_list(decoded: &Value) -> Vec<String> {
    decoded["problems"]
        .as_array()
        .map(|problems| {
            problems
                .iter()
                .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Panics, listing them, when the decoder found problems in the request (or when `decoded`
/// is not the decoder's output).
#[track_caller]
pub fn assert_valid(decoded: &Value) {
    assert!(
        decoded["problems"].is_array(),
        "not the output of decode_otlp.py (no `problems` array): {decoded}"
    );
    let problems = problem_list(decoded);
    assert!(
        problems.is_empty(),
        "the OTLP request breaks {} rule(s) of the format:\n  {}\n(dictionary sizes: {})",
        problems.len(),
        problems.join("\n  "),
        decoded["dictionary"]
    );
}

/// Every profile of every resource and scope, in order, each with the attributes of its
/// resource (a `{key: value}` object).
pub fn profiles(decoded: &Value) -> Vec<(&Value, &Value)> {
    let mut out = Vec::new();
    for resource in decoded["resources"].as_array().into_iter().flatten() {
        for scope in resource["scopes"].as_array().into_iter().flatten() {
            for profile in scope["profiles"].as_array().into_iter().flatten() {
                out.push((&resource["attributes"], profile));
            }
        }
    }
    out
}

/// The distinct sample types (`"type/unit"`, e.g. `"cpu/nanoseconds"`) of the profiles, in
/// order of first appearance.
pub fn sample_types(decoded: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, profile) in profiles(decoded) {
        if let Some(t) = profile["sample_type"].as_str() {
            if !out.iter().any(|seen| seen == t) {
                out.push(t.to_owned());
            }
        }
    }
    out
}

/// The samples of all profiles whose sample type is `sample_type` (`"type/unit"`).
pub fn samples<'a>(decoded: &'a Value, sample_type: &str) -> Vec<&'a Value> {
    profiles(decoded)
        .into_iter()
        .filter(|(_, profile)| profile["sample_type"] == sample_type)
        .flat_map(|(_, profile)| profile["samples"].as_array().into_iter().flatten())
        .collect()
}

/// What a sample weighs: the sum of its values, or, without values, the number of its
/// timestamps (each an event).
pub fn sample_weight(sample: &Value) -> i64 {
    let values = sample["values"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if values.is_empty() {
        sample["timestamps"]
            .as_array()
            .map_or(0, |t| t.len() as i64)
    } else {
        values.iter().filter_map(Value::as_i64).sum()
    }
}

/// The function names of a sample's frames, leaf first (reverse them for root first, e.g.
/// for [`crate::contains_seq`]).
pub fn functions(sample: &Value) -> Vec<&str> {
    sample["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|frame| frame["function"].as_str().unwrap_or_default())
        .collect()
}

/// The total weight ([`sample_weight`]) of the samples of type `sample_type`.
pub fn total(decoded: &Value, sample_type: &str) -> i64 {
    samples(decoded, sample_type)
        .into_iter()
        .map(sample_weight)
        .sum()
}

/// The total weight ([`sample_weight`]) of the samples of type `sample_type` with a frame
/// whose function name contains `function_substring`.
pub fn stacks_with(decoded: &Value, sample_type: &str, function_substring: &str) -> i64 {
    samples(decoded, sample_type)
        .into_iter()
        .filter(|sample| {
            functions(sample)
                .iter()
                .any(|f| f.contains(function_substring))
        })
        .map(sample_weight)
        .sum()
}

/// A running `tests/tools/otlp_http_sink.py`: an OTLP/HTTP receiver on 127.0.0.1 that saves
/// each accepted request as `NNNN.bin` (the body, decompressed) and `NNNN.headers.json`
/// (lower-case keys) in its own temporary directory, and can be taken down
/// ([`HttpSink::set_down`]) or made to report rejected profiles ([`HttpSink::set_reject`]).
/// Drop stops it (SIGTERM, then SIGKILL) and removes the directory.
#[derive(Debug)]
pub struct HttpSink {
    child: Option<Child>,
    port: u16,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<JoinHandle<()>>,
    dir: TempDir,
}

impl HttpSink {
    /// Starts the sink on a free port and waits (up to [`SINK_START_TIMEOUT`]) for it to
    /// listen; panics with its stderr when it does not.
    #[track_caller]
    pub fn start() -> HttpSink {
        let python = python();
        let dir = TempDir::new("otlp-sink");
        let mut child = Command::new(&python)
            .arg(sink_script())
            .arg("--out")
            .arg(dir.path())
            .args(["--port", "0", "--exit-on-stdin-eof"])
            .process_group(0)
            // Kept open in `child` while it runs: the sink exits when the pipe closes,
            // even if this process dies without dropping the sink.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} otlp_http_sink.py: {e}", python.display()));
        let stdout = lines(child.stdout.take().expect("stdout is piped"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_reader = {
            let stderr = Arc::clone(&stderr);
            let pipe = lines(child.stderr.take().expect("stderr is piped"));
            std::thread::spawn(move || {
                for line in pipe {
                    stderr
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_str(&line);
                }
            })
        };
        let mut sink = HttpSink {
            child: Some(child),
            port: 0,
            stderr,
            stderr_reader: Some(stderr_reader),
            dir,
        };
        let deadline = Instant::now() + SINK_START_TIMEOUT;
        let line = stdout.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        let port = line
            .as_deref()
            .ok()
            .and_then(|l| l.trim().strip_prefix("listening "))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 0);
        match port {
            Some(port) => sink.port = port,
            None => {
                let status = sink.stop(Duration::ZERO);
                let stderr = sink.stderr_text();
                if status.and_then(|s| s.code()) == Some(MISSING_PACKAGE_EXIT) {
                    missing_package(&python, &stderr);
                }
                panic!(
                    "otlp_http_sink.py did not print `listening PORT` within \
                     {SINK_START_TIMEOUT:?} (first line: {line:?}, exit: {status:?})\n\
                     --- stderr ---\n{stderr}"
                );
            }
        }
        sink
    }

    /// The OTLP endpoint, `http://127.0.0.1:PORT` (exporters append [`PROFILES_PATH`]).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The full URL of profiles, `http://127.0.0.1:PORT/v1development/profiles`.
    pub fn profiles_url(&self) -> String {
        format!("{}{PROFILES_PATH}", self.endpoint())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of the saved requests.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes DIR/mode atomically (`None` removes it: normal service).
    #[track_caller]
    fn set_mode(&self, mode: Option<&str>) {
        let path = self.dir.join("mode");
        match mode {
            Some(mode) => {
                let tmp = self.dir.join(".mode.tmp");
                std::fs::write(&tmp, format!("{mode}\n"))
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            }
            None => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("cannot remove {}: {e}", path.display()),
            },
        }
    }

    /// Takes the endpoint down (every request is answered 503, without Retry-After, and
    /// counted in [`HttpSink::rejected`], not saved) or brings it back up. The last call of
    /// `set_down`/`set_reject` wins.
    #[track_caller]
    pub fn set_down(&self, down: bool) {
        self.set_mode(down.then_some("down"));
    }

    /// Makes the sink accept requests (saving them) but answer with
    /// `partial_success { rejected_profiles: n, error_message: "test rejection" }`;
    /// `n == 0` restores normal answers. The last call of `set_down`/`set_reject` wins.
    #[track_caller]
    pub fn set_reject(&self, n: u32) {
        self.set_mode((n > 0).then(|| format!("reject {n}")).as_deref());
    }

    /// The saved request bodies (`NNNN.bin`, decompressed), in the order they came.
    #[track_caller]
    pub fn requests(&self) -> Vec<PathBuf> {
        let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(self.dir.path())
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", self.dir.path().display()))
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let n = path
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".bin")?
                    .parse()
                    .ok()?;
                Some((n, path))
            })
            .collect();
        found.sort();
        found.into_iter().map(|(_, path)| path).collect()
    }

    /// Waits up to `timeout` until at least `n` requests were saved and returns them all;
    /// panics (with the sink's stderr) when fewer come.
    #[track_caller]
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<PathBuf> {
        let deadline = Instant::now() + timeout;
        loop {
            let requests = self.requests();
            if requests.len() >= n {
                return requests;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the OTLP sink at {} got {} of {n} requests within {timeout:?} \
                     ({} answered 503 while down)\n--- sink stderr ---\n{}",
                    self.endpoint(),
                    requests.len(),
                    self.rejected(),
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The headers of the saved request `bin` (`NNNN.headers.json`: lower-case names to
    /// values, repeated headers joined with `, `).
    #[track_caller]
    pub fn headers(&self, bin: &Path) -> Value {
        let path = bin.with_extension("headers.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("bad JSON in {}: {e}\n{text}", path.display()))
    }

    /// The spans exported to the sink's `/v1/traces` (a tracer's OTLP/HTTP span exporter), as
    /// the sink decoded them with PyPI `opentelemetry-proto`: objects with `trace_id` (32 hex),
    /// `span_id` (16 hex), `parent_span_id` and `name`, in the order they came.
    #[track_caller]
    pub fn exported_spans(&self) -> Vec<Value> {
        let path = self.dir.path().join("spans.jsonl");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => panic!("cannot read {}: {e}", path.display()),
        };
        text.lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("bad span line {line:?} from the sink: {e}"))
            })
            .collect()
    }

    /// [`decode_file`] of every saved request, in order.
    #[track_caller]
    pub fn decode_all(&self) -> Vec<Value> {
        self.requests().iter().map(|p| decode_file(p)).collect()
    }

    /// How many requests were answered 503 while the sink was down.
    #[track_caller]
    pub fn rejected(&self) -> u64 {
        let path = self.dir.join("rejected.count");
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{} holds {text:?}, not a count", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => panic!("cannot read {}: {e}", path.display()),
        }
    }

    /// What the sink wrote on stderr so far (set OTLP_SINK_VERBOSE=1 to log requests).
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL; reaps it and
    /// collects its stderr. The exit status, if it was still ours to reap.
    fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let mut status = child.try_wait().ok().flatten();
        if status.is_none() {
            // SAFETY: kill(2) on our child, not reaped yet, so its pid cannot have been
            // reused.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + grace;
            while status.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                status = child.try_wait().ok().flatten();
            }
        }
        if status.is_none() {
            let _ = child.kill();
            status = child.wait().ok();
        }
        // The process is gone, so its stderr ends (it starts no children).
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        status
    }
}

impl Drop for HttpSink {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Read;
    use std::net::TcpStream;

    fn decoded_example() -> Value {
        let frame = |f: &str| {
            json!({"function": f, "system_name": "", "file": "a.c", "line": 1,
                                      "address": 0, "mapping": "", "attributes": {}})
        };
        json!({
            "dictionary": {}, "problems": [],
            "resources": [
                {"attributes": {"service.name": "a"}, "schema_url": "", "scopes": [
                    {"name": "s", "version": "1", "schema_url": "", "profiles": [
                        {"sample_type": "cpu/nanoseconds", "samples": [
                            {"frames": [frame("hot"), frame("main")], "values": [30, 10],
                             "timestamps": [1, 2], "attributes": {}, "link": null},
                            {"frames": [frame("cold"), frame("main")], "values": [5],
                             "timestamps": [3], "attributes": {}, "link": null}]},
                        {"sample_type": "samples/count", "samples": [
                            {"frames": [frame("hot_beta")], "values": [],
                             "timestamps": [4, 5, 6], "attributes": {}, "link": null}]}]}]},
                {"attributes": {"service.name": "b"}, "schema_url": "", "scopes": [
                    {"name": "s", "version": "1", "schema_url": "", "profiles": [
                        {"sample_type": "cpu/nanoseconds", "samples": [
                            {"frames": [frame("hot")], "values": [7], "timestamps": [],
                             "attributes": {}, "link": null}]}]}]}]
        })
    }

    #[test]
    fn accessors() {
        let decoded = decoded_example();
        assert_valid(&decoded);
        let all = profiles(&decoded);
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].0["service.name"], "b");
        assert_eq!(sample_types(&decoded), ["cpu/nanoseconds", "samples/count"]);
        assert_eq!(samples(&decoded, "cpu/nanoseconds").len(), 3);
        assert_eq!(total(&decoded, "cpu/nanoseconds"), 52);
        assert_eq!(total(&decoded, "samples/count"), 3);
        assert_eq!(stacks_with(&decoded, "cpu/nanoseconds", "hot"), 47);
        assert_eq!(stacks_with(&decoded, "samples/count", "hot"), 3);
        assert_eq!(stacks_with(&decoded, "cpu/nanoseconds", "nope"), 0);
        assert_eq!(
            functions(samples(&decoded, "cpu/nanoseconds")[1]),
            ["cold", "main"]
        );
    }

    #[test]
    #[should_panic(expected = "stack_index 0")]
    fn assert_valid_lists_problems() {
        assert_valid(&json!({"dictionary": {}, "problems": ["samples[0]: stack_index 0"]}));
    }

    /// The decoder on the empty request (valid protobuf, but its tables lack their zero
    /// entries) and on bytes that are no protobuf.
    #[test]
    fn decoder_runs() {
        let empty = decode(b"");
        let problems = problem_list(&empty);
        assert!(
            problems.iter().any(|p| p.contains("string_table is empty")),
            "{problems:?}"
        );
        assert_eq!(empty["dictionary"]["string"], 0);
        let err = try_decode(b"\xff\xff\xff\xff").unwrap_err();
        assert!(err.contains("decode: "), "{err}");
    }

    /// One HTTP/1.1 POST to the sink with `Connection: close`: (status, body).
    fn post(sink: &HttpSink, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(("127.0.0.1", sink.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nX-Test: yes\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete response");
        let status_line = String::from_utf8_lossy(&response[..split]).into_owned();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line in {status_line:?}"));
        (status, response[split + 4..].to_vec())
    }

    /// The sink saves, refuses while down and reports rejections. The body is the empty
    /// `ExportProfilesServiceRequest` (zero bytes).
    #[test]
    fn sink_round_trip() {
        let sink = HttpSink::start();
        assert!(sink.endpoint().starts_with("http://127.0.0.1:"));
        let protobuf = "application/x-protobuf";
        assert_eq!(post(&sink, PROFILES_PATH, protobuf, b""), (200, Vec::new()));
        assert_eq!(post(&sink, PROFILES_PATH, "application/json", b"").0, 415);
        assert_eq!(post(&sink, "/v1/logs", protobuf, b"").0, 404);
        // Spans (a tracer's exporter): an empty export is no span; garbage is refused.
        assert_eq!(post(&sink, "/v1/traces", protobuf, b"").0, 200);
        assert_eq!(post(&sink, "/v1/traces", protobuf, b"\xff\xff").0, 400);
        assert!(sink.exported_spans().is_empty());
        assert_eq!(post(&sink, PROFILES_PATH, protobuf, b"\xff\xff").0, 400);
        let saved = sink.wait_for_requests(1, Duration::from_secs(5));
        assert_eq!(saved.len(), 1);
        assert!(saved[0].ends_with("0001.bin"), "{saved:?}");
        assert_eq!(sink.headers(&saved[0])["x-test"], "yes");

        sink.set_down(true);
        assert_eq!(post(&sink, PROFILES_PATH, protobuf, b"").0, 503);
        assert_eq!(post(&sink, PROFILES_PATH, protobuf, b"").0, 503);
        assert_eq!(sink.rejected(), 2);
        assert_eq!(sink.requests().len(), 1);

        sink.set_reject(3);
        let (status, body) = post(&sink, PROFILES_PATH, protobuf, b"");
        assert_eq!(status, 200);
        // partial_success (field 1) { rejected_profiles (1) = 3, error_message (2) }.
        let mut expected = vec![0x0a, 18, 0x08, 3, 0x12, 14];
        expected.extend_from_slice(b"test rejection");
        assert_eq!(body, expected);
        sink.set_reject(0);
        assert_eq!(post(&sink, PROFILES_PATH, protobuf, b""), (200, Vec::new()));
        assert_eq!(sink.requests().len(), 3);
        let decoded = sink.decode_all();
        assert_eq!(decoded.len(), 3);
    }
}

/// A real OTLP/gRPC receiver: a tonic `ProfilesService` server on a free local port (gzip
/// accepted), run on its own thread for the life of the test process. It keeps each request,
/// as tonic decoded it, with its metadata.
#[derive(Debug)]
pub struct GrpcSink {
    endpoint: String,
    received: Arc<Mutex<Vec<GrpcRequest>>>,
}

/// One request a [`GrpcSink`] received, and its metadata (headers).
pub type GrpcRequest = (ExportProfilesServiceRequest, tonic::metadata::MetadataMap);

#[derive(Debug, Clone)]
struct Collector(Arc<Mutex<Vec<GrpcRequest>>>);

#[tonic::async_trait]
impl ProfilesService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        self.0
            .lock()
            .unwrap()
            .push((request.into_inner(), metadata));
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

impl GrpcSink {
    /// Starts the server (plain text).
    pub fn start() -> GrpcSink {
        Self::start_with(None)
    }

    /// Starts the server with TLS: `identity` is the PEM certificate chain and key it shows.
    pub fn start_tls(cert_pem: &[u8], key_pem: &[u8]) -> GrpcSink {
        Self::start_with(Some(tonic::transport::Identity::from_pem(
            cert_pem, key_pem,
        )))
    }

    fn start_with(tls: Option<tonic::transport::Identity>) -> GrpcSink {
        let secure = tls.is_some();
        let received = Arc::new(Mutex::new(Vec::new()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener.local_addr().expect("local address");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let service = ProfilesServiceServer::new(Collector(received.clone()))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let mut server = tonic::transport::Server::builder();
                if let Some(identity) = tls {
                    server = server
                        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                        .expect("server TLS");
                }
                server
                    .add_service(service)
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                    .await
                    .expect("gRPC server");
            });
        });
        GrpcSink {
            endpoint: format!("{}://{addr}", if secure { "https" } else { "http" }),
            received,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<GrpcRequest> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests came (panics after `timeout`); returns them all.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<GrpcRequest> {
        let end = Instant::now() + timeout;
        loop {
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < end,
                "the gRPC sink got {} requests in {timeout:?}, expected {n}",
                got.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Decodes a request a [`GrpcSink`] received with the independent decoder (encoded again:
/// tonic already parsed it).
pub fn decode_grpc(request: &ExportProfilesServiceRequest) -> Value {
    decode(&prost::Message::encode_to_vec(request))
}

/// The pid in the `ready PID` line the Python workloads print on stderr (in `text`, which may
/// hold other lines).
#[track_caller]
pub fn ready_pid(text: &str) -> u32 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("ready "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `ready PID` line in:\n{text}"))
}

/// One OpenTelemetry span of `py_span_workload.py`'s truth file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// The native thread id it ran on.
    pub tid: u64,
    /// Its name, as the workload gave it.
    pub name: String,
}

impl OtelSpan {
    /// The `span.name` spanprof gives its samples: none unless the name is ASCII; its first 64
    /// bytes.
    pub fn kept_name(&self) -> Option<&str> {
        let n = &self.name;
        (n.is_ascii() && !n.is_empty()).then(|| &n[..n.len().min(64)])
    }
}

/// The OpenTelemetry spans of a `py_span_workload.py` truth file, by the function that ran
/// inside each (`span_work_N`).
pub fn read_otel_truth(path: &Path) -> std::collections::BTreeMap<String, OtelSpan> {
    let text = std::fs::read_to_string(path).expect("truth file");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "otel")
        .map(|v| {
            (
                v["function"].as_str().expect("function").to_string(),
                OtelSpan {
                    trace_id: v["trace_id"].as_str().expect("trace_id").to_string(),
                    span_id: v["span_id"].as_str().expect("span_id").to_string(),
                    tid: v["tid"].as_u64().expect("tid"),
                    name: v["name"].as_str().expect("name").to_string(),
                },
            )
        })
        .collect()
}
