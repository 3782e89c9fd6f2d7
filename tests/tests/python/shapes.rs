//! 3. Deep stacks, generators, coroutines, callbacks from C.

use spanprof_tests::{
    callback_session, folded_summary, is_kernel_frame, is_py_frame, parse_py_frame, profile_pid,
    profiling_lock, read_folded, start_py_workload, FoldedStack, TempDir,
};

use crate::common::{assert_no_problems, require_python_profiling, Interp};

/// How the stacks whose innermost Python frame is `leaf`, reached through `depth` frames of
/// `down`, came out, in samples.
#[derive(Default, Debug)]
struct Deep {
    /// `<module> -> main -> drive -> down x depth -> leaf`.
    whole: u64,
    /// `<module> -> main -> drive -> down x a -> [truncated] -> down x b -> leaf`, with
    /// a + b < depth and at least 480 frames after the marker (the walker keeps the innermost
    /// 480 of a stack deeper than 512, and the outermost 32).
    gap: u64,
    /// `[truncated]` before (rootwards of) every Python frame, which are an unbroken run of
    /// `down` ending in `leaf` (the walk stopped early, e.g. at a failed read).
    root_cut: u64,
}

/// Sorts the stacks of `leaf` into [`Deep`]; any other shape is a problem.
fn check_deep(
    stacks: &[FoldedStack],
    down: &str,
    leaf: &str,
    depth: usize,
    problems: &mut Vec<String>,
) -> Deep {
    let mut deep = Deep::default();
    let mut bad = 0;
    for stack in stacks {
        let py = stack.py_qualnames();
        if py.last() != Some(&leaf) {
            continue;
        }
        let downs = py.iter().filter(|n| **n == down).count();
        let roots = py.len() > 3 && py[..3] == ["<module>", "main", "drive"];
        let marker = stack.frames.iter().position(|f| f == "[truncated]");
        let first_py = stack.frames.iter().position(|f| is_py_frame(f));
        // Python frames after (leafwards of) the marker.
        let after = marker.map_or(0, |m| {
            stack.frames[m..].iter().filter(|f| is_py_frame(f)).count()
        });
        let all_down = |names: &[&str]| names.iter().all(|n| *n == down);
        let shape = match (marker, first_py) {
            (None, _) if roots && downs == depth && py.len() == depth + 4 => Some(&mut deep.whole),
            (Some(m), Some(p))
                if m > p && roots && downs < depth && all_down(&py[3..py.len() - 1]) =>
            {
                if after < 480 {
                    problems.push(format!(
                        "a stack of {leaf} cut in its middle has {after} Python frames after the \
                         marker, fewer than the 480 innermost the walker keeps"
                    ));
                }
                Some(&mut deep.gap)
            }
            (Some(m), Some(p)) if m < p && downs < depth && all_down(&py[..py.len() - 1]) => {
                // The walker must not stop early: at least 256 Python frames.
                if py.len() < 256 {
                    problems.push(format!(
                        "a stack of {leaf} cut at its root has only {} Python frames, fewer \
                         than 256",
                        py.len()
                    ));
                }
                Some(&mut deep.root_cut)
            }
            _ => None,
        };
        match shape {
            Some(count) => *count += stack.count,
            None => {
                bad += stack.count;
                if bad <= 3 {
                    problems.push(format!(
                        "a stack of {leaf} ({} Python frames, {downs} of {down}, expected \
                         {depth}) is neither whole nor cut where it should be: {}",
                        py.len(),
                        abbreviate(&stack.frames)
                    ));
                }
            }
        }
    }
    if deep.whole + deep.gap + deep.root_cut < 20 {
        problems.push(format!(
            "{leaf}: only {} samples are whole or cut ({bad} neither), expected at least 20",
            deep.whole + deep.gap + deep.root_cut
        ));
    }
    deep
}

