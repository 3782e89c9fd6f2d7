//! 4. Python processes that start after the session.

use spanprof_tests::{
    args, folded_count, folded_total, last_json_line, parse_summary, profiling_lock,
    py_workload_source, read_folded, run_spanprof, FoldedStack, TempDir,
};

use crate::common::{assert_no_problems, require_python_profiling, Interp};
use crate::split::{split_functions, SplitCounts};

/// Checks that the `py_split.py` process(es) in `stacks` were unwound: most
/// samples have the whole Python path to one of the three functions, and the
/// shares are within ±`tolerance` points of `truth` (a sanity check here; the
/// precise comparison is `split_matches_truth_and_py_spy`).
pub(super) fn check_split_unwound(
    interp: &Interp,
    stacks: &[FoldedStack],
    truth: &serde_json::Value,
    tolerance: f64,
    problems: &mut Vec<String>,
) {
    let total = folded_total(stacks);
    let functions = split_functions(interp);
    let counts = SplitCounts::of(stacks, &functions);
    let with_path = folded_count(stacks, |s| {
        let names = s.py_qualnames();
        names.starts_with(&["<module>", "main", "run_split"])
    });
    // The session also covers `sh`, the sleep and the interpreter's start-up.
    if (with_path as f64) < 0.6 * total as f64 || counts.total() < 100 {
        problems.push(format!(
            "only {with_path} of {total} samples have the Python path <module> -> main -> \
             run_split of py_split.py ({} in its three functions)",
            counts.total()
        ));
        return;
    }
    for (key, name) in &functions {
        let expected = 100.0 * truth["truth"][key].as_f64().unwrap_or(f64::NAN);
        let share = counts.share(key);
        let off = (share - expected).abs();
        if off.is_nan() || off > tolerance {
            problems.push(format!(
                "{name}: share {share:.1}% is not within ±{tolerance} points of the truth \
                 {expected:.1}%"
            ));
        }
    }
}

/// `-- sh -c 'sleep 0.3; exec python3.X py_split.py'`: the interpreter
/// appears by exec after the session began.
pub(super) fn exec_after_start_is_unwound(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-exec");
    let folded = tmp.join("exec.folded");
    let script = py_workload_source("py_split.py");
    let command = format!(
        "sleep 0.3; exec {} {} 2.5",
        interp.path_str(),
        script.to_str().expect("UTF-8 path")
    );
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        folded,
        "--",
        "sh",
        "-c",
        command,
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let truth = last_json_line(&out.stdout);
    let mut problems = Vec::new();
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    assert_no_problems(&problems, interp, &stacks, &out);
}

/// `-- python3.X py_spawn.py`: a Python parent starts a Python child (the
/// split workload) with subprocess after 0.3 s; the child is unwound.
pub(super) fn child_started_later_is_unwound(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-child");
    let folded = tmp.join("child.folded");
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        folded,
        "--",
        interp.path,
        py_workload_source("py_spawn.py"),
        "2.5",
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let truth = last_json_line(&out.stdout);
    let mut problems = Vec::new();
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    let summary = parse_summary(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    if summary.processes < 2 {
        problems.push(format!(
            "the summary counts {} process(es), expected the parent and the child",
            summary.processes
        ));
    }
    assert_no_problems(&problems, interp, &stacks, &out);
}
