//! The wait a process ends with keeps its Python names.

use spanprof_tests::{
    args, profiling_lock, py_workload_source, read_folded, run_spanprof, TempDir,
};

use crate::common::{require_offcpu_profiling, Interp, FREQUENCY};

/// `py_last_wait.py`: the main thread joins two 1.5 s workers in `join_all`, or sleeps 1.5 s
/// alone in `sleep_last`, then the process exits, normally or by `os._exit` (as
/// multiprocessing's workers do). The wait's off-CPU sample is sent when it ends, milliseconds
/// before the interpreter frees the code objects it names, or microseconds before the process's
/// memory is gone. The code objects on the threads' stacks are named while they wait (every
/// 200 ms): measured without that, the `os._exit` case was named in 0 of 8 runs (3.11, 3.13)
/// and the plain sleep in 1 of 4 on 3.13. Ten runs (four joins, three sleeps, three exits):
/// every one must name the wait (at least 1 s under the function) and have no stack of 100 ms
/// or more with `[unknown python code]` (a start-up I/O wait of a few ms in code a `.pth` file
/// `exec`s may be unnamed, honestly: that code object is freed as soon as it has run).
pub(super) fn last_wait_named(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-last-wait");
    let mut outcomes = Vec::new();
    for run in 0..10 {
        let (mode, function) = match run % 3 {
            0 => ("join", "join_all "),
            1 => ("sleep", "sleep_last "),
            _ => ("exit", "sleep_last "),
        };
        let folded = tmp.join(&format!("run{run}.folded"));
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
            py_workload_source("py_last_wait.py"),
            "1.5",
            mode
        ]);
        out.assert_success();
        let stacks = read_folded(&folded);
        let weight = |pred: &dyn Fn(&str) -> bool, least: u64| -> u64 {
            stacks
                .iter()
                .filter(|s| s.count >= least && s.frames.iter().any(|f| pred(f)))
                .map(|s| s.count)
                .sum()
        };
        let named = weight(&|f| f.starts_with(function), 0);
        let unknown = weight(&|f| f == "[unknown python code]", 100_000_000);
        outcomes.push((mode, named, unknown));
    }
    let bad: Vec<_> = outcomes
        .iter()
        .filter(|(_, named, unknown)| *named < 1_000_000_000 || *unknown > 0)
        .collect();
    assert!(
        bad.is_empty(),
        "{}: the last wait was not named in {} of 10 runs; (mode, ns under the waiting \
         function, ns in stacks of 100 ms or more under [unknown python code]) per run: \
         {outcomes:?}",
        interp.label,
        bad.len()
    );
}
