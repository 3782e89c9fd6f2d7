//! 6. Lines: a frame is always on a line of its function, also before its first line.

use std::collections::{BTreeMap, BTreeSet};

use spanprof_tests::{
    folded_count, folded_total, profile_pid, profiling_lock, py_workload_source, read_folded,
    start_py_workload, TempDir,
};

use crate::common::{assert_no_problems, require_python_profiling, Interp};

/// The lines of `script` marked `# closure: …`, and the one marked `# closure: def`.
fn closure_lines(script: &str) -> (BTreeSet<u32>, u32) {
    let path = py_workload_source(script);
    let source = std::fs::read_to_string(&path).expect("readable workload");
    let mut lines = BTreeSet::new();
    let mut def = None;
    for (i, text) in source.lines().enumerate() {
        let n = i as u32 + 1;
        if text.trim_end().ends_with("# closure: def") {
            def = Some(n);
            lines.insert(n);
        } else if text.trim_end().ends_with("# closure: body") {
            lines.insert(n);
        }
    }
    let def = def.unwrap_or_else(|| panic!("no `# closure: def` line in {}", path.display()));
    (lines, def)
}

/// `py_closure_lines.py` by pid: a closure with a cell and a free variable called in a hot
/// loop, so that many samples catch it in its prologue (3.11+: `COPY_FREE_VARS`,
/// `MAKE_CELL`, which the location table gives no line). Every frame of the closure is on a
/// line the source marks as the closure's (its `def` line or a body line), never on none
/// (line 0), and some are on the `def` line from 3.11.
pub(super) fn closure_frames_are_on_their_own_lines(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let script = "py_closure_lines.py";
    let (own, def) = closure_lines(script);
    let name = if interp.minor >= 11 {
        "make.<locals>.pred"
    } else {
        "pred"
    };
    let tmp = TempDir::new("py-closure-lines");
    let folded = tmp.join("closure.folded");
    let workload = start_py_workload(&interp.path, script, &["3"]);
    let out = profile_pid(workload.pid(), "1500ms", 499, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let total = folded_total(&stacks);
    let mut lines: BTreeMap<Option<u32>, u64> = BTreeMap::new();
    for stack in &stacks {
        for frame in stack.py_frames() {
            if frame.qualname == name && frame.file == script {
                *lines.entry(frame.line).or_default() += stack.count;
            }
        }
    }
    let samples: u64 = lines.values().sum();
    let in_pred = folded_count(&stacks, |s| {
        s.py_frames()
            .iter()
            .any(|f| f.qualname == name && f.file == script)
    });
    println!(
        "{}: {total} samples, {in_pred} in {name}; its lines (None: no line): {lines:?}; \
         the closure's own: {own:?}",
        interp.label
    );
    let mut problems = Vec::new();
    // The loop spends most of its time in the closure.
    if in_pred < 100 {
        problems.push(format!(
            "only {in_pred} of {total} samples have a {name} frame, expected at least 100"
        ));
    }
    let wrong: BTreeMap<_, _> = lines
        .iter()
        .filter(|(line, _)| !line.is_some_and(|l| own.contains(&l)))
        .collect();
    if !wrong.is_empty() {
        problems.push(format!(
            "{name} frames on lines that are not the closure's ({own:?}), None meaning no \
             line: {wrong:?} of {samples}"
        ));
    }
    if interp.minor >= 11 && lines.get(&Some(def)).copied().unwrap_or(0) == 0 {
        problems.push(format!(
            "no {name} frame on its def line {def}, where its prologue is: {lines:?}"
        ));
    }
    assert_no_problems(&problems, interp, &stacks, &out);
}
