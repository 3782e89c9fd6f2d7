//! Session control: Ctrl-C ends a session early and still writes the outputs; progress is shown
//! as plain lines when stderr is not a terminal, and as a bar when it is.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use spanprof_tests::{
    folded_total, profiling_lock, read_folded, require_profiling, spanprof_bin, spanprof_command,
    Background, TempDir, Workload,
};

#[test]
fn ctrl_c_ends_the_session_and_writes_the_outputs() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("sigint");
    let workload = Workload::start("cpu_split", 30.0);
    let out = dir.join("early.folded");
    let svg = dir.join("early.svg");
    let mut cmd = spanprof_command(["profile", "--duration", "60s", "--pid"]);
    cmd.arg(workload.pid().to_string())
        .arg("-o")
        .arg(&out)
        .arg("-o")
        .arg(&svg);
    // NB: spanprof keeps a SIGINT it was started with ignored (a script's `&`): as from a
    // terminal, it starts with the default here, whatever the test runner was started with.
    // SAFETY: signal is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1500));
    run.signal(libc::SIGINT);
    // finish() fails the test if the 60 s session is not over within 30 s.
    let result = run.finish(Duration::from_secs(30));
    result.assert_success();
    let stderr = &result.stderr;
    assert!(stderr.contains("interrupted"), "{stderr}");
    let total = folded_total(&read_folded(&out));
    // About 1.5 s of one busy thread at 99 Hz.
    assert!((50..=300).contains(&total), "{total} samples:\n{stderr}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("hot_alpha"));
}

#[test]
fn plain_progress_lines_when_stderr_is_not_a_terminal() {
    require_profiling();
    let _lock = profiling_lock();
    let workload = Workload::start("cpu_split", 20.0);
    let out = spanprof_command(["profile", "--duration", "6s", "--pid"])
        .arg(workload.pid().to_string())
        .stderr(Stdio::piped())
        .output()
        .expect("spanprof runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("spanprof: profiling pid"), "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" of 6s, ") && l.ends_with(" samples"))
        .collect();
    assert_eq!(progress.len(), 1, "one line after 5 s:\n{stderr}");
    assert!(
        !stderr.contains('\r'),
        "no bar redraws in plain mode:\n{stderr}"
    );
}

#[test]
fn progress_bar_on_a_terminal() {
    require_profiling();
    let _lock = profiling_lock();
    let workload = Workload::start("cpu_split", 20.0);
    // script(1) gives spanprof a pseudo-terminal and records what it draws.
    let dir = TempDir::new("tty");
    let typescript = dir.join("typescript");
    let cmd = format!(
        "{} profile --duration 3s --pid {}",
        spanprof_bin().display(),
        workload.pid()
    );
    let status = Command::new("script")
        .args(["-q", "-e", "-c", &cmd])
        .arg(&typescript)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("script(1) from util-linux");
    let screen = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned();
    assert!(status.success(), "{screen}");
    // indicatif redraws the bar in place with the live sample count and the time left.
    assert!(screen.contains(" samples"), "{screen}");
    assert!(screen.contains("left)"), "{screen}");
    assert!(screen.contains("top functions"), "{screen}");
}

#[test]
fn sigterm_while_waiting_for_a_command_that_outlives_the_session_is_passed_on() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("sigterm-wait");
    let out = dir.join("done.folded");
    let mut cmd = spanprof_command(["profile", "--duration", "1s", "-o"]);
    cmd.arg(&out)
        .arg("--")
        .arg(spanprof_tests::workload_path("cpu_split"))
        .arg("30");
    let mut run = spanprof_tests::Background::spawn(cmd);
    run.wait_for_stderr("waiting for the command", Duration::from_secs(20));
    assert!(out.exists(), "outputs are written before the wait");
    run.signal(libc::SIGTERM);
    let result = run.finish(Duration::from_secs(25));
    // The command died of the SIGTERM spanprof passed on; spanprof reports its status.
    assert_eq!(result.code(), 128 + libc::SIGTERM, "{result}");
    assert!(folded_total(&read_folded(&out)) > 0);
}

/// The pprof file of a session ended early: decoded by the independent decoder, with samples.
fn samples_in(pprof: &std::path::Path) -> u64 {
    let decoded = spanprof_tests::decode_pprof(pprof);
    decoded["totals"]["samples"]
        .as_u64()
        .unwrap_or_else(|| panic!("no totals.samples in {decoded}"))
}

/// `spanprof profile … 2>&1 | head -1`: the reader of stderr goes after the first line, and
/// the session still writes its profile and exits 0 (a write to the closed pipe once panicked,
/// exit 101, no file).
#[test]
fn a_closed_stderr_does_not_stop_the_session() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("epipe");
    let workload = Workload::start("cpu_split", 30.0);
    let pprof = dir.join("piped.pb.gz");
    let script = format!(
        "'{}' profile --pid {} --duration 2s -F 199 -o '{}' 2>&1 | head -1; \
         echo \"spanprof exited ${{PIPESTATUS[0]}}\"",
        spanprof_bin().display(),
        workload.pid(),
        pprof.display()
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .stderr(Stdio::piped())
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("spanprof: profiling pid"),
        "head's line:\n{stdout}"
    );
    assert!(stdout.contains("spanprof exited 0"), "{stdout}");
    assert!(samples_in(&pprof) > 0, "{stdout}");
}

/// SIGHUP (the terminal of the session closed) ends the session as SIGTERM does: the outputs
/// are written with the samples taken so far, and spanprof exits 0.
#[test]
fn sighup_ends_the_session_and_writes_the_outputs() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("sighup");
    let workload = Workload::start("cpu_split", 60.0);
    let pprof = dir.join("hup.pb.gz");
    let folded = dir.join("hup.folded");
    let mut cmd = spanprof_command(["profile", "-F", "199", "--pid"]);
    cmd.arg(workload.pid().to_string())
        .arg("-o")
        .arg(&pprof)
        .arg("-o")
        .arg(&folded);
    // NB: spanprof keeps a SIGHUP it was started with ignored (`nohup`): here it starts with
    // the default, as under a terminal.
    // SAFETY: signal is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    // A third of a second of the workload's CPU time sampled, however loaded the machine.
    let stat = format!("/proc/{}/stat", workload.pid());
    let ticks = |s: &str| spanprof_tests::stat_cpu_ticks(s).expect("the workload's CPU time");
    let start = ticks(&stat);
    let tick_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    while ticks(&stat) < start + tick_hz / 3 {
        std::thread::sleep(Duration::from_millis(20));
    }
    run.signal(libc::SIGHUP);
    let result = run.finish(Duration::from_secs(30));
    result.assert_success();
    assert!(result.stderr.contains("interrupted"), "{result}");
    let total = folded_total(&read_folded(&folded));
    assert!(total > 0, "no samples in the folded file\n{result}");
    assert_eq!(
        samples_in(&pprof),
        total,
        "pprof and folded disagree\n{result}"
    );
}
