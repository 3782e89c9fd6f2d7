//! Mixed native and Python stacks through an interpreter built with frame pointers (CPython
//! 3.11 built by `cargo xtask deps` with `-fno-omit-frame-pointer`, as Fedora and Ubuntu 24.04
//! ship theirs): each native `_PyEval_EvalFrameDefault` frame is replaced by the Python frames
//! it runs, and the C frames between Python frames stay, named.
//!
//! pyenv's and Debian's builds have no frame pointers; with them the native stack cannot be
//! followed through the interpreter (`tests/tests/python/` checks what spanprof does then).

use std::path::PathBuf;

use spanprof_tests::{
    folded_summary, is_kernel_frame, is_py_frame, missing_prerequisite, parse_py_frame,
    profile_pid, profiling_lock, read_folded, require_root, spanprof_bin, start_py_workload,
    workspace_root, FoldedStack, TempDir,
};

/// `SPANPROF_FP_PYTHON`, else `target/fp-python/bin/python3.11`.
#[track_caller]
fn fp_python() -> PathBuf {
    let bin = match std::env::var_os("SPANPROF_FP_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => workspace_root().join("target/fp-python/bin/python3.11"),
    };
    if !bin.is_file() {
        missing_prerequisite(
            &format!("the frame-pointer CPython at {}", bin.display()),
            "`cargo xtask deps` (builds CPython 3.11 with frame pointers into target/fp-python)",
        );
    }
    bin
}

/// Profiles `py_shapes.py` under the frame-pointer interpreter for 3 s.
fn profile_shapes() -> Vec<FoldedStack> {
    require_root();
    spanprof_bin();
    let python = fp_python();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-fp");
    let folded = tmp.join("shapes.folded");
    let workload = start_py_workload(&python, "py_shapes.py", &["4.5"]);
    // Every frame: the checks follow the native stack through the interpreter.
    let out = profile_pid(workload.pid(), "3s", 199, &[&folded], &["--view", "full"]);
    drop(workload);
    out.assert_success();
    read_folded(&folded)
}

fn qualname(frame: &str) -> Option<&str> {
    parse_py_frame(frame).map(|p| p.qualname)
}

/// The frames strictly between the Python frames `caller` and `callee`, in that order.
fn between<'a>(stack: &'a FoldedStack, caller: &str, callee: &str) -> Option<&'a [String]> {
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

/// Samples (count) whose innermost Python frame is `leaf`, and those of them that satisfy `ok`.
fn count_of_leaf(
    stacks: &[FoldedStack],
    leaf: &str,
    ok: impl Fn(&FoldedStack) -> bool,
) -> (u64, u64) {
    let of_leaf = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some_and(|f| f.qualname == leaf));
    of_leaf.fold((0, 0), |(n, good), s| {
        (n + s.count, good + if ok(s) { s.count } else { 0 })
    })
}

#[test]
fn c_frames_between_python_frames_are_named() {
    let stacks = profile_shapes();
    // sorted() calls the key function from C: list.sort's C frames sit between the two.
    let (n, good) = count_of_leaf(&stacks, "slow_key", |s| {
        between(s, "sort_caller", "slow_key").is_some_and(|mid| {
            mid.iter().any(|f| !is_py_frame(f) && f.contains("sort"))
                && mid.iter().all(|f| f != "[native code]")
        })
    });
    assert!(
        n >= 20 && good as f64 >= 0.9 * n as f64,
        "{good} of {n} samples of slow_key have list.sort's C frames between sort_caller and \
         slow_key:\n{}",
        folded_summary(&stacks, 12)
    );
    // 3.11 resumes a generator iterated by a `for` loop through C (`gen_iternext`; 3.12
    // does it inline): the real C frames, not a placeholder, are between the two.
    let (n, good) = count_of_leaf(&stacks, "gen_producer", |s| {
        between(s, "consumer", "gen_producer").is_some_and(|mid| {
            mid.iter().any(|f| f.starts_with("gen_"))
                && mid.iter().all(|f| !is_py_frame(f) && f != "[native code]")
        })
    });
    assert!(
        n >= 20 && good as f64 >= 0.9 * n as f64,
        "{good} of {n} samples of gen_producer have the generator's C frames (and only them) \
         between consumer and gen_producer:\n{}",
        folded_summary(&stacks, 12)
    );
}

#[test]
fn native_frames_root_and_leaf_surround_the_python_frames() {
    let stacks = profile_shapes();
    // The interpreter's own start-up frames are above <module>: the whole native stack is kept.
    let with_main = |s: &FoldedStack| {
        let first_py = s.frames.iter().position(|f| is_py_frame(f));
        first_py.is_some_and(|i| {
            s.frames[..i]
                .iter()
                .any(|f| f == "main" || f == "Py_BytesMain")
        })
    };
    let total: u64 = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some())
        .map(|s| s.count)
        .sum();
    let rooted: u64 = stacks
        .iter()
        .filter(|s| with_main(s))
        .map(|s| s.count)
        .sum();
    assert!(
        total >= 100 && rooted as f64 >= 0.9 * total as f64,
        "{rooted} of {total} samples with Python frames have `main` above them:\n{}",
        folded_summary(&stacks, 12)
    );
    // A system call from Python: Python, then the C functions of os.read, then the kernel.
    let (n, good) = count_of_leaf(&stacks, "read_zeros", |s| {
        let py = s.frames.iter().rposition(|f| is_py_frame(f));
        let kernel = s.frames.iter().position(|f| is_kernel_frame(f));
        match (py, kernel) {
            (Some(p), Some(k)) if p < k => s.frames[p + 1..k].iter().any(|f| f.contains("read")),
            _ => false,
        }
    });
    assert!(
        n >= 20 && good as f64 >= 0.8 * n as f64,
        "{good} of {n} samples of read_zeros go Python -> os.read's C frames -> kernel:\n{}",
        folded_summary(&stacks, 12)
    );
}
