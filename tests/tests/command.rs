//! `spanprof profile [options] -- CMD ARGS…`: runs CMD, profiles it and the
//! children it starts until it exits, and exits with CMD's exit status.

use std::time::Duration;

use spanprof_tests::{
    args, assert_private_output, folded_count, folded_summary, profiling_lock, read_folded,
    require_profiling, run_spanprof, workload_path, TempDir,
};

#[test]
fn exit_status_of_the_command_propagates() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-exit");
    let folded = tmp.join("out.folded");
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "10s",
        "-o",
        folded,
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(out.code(), 3, "exit status of `sh -c 'exit 3'`\n{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        out.elapsed < Duration::from_secs(8),
        "spanprof did not stop when the command exited\n{out}"
    );
}

#[test]
fn command_is_profiled_until_it_exits() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-run");
    let folded = tmp.join("out.folded");
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "30s",
        "--frequency",
        "199",
        "-o",
        folded,
        "--",
        workload_path("cpu_split"),
        "2",
    ]);
    out.assert_success();
    assert!(
        out.elapsed < Duration::from_secs(20),
        "spanprof did not stop when the command exited\n{out}"
    );
    assert_private_output(&folded);
    let stacks = read_folded(&folded);
    let alpha = folded_count(&stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
    });
    assert!(
        alpha >= 100,
        "only {alpha} samples of main;dispatcher;hot_alpha:\n{}\n{out}",
        folded_summary(&stacks, 10)
    );
}

#[test]
fn children_of_the_command_are_profiled() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-fork");
    let folded = tmp.join("out.folded");
    // forker forks its child 200 ms after starting; the child spins in
    // child_work until 2 s are up while the parent waits off-CPU.
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "30s",
        "--frequency",
        "199",
        "-o",
        folded,
        "--",
        workload_path("forker"),
        "2",
    ]);
    out.assert_success();
    assert_private_output(&folded);
    let stacks = read_folded(&folded);
    let child = folded_count(&stacks, |s| s.contains_seq(&["main", "child_work"]));
    assert!(
        child >= 100,
        "only {child} samples of the forked child's main;child_work:\n{}\n{out}",
        folded_summary(&stacks, 10)
    );
}

#[test]
fn format_flag_overrides_the_extension() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-format");
    let output = tmp.join("stacks.txt");
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "30s",
        "--format",
        "folded",
        "-o",
        output,
        "--",
        workload_path("cpu_split"),
        "1",
    ]);
    out.assert_success();
    assert_private_output(&output);
    let stacks = read_folded(&output);
    assert!(
        stacks.iter().any(|s| s.contains("hot_alpha")),
        "no hot_alpha in the --format folded output:\n{}",
        folded_summary(&stacks, 10)
    );
}
