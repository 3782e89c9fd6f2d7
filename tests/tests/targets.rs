//! Choosing what to profile: several `--pid`s in one session, and
//! `--children` following the processes a `--pid` target starts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::{
    args, decode_pprof, folded_count, folded_summary, folded_total, parse_summary, profiling_lock,
    read_folded, require_profiling, run_spanprof, spanprof_command, Background, FoldedStack,
    RunOutput, TempDir, Workload, RUN_TIMEOUT,
};

/// The number label `key` of a decoded pprof sample.
fn num_label(sample: &Value, key: &str) -> u64 {
    sample["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .find(|l| l["key"] == key)
        .and_then(|l| l["num"].as_u64())
        .unwrap_or_else(|| panic!("sample without a number label {key}: {sample}"))
}

#[test]
fn two_pids_in_one_session() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("two-pids");
    let pprof = tmp.join("out.pb.gz");
    let folded = tmp.join("out.folded");
    let a = Workload::start("cpu_split", 10.0);
    let b = Workload::start("cpu_split", 10.0);
    let mut pids = vec![u64::from(a.pid()), u64::from(b.pid())];
    pids.sort_unstable();
    let out = run_spanprof(args![
        "profile",
        "--pid",
        format!("{},{}", a.pid(), b.pid()),
        "--duration",
        "2s",
        "--frequency",
        "199",
        "-o",
        pprof,
        "-o",
        folded,
    ]);
    drop((a, b));
    out.assert_success();

    // Samples per process.id label in the pprof.
    let prof = decode_pprof(&pprof);
    let mut per_pid: BTreeMap<u64, u64> = BTreeMap::new();
    for sample in prof["samples"].as_array().expect("samples") {
        let pid = num_label(sample, "process.id");
        // Both workloads are single-threaded.
        assert_eq!(num_label(sample, "thread.id"), pid, "{sample}");
        *per_pid.entry(pid).or_default() += sample["values"][0].as_u64().expect("value");
    }
    assert_eq!(
        per_pid.keys().copied().collect::<Vec<_>>(),
        pids,
        "process.id labels of the pprof samples: {per_pid:?}\n{out}"
    );
    // 2 s at 199 Hz is ~400 samples of each busy process on an idle machine.
    for (pid, n) in &per_pid {
        assert!(
            *n >= 50,
            "only {n} samples of pid {pid}: {per_pid:?}\n{out}"
        );
    }

    let summary = parse_summary(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let total = folded_total(&read_folded(&folded));
    assert_eq!(summary.samples, total, "summary vs folded total\n{out}");
    assert_eq!(
        per_pid.values().sum::<u64>(),
        total,
        "pprof vs folded total\n{out}"
    );
    assert_eq!(summary.processes, 2, "{out}");
    assert_eq!(
        summary
            .pids
            .iter()
            .map(|&p| u64::from(p))
            .collect::<Vec<_>>(),
        pids,
        "the summary's processes\n{out}"
    );
}

/// Profiles `forker 2.5 usr1` with `--pid` (and `--children` when
/// `children`): once spanprof says it is profiling, SIGUSR1 makes forker
/// fork a child that spins in `child_work` until 2.5 s are up, so the child
/// is born after spanprof attached. Returns the folded stacks and the run.
fn profile_forker(children: bool) -> (Vec<FoldedStack>, RunOutput) {
    require_profiling();
    let tmp = TempDir::new("forker");
    let folded = tmp.join("out.folded");
    let forker = Workload::start_with_args("forker", 2.5, &["usr1"]);
    let mut args = args![
        "profile",
        "--pid",
        forker.pid().to_string(),
        "--duration",
        "6s",
        "--frequency",
        "199",
        "-o",
        folded,
    ];
    if children {
        args.push("--children".into());
    }
    let mut run = Background::spawn(spanprof_command(args));
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    // SAFETY: kill(2) on the workload, our child, which is not reaped yet.
    let rc = unsafe { libc::kill(forker.pid() as libc::pid_t, libc::SIGUSR1) };
    assert_eq!(rc, 0, "cannot signal forker");
    let out = run.finish(RUN_TIMEOUT);
    let status = forker.wait();
    assert!(status.success(), "forker: {status}\n{out}");
    out.assert_success();
    (read_folded(&folded), out)
}

#[test]
fn children_flag_follows_a_child_born_during_the_session() {
    let _lock = profiling_lock();
    let (stacks, out) = profile_forker(true);
    let child = folded_count(&stacks, |s| s.contains_seq(&["main", "child_work"]));
    // The child spins for over 2 s: ~450 samples at 199 Hz.
    assert!(
        child >= 150,
        "only {child} samples of the child's main;child_work with --children:\n{}\n{out}",
        folded_summary(&stacks, 10)
    );
}

#[test]
fn without_children_flag_a_child_is_not_profiled() {
    let _lock = profiling_lock();
    let (stacks, out) = profile_forker(false);
    let child = folded_count(&stacks, |s| s.contains("child_work"));
    assert_eq!(
        child,
        0,
        "child_work samples without --children:\n{}\n{out}",
        folded_summary(&stacks, 10)
    );
    // The session lasted until forker exited, while its child ran.
    assert!(
        out.elapsed >= Duration::from_secs(2),
        "the session ended before the child's work did\n{out}"
    );
}

/// CPU ticks (utime + stime) of a process now.
fn ticks(pid: u32) -> u64 {
    spanprof_tests::stat_cpu_ticks(&format!("/proc/{pid}/stat")).expect("the worker's stat")
}

/// A pre-fork server (`py_prefork.py`: a master that forked two workers before the session,
/// one busy all the time and one half the time): `--pid MASTER --children` profiles both
/// workers, each with its share of the samples within ±5 points of its share of their CPU
/// time (read from /proc over the session).
#[test]
fn children_forked_before_the_session_are_profiled() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("prefork");
    let pprof = tmp.join("out.pb.gz");
    let python = spanprof_tests::pyenv_python(11);
    let mut master = Background::spawn({
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(spanprof_tests::py_workload_source("py_prefork.py"))
            .arg("30");
        cmd
    });
    let line = master.wait_for_stderr("workers ", Duration::from_secs(30));
    let workers: Vec<u32> = line
        .trim()
        .rsplit("workers ")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().expect("a worker pid"))
        .collect();
    assert_eq!(workers.len(), 2, "{line:?}");
    let mut session = Background::spawn(spanprof_command(args![
        "profile",
        "--pid",
        master.pid().to_string(),
        "--children",
        "--duration",
        "3s",
        "-F",
        "199",
        "-o",
        &pprof,
    ]));
    // The workers' CPU time over the session, from when it says it samples.
    session.wait_for_stderr("spanprof: profiling", Duration::from_secs(30));
    let before: Vec<u64> = workers.iter().map(|&w| ticks(w)).collect();
    session.wait_for_stderr("spanprof: symbolizing", Duration::from_secs(60));
    let after: Vec<u64> = workers.iter().map(|&w| ticks(w)).collect();
    let out = session.finish(RUN_TIMEOUT);
    master.signal(libc::SIGKILL);
    for &w in &workers {
        // SAFETY: kill(2) on the workers this test started.
        unsafe { libc::kill(w as i32, libc::SIGKILL) };
    }
    out.assert_success();
    assert!(
        out.stderr.contains("--children: also 2 processes"),
        "the start line names the workers\n{out}"
    );
    let prof = decode_pprof(&pprof);
    let mut per_pid: BTreeMap<u64, u64> = BTreeMap::new();
    for sample in prof["samples"].as_array().expect("samples") {
        *per_pid.entry(num_label(sample, "process.id")).or_default() +=
            sample["values"][0].as_u64().expect("value");
    }
    let cpu: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let cpu_total = cpu.iter().sum::<u64>().max(1) as f64;
    let sampled: Vec<u64> = workers
        .iter()
        .map(|&w| per_pid.get(&u64::from(w)).copied().unwrap_or(0))
        .collect();
    let sampled_total = sampled.iter().sum::<u64>().max(1) as f64;
    for (i, &w) in workers.iter().enumerate() {
        let truth = 100.0 * cpu[i] as f64 / cpu_total;
        let share = 100.0 * sampled[i] as f64 / sampled_total;
        assert!(
            sampled[i] > 0 && (share - truth).abs() <= 5.0,
            "worker {w}: {} samples, {share:.1}% of the workers' samples; {truth:.1}% of their \
             CPU time ({cpu:?} ticks)\nsamples per pid: {per_pid:?}\n{out}",
            sampled[i]
        );
    }
}