/// A long stack with runs of the same frame collapsed (`f x300`).
fn abbreviate(frames: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let run = frames[i..].iter().take_while(|f| **f == frames[i]).count();
        out.push(if run > 1 {
            format!("{} x{run}", frames[i])
        } else {
            frames[i].clone()
        });
        i += run;
    }
    out.join(";")
}

/// A 300-deep recursion is whole (or cut at its root by a failed read); a 900-deep one,
/// deeper than the 512 frames a sample holds, keeps its root frames (`<module>`, `main`,
/// `drive`) and its innermost ones with the `[truncated]` marker between, where the frames were
/// left out.
pub(super) fn deep_recursion_whole_or_truncated(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-deep");
    let folded = tmp.join("deep.folded");
    let workload = start_py_workload(&interp.path, "py_deep.py", &["4"]);
    let out = profile_pid(workload.pid(), "2500ms", 199, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();
    let d300 = check_deep(&stacks, "down_whole", "leaf_whole", 300, &mut problems);
    let d900 = check_deep(&stacks, "down_deep", "leaf_deep", 900, &mut problems);
    if d300.gap > 0 || d300.whole < 20 {
        problems.push(format!(
            "300 deep (under the 512 frames a sample holds): {} whole, {} with frames left out",
            d300.whole, d300.gap
        ));
    }
    let n900 = d900.whole + d900.gap + d900.root_cut;
    if d900.whole > 0 || (d900.gap as f64) < 0.9 * n900 as f64 {
        problems.push(format!(
            "900 deep: {} of {n900} samples keep their root frames with the marker between, \
             expected at least 90% ({} whole, {} cut at the root)",
            d900.gap, d900.whole, d900.root_cut
        ));
    }
    let deep_stacks: Vec<FoldedStack> = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some_and(|f| f.qualname.starts_with("leaf_")))
        .map(|s| FoldedStack {
            frames: vec![abbreviate(&s.frames)],
            count: s.count,
        })
        .collect();
    assert!(
        problems.is_empty(),
        "{}: 300 deep: {d300:?}; 900 deep: {d900:?}\n- {}\nstacks of the leaves (runs \
         collapsed):\n{}\nheaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        folded_summary(&deep_stacks, 12),
        folded_summary(&stacks, 6)
    );
}

/// Checks that at least 95% (and at least 20) of the samples whose innermost
/// Python frame is `leaf` satisfy `ok`.
fn check_shape(
    stacks: &[FoldedStack],
    leaf: &str,
    what: &str,
    ok: impl Fn(&FoldedStack) -> bool,
    problems: &mut Vec<String>,
) {
    let of_leaf: Vec<&FoldedStack> = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some_and(|f| f.qualname == leaf))
        .collect();
    let n: u64 = of_leaf.iter().map(|s| s.count).sum();
    let good: u64 = of_leaf.iter().filter(|s| ok(s)).map(|s| s.count).sum();
    if n < 20 {
        problems.push(format!("{leaf} has {n} samples, expected at least 20"));
    } else if (good as f64) < 0.95 * n as f64 {
        let examples: Vec<String> = of_leaf
            .iter()
            .filter(|s| !ok(s))
            .take(3)
            .map(|s| format!("    {} {}", s.frames.join(";"), s.count))
            .collect();
        problems.push(format!(
            "only {good} of {n} samples of {leaf} show {what}; for example:\n{}",
            examples.join("\n")
        ));
    }
}

/// In `stack`, the frames strictly between the Python frame `caller` and the
/// Python frame `callee` that follows it, if they appear in that order.
fn frames_between<'a>(stack: &'a FoldedStack, caller: &str, callee: &str) -> Option<&'a [String]> {
    fn qualname(frame: &str) -> Option<&str> {
        parse_py_frame(frame).map(|p| p.qualname)
    }
    let i = stack
        .frames
        .iter()
        .position(|f| qualname(f) == Some(caller))?;
    let j = i
        + 1
        + stack.frames[i + 1..]
            .iter()
            .position(|f| qualname(f) == Some(callee))?;
    Some(&stack.frames[i + 1..j])
}

