//! Span contexts read from the tracing libraries' own objects: OpenTelemetry in two threads
//! and in asyncio tasks, OSProfiler in two threads, OpenTelemetry imported after spanprof
//! attached.

use std::process::Command;
use std::time::Duration;

use spanprof_tests::{
    profiling_lock, spanprof_command, start_py_workload_with_libs, Background, TempDir, RUN_TIMEOUT,
};

use crate::common::{
    require_span_profiling, Interp, FREQUENCY, OSPROFILER_NAMED_KEYS, OTEL_NAMED_KEYS, WORKLOAD,
};
use crate::truth::{check_labels, check_mode};

pub(super) fn otel_threads(interp: &Interp) {
    check_mode(interp, "otel_threads", &OTEL_NAMED_KEYS);
}

pub(super) fn otel_asyncio(interp: &Interp) {
    check_mode(interp, "otel_asyncio", &OTEL_NAMED_KEYS);
}

pub(super) fn osprofiler(interp: &Interp) {
    check_mode(interp, "osprofiler", &OSPROFILER_NAMED_KEYS);
}

/// spanprof attaches to a process that has not imported OpenTelemetry (it runs `outside_work`);
/// 0.5 s later the process imports it and runs spans, two threads, for 5 s.
pub(super) fn otel_late(interp: &Interp) {
    require_span_profiling(interp);
    let _lock = profiling_lock();
    let tmp = TempDir::new("spans-otel-late");
    let truth = tmp.join("truth.jsonl");
    let go = tmp.join("go");
    let pprof = tmp.join("spans.pb.gz");
    let workload = start_py_workload_with_libs(
        &interp.path,
        &interp.libs,
        WORKLOAD,
        &[
            "otel_late",
            "5",
            truth.to_str().expect("UTF-8 temp path"),
            go.to_str().expect("UTF-8 temp path"),
        ],
    );
    let mut cmd: Command = spanprof_command(["profile", "--duration", "5s", "--frequency"]);
    cmd.arg(FREQUENCY.to_string())
        .arg("--pid")
        .arg(workload.pid().to_string())
        .arg("-o")
        .arg(&pprof);
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, b"go").expect("writing the go file");
    let out = run.finish(RUN_TIMEOUT);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    check_labels(interp, "otel_late", &pprof, &truth, &OTEL_NAMED_KEYS, &out);
}
