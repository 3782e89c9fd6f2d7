//! `--python-only` and `--no-lines`.

use spanprof_tests::{
    args, last_json_line, parse_py_frame, profiling_lock, read_folded, run_spanprof,
    start_py_workload, TempDir, RUN_TIMEOUT,
};

use crate::common::{assert_no_problems, require_python_profiling, Interp};
use crate::later::check_split_unwound;
use crate::split::split_functions;

/// `--python-only --no-lines`: every frame is a Python frame without a line
/// (`qualname (file.py)`) or a marker, `[no python frames]` stands alone, and
/// the split is still right.
pub(super) fn python_only_without_lines(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-only");
    let folded = tmp.join("only.folded");
    let workload = start_py_workload(&interp.path, "py_split.py", &["4"]);
    let out = run_spanprof(args![
        "profile",
        "--pid",
        workload.pid().to_string(),
        "--duration",
        "2500ms",
        "--frequency",
        "499",
        "--python-only",
        "--no-lines",
        "-o",
        folded,
    ]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    let truth = last_json_line(&workload_out.stdout);
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();
    for stack in &stacks {
        for frame in &stack.frames {
            let ok = match parse_py_frame(frame) {
                Some(py) => py.line.is_none(),
                None => {
                    frame == "[truncated]"
                        || frame == "[native code]"
                        || frame == "[no python frames]" && stack.frames.len() == 1
                }
            };
            if !ok {
                problems.push(format!(
                    "frame {frame:?} is not `qualname (file.py)` nor a marker: {}",
                    stack.frames.join(";")
                ));
                break;
            }
        }
    }
    let functions = split_functions(interp);
    for (_, name) in &functions {
        let frame = format!("{name} (py_split.py)");
        let path = [
            "<module> (py_split.py)",
            "main (py_split.py)",
            "run_split (py_split.py)",
            &frame,
        ];
        if !stacks.iter().any(|s| s.frames == path) {
            problems.push(format!("no stack is exactly {}", path.join(";")));
        }
    }
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    assert_no_problems(&problems, interp, &stacks, &out);
}