/// Generators under their consumers, awaited coroutines under their awaiters,
/// a key function called by `sorted` under its caller with (3.11+) a
/// non-Python frame between the two, and a system call from Python with the
/// kernel frames below native frames below the Python frames.
pub(super) fn generators_coroutines_callbacks_and_syscalls(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-shapes");
    let folded = tmp.join("shapes.folded");
    let workload = start_py_workload(&interp.path, "py_shapes.py", &["4.5"]);
    let out = profile_pid(workload.pid(), "3s", 199, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();

    check_shape(
        &stacks,
        "gen_producer",
        "the Python frames run_generators -> consumer -> gen_producer",
        |s| {
            s.py_qualnames()
                .ends_with(&["run_generators", "consumer", "gen_producer"])
        },
        &mut problems,
    );
    check_shape(
        &stacks,
        "coro_inner",
        "the Python frames main -> coro_outer -> coro_inner, under run_coroutines",
        |s| {
            let names = s.py_qualnames();
            names.ends_with(&["main", "coro_outer", "coro_inner"])
                && names.contains(&"run_coroutines")
        },
        &mut problems,
    );
    if interp.minor >= 11 {
        check_shape(
            &stacks,
            "slow_key",
            "sort_caller, then at least one non-Python frame (sorted's C code or \
             [native code]), then slow_key",
            |s| {
                s.py_qualnames()
                    .ends_with(&["run_callbacks", "sort_caller", "slow_key"])
                    && frames_between(s, "sort_caller", "slow_key").is_some_and(|between| {
                        !between.is_empty() && !between.iter().any(|f| is_py_frame(f))
                    })
            },
            &mut problems,
        );
    } else {
        check_shape(
            &stacks,
            "slow_key",
            "the Python frames run_callbacks -> sort_caller -> slow_key",
            |s| {
                s.py_qualnames()
                    .ends_with(&["run_callbacks", "sort_caller", "slow_key"])
            },
            &mut problems,
        );
    }
    // Mixed stacks in the right order, root first: Python frames, then native
    // ones (os.read's C code, libc's read), then kernel ones.
    let syscall_stacks: Vec<FoldedStack> = stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| is_kernel_frame(f)))
        .cloned()
        .collect();
    check_shape(
        &syscall_stacks,
        "read_zeros",
        "run_syscalls -> read_zeros, then at least one native frame, then only kernel frames",
        |s| {
            let last_py = s.frames.iter().rposition(|f| is_py_frame(f));
            let first_kernel = s.frames.iter().position(|f| is_kernel_frame(f));
            s.py_qualnames().ends_with(&["run_syscalls", "read_zeros"])
                && match (last_py, first_kernel) {
                    (Some(p), Some(k)) => {
                        p + 1 < k && s.frames[k..].iter().all(|f| is_kernel_frame(f))
                    }
                    _ => false,
                }
        },
        &mut problems,
    );
    assert_no_problems(&problems, interp, &stacks, &out);
}

/// C code calling Python thousands of times a ms (`sum(map(tiny, …))`, `sorted(key=…)`):
/// every callback keeps its callers (`main -> run_map -> tiny`), the split between the two
/// callers is within ±3 points of the CPU time the workload measured, no stack under the frame
/// limit reads `[truncated]`, and a sample taken as the interpreter loop is entered for a
/// callback (3.11/3.12 publish the thread's new C frame before filling it) says its Python
/// frames were not read, where they would be, and the summary counts it.
pub(super) fn c_calling_back_into_python_keeps_its_callers(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-callbacks");
    let folded = tmp.join("callbacks.folded");
    let workload = start_py_workload(&interp.path, "py_callbacks.py", &["4"]);
    let (problems, stacks, out) = callback_session(workload, &folded, &interp.label);
    assert_no_problems(&problems, interp, &stacks, &out);
}
