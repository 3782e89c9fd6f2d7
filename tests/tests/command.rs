//! `spanprof profile [options] -- CMD ARGS…`: runs CMD, profiles it and the
//! children it starts until it exits, and exits with CMD's exit status.

use std::time::Duration;

use spanprof_tests::{
    args, assert_private_output, folded_count, folded_summary, folded_total, parse_folded,
    parse_summary, profiling_lock, read_folded, require_profiling, run_spanprof, spanprof_command,
    svg_title_and_subtitle, workload_path, Background, TempDir, RUN_TIMEOUT,
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

#[test]
fn command_killed_by_a_signal_gives_128_plus_the_signal() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-signal");
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "10s",
        "-o",
        tmp.join("out.folded"),
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(
        out.code(),
        128 + libc::SIGTERM,
        "exit status of a command killed by SIGTERM\n{out}"
    );
    assert!(!out.stderr.contains("panicked"), "{out}");
}

#[test]
fn outputs_are_written_when_the_duration_ends_before_the_command() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-outlives");
    let folded = tmp.join("out.folded");
    // Busy for 0.5 s (so the profile has samples), then off-CPU; 3 s in all.
    // The exit code 4 tells the command's status from spanprof's own.
    let script = format!(
        "{} 0.5; sleep 2.5; exit 4",
        workload_path("cpu_split").display()
    );
    let mut run = Background::spawn(spanprof_command(args![
        "profile",
        "--duration",
        "1s",
        "--frequency",
        "199",
        "-o",
        folded,
        "--",
        "sh",
        "-c",
        script,
    ]));
    // Poll for the output while spanprof runs.
    let appeared = loop {
        if folded.exists() {
            break Some(run.elapsed());
        }
        if run.try_wait().is_some() || run.elapsed() > RUN_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let still_running = run.try_wait().is_none();
    // Read at once: the file is complete when it appears (written atomically).
    let text = std::fs::read_to_string(&folded).unwrap_or_default();
    let out = run.finish(RUN_TIMEOUT);
    let appeared = appeared.unwrap_or_else(|| panic!("{folded:?} was not written\n{out}"));
    assert!(
        still_running,
        "spanprof had exited when {folded:?} appeared\n{out}"
    );
    assert!(
        appeared >= Duration::from_secs(1) && appeared < Duration::from_millis(2500),
        "{folded:?} appeared {appeared:.2?} after the start, expected when the 1 s session ends, \
         long before the 3 s command does\n{out}"
    );
    let stacks = parse_folded(&text).unwrap_or_else(|e| panic!("{e}: {text:?}\n{out}"));
    let alpha = folded_count(&stacks, |s| s.contains("hot_alpha"));
    assert!(
        alpha >= 30,
        "only {alpha} hot_alpha samples in the output as it appeared:\n{text}\n{out}"
    );
    assert_eq!(
        out.code(),
        4,
        "spanprof's exit status is not the command's\n{out}"
    );
    assert!(
        out.elapsed >= Duration::from_secs(3),
        "spanprof exited before the command ended\n{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&folded).unwrap(),
        text,
        "the output changed after it was first written"
    );
}

#[test]
fn sigterm_writes_the_outputs_and_is_passed_to_the_command() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-sigterm");
    let folded = tmp.join("out.folded");
    let mut run = Background::spawn(spanprof_command(args![
        "profile",
        "-o",
        folded,
        "--",
        workload_path("cpu_split"),
        "30",
    ]));
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    // Gather about a second of samples first.
    std::thread::sleep(Duration::from_secs(1));
    run.signal(libc::SIGTERM);
    let out = run.finish(RUN_TIMEOUT);
    assert_eq!(
        out.code(),
        128 + libc::SIGTERM,
        "spanprof should exit with the status of the command killed by SIGTERM\n{out}"
    );
    assert!(
        out.elapsed < Duration::from_secs(15),
        "SIGTERM did not end the session of a 30 s command early\n{out}"
    );
    assert_private_output(&folded);
    let alpha = folded_count(&read_folded(&folded), |s| s.contains("hot_alpha"));
    assert!(alpha >= 30, "only {alpha} hot_alpha samples\n{out}");
    // cpu_split printed its pid on the stdout it shares with spanprof; it is
    // gone (killed and reaped), not left running.
    let pid: u32 = out
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no cpu_split pid on stdout\n{out}"));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the command (pid {pid}) still exists after spanprof exited\n{out}"
    );
}

#[test]
fn a_child_that_execs_is_profiled_and_the_svg_names_the_command() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("cmd-exec");
    let folded = tmp.join("out.folded");
    let svg = tmp.join("out.svg");
    // sh forks (`; true` keeps it from exec'ing directly) and the child
    // exec's cpu_split.
    let script = format!("{} 2; true", workload_path("cpu_split").display());
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "30s",
        "--frequency",
        "199",
        "-o",
        folded,
        "-o",
        svg,
        "--",
        "sh",
        "-c",
        script,
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let top = folded_summary(&stacks, 10);
    let alpha = folded_count(&stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
    });
    let beta = folded_count(&stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_beta"])
    });
    assert!(
        alpha + beta >= 150,
        "only {alpha} + {beta} samples of the exec'd cpu_split:\n{top}\n{out}"
    );
    let alpha_share = 100.0 * alpha as f64 / (alpha + beta) as f64;
    assert!(
        (alpha_share - 75.0).abs() <= 10.0,
        "hot_alpha has {alpha_share:.1}% of the hot samples, expected 75 ± 10:\n{top}\n{out}"
    );

    // The flame graph's title is the command line; the subtitle the session.
    let total = folded_total(&stacks);
    let (title, subtitle) = svg_title_and_subtitle(&svg);
    assert_eq!(title, format!("spanprof: sh -c {script}"), "SVG title");
    assert!(
        subtitle.contains(" at 199 Hz, ") && subtitle.ends_with(&format!(", {total} samples")),
        "SVG subtitle {subtitle:?}, expected `… s at 199 Hz, {total} samples`"
    );
    // The summary counts the same samples and lists the exec'd cpu_split,
    // whose pid it printed on the stdout it shares with spanprof.
    let summary = parse_summary(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(summary.samples, total, "summary vs folded total\n{out}");
    let pid: u32 = out
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no cpu_split pid on stdout\n{out}"));
    assert!(
        summary.pids.contains(&pid),
        "the summary's processes miss cpu_split (pid {pid})\n{out}"
    );
}
