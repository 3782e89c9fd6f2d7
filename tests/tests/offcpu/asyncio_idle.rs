//! An idle asyncio event loop's wait is named `asyncio_idle`, not `io`.

use spanprof_tests::{
    args, profiling_lock, py_workload_source, read_folded, run_spanprof, TempDir,
};

use crate::common::{require_offcpu_profiling, Interp, FREQUENCY};

/// The Python function of a folded frame (`Class.method (file.py:N)` → `Class.method`).
fn function(frame: &str) -> &str {
    frame.split(" (").next().unwrap_or(frame)
}

/// `py_asyncio_idle.py`: three tasks that work 3 ms and sleep 20 ms, for 2 s. The loop's waits
/// in its selector (`_run_once` → `select`) are under `[off-cpu: asyncio_idle]`: at least 0.6 s
/// of them, and none of those waits under another reason. The loop's one thread works about
/// 9 ms of every 29 ms, so it is idle about two thirds of the 2 s at best, less on a slow host
/// (a CI run measured 0.975 s of waits beside 0.94 s of the process's CPU, start-up included:
/// the bound was 1 s).
pub(super) fn asyncio_idle(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-asyncio-idle");
    let folded = tmp.join("idle.folded");
    let out = run_spanprof(args![
        "profile",
        "--event",
        "offcpu",
        "--frequency",
        FREQUENCY.to_string(),
        "-o",
        &folded,
        "--",
        &interp.path,
        py_workload_source("py_asyncio_idle.py"),
        "2"
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let loop_wait = |frames: &[String]| {
        let python: Vec<&str> = frames
            .iter()
            .filter(|f| f.contains(".py:") || f.ends_with(".py)"))
            .map(|f| function(f))
            .collect();
        python.len() >= 2
            && python[python.len() - 1].ends_with("select")
            && python[python.len() - 2].ends_with("_run_once")
    };
    let (mut idle, mut other, mut examples) = (0u64, 0u64, Vec::new());
    for s in &stacks {
        if !loop_wait(&s.frames) {
            continue;
        }
        if s.frames.first().map(String::as_str) == Some("[off-cpu: asyncio_idle]") {
            idle += s.count;
        } else {
            other += s.count;
            if examples.len() < 4 {
                examples.push(s.frames.join(";"));
            }
        }
    }
    println!(
        "{}: loop waits {:.3} s under [off-cpu: asyncio_idle], {:.3} s under another root",
        interp.label,
        idle as f64 / 1e9,
        other as f64 / 1e9
    );
    assert!(
        idle >= 600_000_000 && other == 0,
        "{}: the event loop's selector waits: {idle} ns under [off-cpu: asyncio_idle] (expected \
         at least 0.6 s), {other} ns under another root (expected none), e.g.\n{}\n{out}",
        interp.label,
        examples.join("\n")
    );
}
