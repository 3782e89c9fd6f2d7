//! `spanprof verify`: the built-in calibrated workloads pass on this machine with every figure
//! printed, the export to a real OTLP/HTTP receiver is checked (accepted, and partly
//! rejected), and a `--pid` target is checked.

use std::time::Duration;

use spanprof_tests::otlp::{self, HttpSink};
use spanprof_tests::{
    args, profiling_lock, py_workload_source, pyenv_python, require_profiling, require_span_libs,
    run_with_timeout, span_libs, spanprof_command, Background, RunOutput,
};

/// Long enough for the five built-in sessions (about 3 s each plus loading).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(240);

/// The result column and figure of check `name` in verify's table.
fn row<'a>(out: &'a RunOutput, name: &str) -> (&'a str, &'a str) {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with("  "))
        .unwrap_or_else(|| panic!("no {name:?} row\n{out}"));
    let rest = line[name.len()..].trim_start();
    let (status, figure) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    (status, figure.trim_start())
}

#[test]
fn verify_passes_on_its_builtin_workloads_and_prints_every_figure() {
    require_profiling();
    let python = pyenv_python(12);
    let libs = span_libs(12);
    require_span_libs(&python, &libs);
    let sink = HttpSink::start();
    let _lock = profiling_lock();
    let mut cmd = spanprof_command(args![
        "verify",
        "--python",
        &python,
        "--otlp-endpoint",
        sink.endpoint(),
        "--otlp-protocol",
        "http/protobuf"
    ]);
    cmd.env("PYTHONPATH", &libs).env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, VERIFY_TIMEOUT);
    assert_eq!(out.code(), 0, "verify failed\n{out}");
    // Every check ran and passed, each with its figure.
    for (name, needles) in [
        ("capabilities", &["CAP_BPF", "CAP_PERFMON"][..]),
        ("kernel BTF", &["/sys/kernel/btf/vmlinux"][..]),
        ("kernel symbols", &["addresses"][..]),
        (
            "native: functions",
            &["verify_native_alpha", "truth 75.0%"][..],
        ),
        (
            "native: frames named",
            &["% of", "frames have a function name"][..],
        ),
        ("native: stacks complete", &["stacks complete"][..]),
        (
            "resource attributes",
            &["service.name=", "host.name=", "process.pid="][..],
        ),
        (
            "overhead",
            &[
                "µs in the kernel",
                "of its own CPU per sample",
                "% of the target",
            ][..],
        ),
        ("OTLP export", &["accepted", "0 rejected"][..]),
        ("allocations", &["MiB estimated", "MiB allocated"][..]),
        (
            "python: functions",
            &["verify_alpha", "verify_beta", "truth"][..],
        ),
        (
            "spans",
            &["OpenTelemetry span", "OSProfiler trace point", "samples"][..],
        ),
    ] {
        let (status, figure) = row(&out, name);
        assert_eq!(status, "pass", "{name}: {figure}\n{out}");
        for needle in needles {
            assert!(
                figure.contains(needle),
                "{name}: {needle:?} not in {figure:?}"
            );
        }
    }
    assert!(
        out.stdout
            .contains("checks: 12 passed, 0 failed, 0 skipped"),
        "{out}"
    );
    // The receiver got a valid request.
    let requests = sink.wait_for_requests(1, Duration::from_secs(10));
    let decoded = otlp::decode_file(&requests[0]);
    otlp::assert_valid(&decoded);
    assert!(otlp::total(&decoded, "samples/count") > 100, "{decoded:#}");
}

/// A `--pid` target, and a receiver that rejects part of the export: verify names the check
/// that failed, with the partial-success count, and exits 1.
#[test]
fn verify_of_a_target_fails_on_a_partly_rejected_export() {
    require_profiling();
    let sink = HttpSink::start();
    sink.set_reject(2);
    let _lock = profiling_lock();
    let mut cmd = std::process::Command::new(pyenv_python(12));
    cmd.arg(py_workload_source("py_split.py")).arg("20");
    let mut workload = Background::spawn(cmd);
    let line = workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid = otlp::ready_pid(&line);
    let out = run_with_timeout(
        spanprof_command(args![
            "verify",
            "--pid",
            pid.to_string(),
            "--duration",
            "2s",
            "--otlp-endpoint",
            sink.endpoint(),
            "--otlp-protocol",
            "http/protobuf"
        ]),
        VERIFY_TIMEOUT,
    );
    workload.signal(libc::SIGKILL);
    assert_eq!(out.code(), 1, "{out}");
    let (status, figure) = row(&out, "OTLP export");
    assert_eq!(status, "FAIL", "{figure}");
    assert!(figure.contains("2 rejected"), "{figure}");
    assert!(out.stderr.contains("failed: OTLP export"), "{out}");
    for name in [
        "target: samples",
        "target: frames named",
        "target: python frames",
        "resource attributes",
        "overhead",
    ] {
        let (status, figure) = row(&out, name);
        assert_eq!(status, "pass", "{name}: {figure}\n{out}");
    }
    let (status, _) = row(&out, "target: spans");
    assert_eq!(status, "skip", "py_split.py has no spans\n{out}");
}
