//! Kernel stacks: a syscall-heavy workload shows kernel frames (`_[k]`)
//! under its user function, and `--no-kernel` removes them.

use spanprof_tests::{
    folded_count, folded_summary, folded_total, is_kernel_frame, profile_pid, profiling_lock,
    read_folded, require_profiling, FoldedStack, TempDir, Workload,
};

fn profile_syscall_heavy(extra: &[&str]) -> (Vec<FoldedStack>, String) {
    let tmp = TempDir::new("kernel");
    let folded = tmp.join("syscall_heavy.folded");
    let workload = Workload::start("syscall_heavy", 10.0);
    let out = profile_pid(workload.pid(), "3s", 199, &[&folded], extra);
    out.assert_success();
    drop(workload);
    (read_folded(&folded), out.to_string())
}

#[test]
fn syscall_heavy_shows_kernel_frames_under_do_syscalls() {
    require_profiling();
    let _lock = profiling_lock();
    let (stacks, out) = profile_syscall_heavy(&[]);
    let top = folded_summary(&stacks, 15);
    let total = folded_total(&stacks);

    let user = folded_count(&stacks, |s| s.contains_seq(&["main", "do_syscalls"]));
    let with_kernel = folded_count(&stacks, |s| {
        s.frames
            .iter()
            .position(|f| f == "do_syscalls")
            .is_some_and(|i| s.frames[i + 1..].iter().any(|f| is_kernel_frame(f)))
    });
    assert!(
        user >= 200,
        "only {user} of {total} samples have main;do_syscalls:\n{top}\n{out}"
    );
    // Reading 1 MiB from /dev/zero is almost all kernel time.
    assert!(
        with_kernel as f64 >= 0.5 * user as f64,
        "only {with_kernel} of {user} do_syscalls samples have kernel frames under it:\n{top}"
    );
    // Kernel frames are the leaf end of a stack: once one appears, the rest are kernel too.
    for stack in &stacks {
        if let Some(first) = stack.frames.iter().position(|f| is_kernel_frame(f)) {
            assert!(
                stack.frames[first..].iter().all(|f| is_kernel_frame(f)),
                "user frame below a kernel frame: {}",
                stack.frames.join(";")
            );
        }
    }
}

#[test]
fn no_kernel_drops_kernel_frames() {
    require_profiling();
    let _lock = profiling_lock();
    let (stacks, out) = profile_syscall_heavy(&["--no-kernel"]);
    let top = folded_summary(&stacks, 15);
    let kernel = folded_count(&stacks, |s| s.frames.iter().any(|f| is_kernel_frame(f)));
    assert_eq!(kernel, 0, "--no-kernel left kernel frames:\n{top}");
    let user = folded_count(&stacks, |s| s.contains_seq(&["main", "do_syscalls"]));
    assert!(
        user >= 200,
        "with --no-kernel, only {user} samples have main;do_syscalls:\n{top}\n{out}"
    );
}
