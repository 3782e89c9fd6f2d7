//! The wait a process ends with keeps its Python names.

use spanprof_tests::{
    args, profiling_lock, py_workload_source, read_folded, run_spanprof, TempDir,
};

use crate::common::{require_offcpu_profiling, Interp, FREQUENCY};

/// `py_last_wait.py`: the main thread joins two 1.5 s workers in `join_all`, then the process
/// exits. The wait's off-CPU sample is sent when it ends, milliseconds before the interpreter
/// frees the code objects it names (before, 7 of 11 runs showed `[unknown python code]` there;
/// a wait of 100 ms or more now wakes spanprof at once: 10 of 10 named on 3.11 and 3.13).
/// Four runs, of which at least three must name the wait (at least 1 s under `join_all`, none
/// of it under `[unknown python code]`): the old behaviour passes that one time in seven.
pub(super) fn last_wait_named(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-last-wait");
    let mut outcomes = Vec::new();
    for run in 0..4 {
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
            "1.5"
        ]);
        out.assert_success();
        let stacks = read_folded(&folded);
        let weight = |pred: &dyn Fn(&str) -> bool| -> u64 {
            stacks
                .iter()
                .filter(|s| s.frames.iter().any(|f| pred(f)))
                .map(|s| s.count)
                .sum()
        };
        let named = weight(&|f| f.starts_with("join_all "));
        let unknown = weight(&|f| f == "[unknown python code]");
        outcomes.push((named, unknown));
    }
    let good = outcomes
        .iter()
        .filter(|(named, unknown)| *named >= 1_000_000_000 && *unknown == 0)
        .count();
    assert!(
        good >= 3,
        "{}: the last wait was named in {good} of 4 runs; (ns under join_all, ns under \
         [unknown python code]) per run: {outcomes:?}",
        interp.label
    );
}
