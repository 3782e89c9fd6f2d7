//! Faults: overhead (see main.rs). With `--event cpu,offcpu` and records lost, the overhead
//! share was of `(on-CPU samples + lost records) × period`, as if every lost record were an
//! on-CPU sample: "0.99% of the targets' 581.96 s of CPU" for a target that used 21 s. The
//! share must be of the targets' real CPU time.
//!
//! The targets: `offcpu_pingpong` (two threads passing a byte through pipes, most of the CPU
//! time), released through its stdin once spanprof samples it, and three `offcpu_sleep`s
//! napping 1 ms at a time (an off-CPU record per nap, little CPU). spanprof is stopped
//! (SIGSTOP) for a while so that its ring buffer overflows with records of both kinds, most of
//! them off-CPU intervals. The truth is the targets' own CPU time: `wait4`'s rusage once
//! spanprof is done (the test is their parent and waits for them only then, so spanprof can
//! read their final `/proc/PID/stat` while they are zombies), less their `utime + stime` when
//! sampling began. spanprof's own figures (its in-kernel and own CPU time) come from its
//! summary line and from the daemon's metrics; the share they give must be within 20% of
//! `(BPF run time + spanprof's CPU) / the targets' CPU`. Each test also checks that the fault
//! is provoked: the lost records counted as on-CPU samples would miss the truth by more.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use spanprof_tests::{
    parse_summary, profiling_lock, require_root, spanprof_bin, spanprof_command, workload_path,
    Background, TempDir,
};

/// How far the share spanprof reports may be from the one computed with the target's rusage.
const TOLERANCE: f64 = 0.20;
/// Round trips of `offcpu_pingpong`, both threads pinned to CPU 0 (steady from run to run; left
/// to the scheduler the same work took 2.7 to 6.2 s of CPU here): about 2.4 s of CPU under
/// off-CPU profiling (every context switch runs a BPF program).
const ROUND_TRIPS: &str = "400000";
/// Sleepers beside it, each 3000 naps of 1 ms: every nap is longer than the 1 ms period, so
/// each is one off-CPU record, for little CPU.
const SLEEPERS: usize = 3;
/// The daemon's ring buffer is the default (16 MiB), not 8 KiB: more sleepers make sure most of
/// the records lost are off-CPU ones (with 3, 4368 records were lost for 4.02 s of the targets'
/// CPU on a slow host, too few to tell the two estimates apart; each sleeper adds about 2700
/// lost records in the 3 s stop for well under 0.1 s of CPU).
const DAEMON_SLEEPERS: usize = 8;
const NAPS: &str = "3000";

/// A workload the test started and waits for (`wait4`) only when spanprof is done; killed and
/// reaped on drop unless [`Target::reap`] did.
struct Target {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pid: u32,
}

impl Target {
    /// Starts `name` with `args`; it prints its pid first.
    fn start(name: &str, args: &[&str]) -> Target {
        let mut child = Command::new(workload_path(name))
            .args(args)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the workload's pid");
        let pid = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} printed {line:?}, not its pid"));
        // Its JSON line at the end must not block it: read it from a thread.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
        });
        Target {
            child: Some(child),
            stdin,
            pid,
        }
    }

    /// `offcpu_pingpong` (waiting for its go on stdin) and the sleepers (already napping).
    fn start_all(sleepers: usize) -> Vec<Target> {
        let mut all = vec![Target::start(
            "offcpu_pingpong",
            &["--cpu", "0", ROUND_TRIPS],
        )];
        for _ in 0..sleepers {
            all.push(Target::start("offcpu_sleep", &[NAPS, "1000"]));
        }
        all
    }

    fn pids(all: &[Target]) -> String {
        let pids: Vec<String> = all.iter().map(|t| t.pid.to_string()).collect();
        pids.join(",")
    }

    /// Its CPU time so far (`utime + stime`), in seconds.
    fn cpu_now(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // Fields 14 and 15, counted from state (field 3).
        (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / hz
    }

    /// Starts the round trips (closing stdin is the go too).
    fn go(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"x");
        }
    }

    /// Waits until it has exited (a zombie: not waited for yet), at most `timeout`.
    fn wait_exited(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
            let state = stat.rsplit_once(") ").map(|(_, s)| &s[..1]);
            if state == Some("Z") {
                return;
            }
            assert!(
                Instant::now() < end,
                "pid {} still runs after {timeout:?}",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for it and returns its CPU time (user + system, every thread), in seconds.
    fn reap(mut self) -> f64 {
        let child = self.child.take().expect("not reaped");
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid out-parameter.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child (not waited for by `Child`).
        let r = unsafe { libc::wait4(self.pid as libc::pid_t, &mut status, 0, &mut ru) };
        assert_eq!(r, self.pid as libc::pid_t, "wait4 pid {}", self.pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "pid {} exited with status {status:#x}",
            self.pid
        );
        // The child was waited for by wait4: `Child` must not wait again.
        std::mem::forget(child);
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        secs(ru.ru_utime) + secs(ru.ru_stime)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The targets' CPU time between `at_start` (their `cpu_now`, in order) and their end.
fn reap_all(all: Vec<Target>, at_start: &[f64]) -> f64 {
    all.into_iter()
        .zip(at_start)
        .map(|(t, start)| t.reap() - start)
        .sum()
}

/// The figures of spanprof's `spanprof overhead while sampling: …` line.
#[derive(Debug)]
struct CostLine {
    kernel_ms: f64,
    own_ms: f64,
    share: f64,
    target_s: f64,
    source: String,
}

/// Parses `…; 812.3 ms and 95.1 ms in all, 1.20% of the targets' 2.95 s of CPU (from /proc)`.
fn cost_line(stderr: &str) -> CostLine {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("spanprof overhead while sampling: "))
        .unwrap_or_else(|| panic!("no overhead line:\n{stderr}"));
    let cut = |s: &'static str, at: &str| -> (&'static str, &'static str) {
        s.split_once(at)
            .unwrap_or_else(|| panic!("overhead line {line:?}: no {at:?}"))
    };
    let line: &'static str = Box::leak(line.to_string().into_boxed_str());
    let (_, rest) = cut(line, "; ");
    let (kernel, rest) = cut(rest, " ms and ");
    let (own, rest) = cut(rest, " ms in all, ");
    let (share, rest) = cut(rest, "% of the targets' ");
    let (target, rest) = cut(rest, " s of CPU (");
    let source = rest.split(')').next().unwrap_or_default().to_string();
    let num = |s: &str| {
        s.parse::<f64>()
            .unwrap_or_else(|_| panic!("overhead line {line:?}: {s:?} is not a number"))
    };
    CostLine {
        kernel_ms: num(kernel),
        own_ms: num(own),
        share: num(share) / 100.0,
        target_s: num(target),
        source,
    }
}

/// A session of `-e cpu,offcpu` on the targets, stopped 1.5 s with an 8 KiB ring buffer: the
/// share in its summary is of the CPU time the targets really used.
#[test]
fn session_share_with_lost_offcpu_records_is_of_the_targets_cpu() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("fault-overhead");
    let mut targets = Target::start_all(SLEEPERS);
    let out = dir.join("out.folded");
    let mut cmd = spanprof_command([
        "profile",
        "--event",
        "cpu,offcpu",
        "--frequency",
        "1000",
        // Frame pointers: small records, so the small ring is allowed.
        "--unwind",
        "fp",
        "--ring-buffer-size",
        "8192",
        "--duration",
        "60s",
        "--pid",
        &Target::pids(&targets),
        "-o",
    ]);
    cmd.arg(&out);
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(30));
    let at_start: Vec<f64> = targets.iter().map(Target::cpu_now).collect();
    targets[0].go();
    std::thread::sleep(Duration::from_millis(300));
    run.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1500));
    run.signal(libc::SIGCONT);
    // The session ends when the targets exit (their zombies are read before the test reaps
    // them).
    let result = run.finish(Duration::from_secs(90));
    result.assert_success();
    let truth = reap_all(targets, &at_start);
    let stderr = &result.stderr;
    let summary = parse_summary(stderr).unwrap_or_else(|e| panic!("{e}\n{stderr}"));
    let cost = cost_line(stderr);
    let spent = (cost.kernel_ms + cost.own_ms) / 1e3;
    let expected = spent / truth;
    // What the old estimate gave: every lost record an on-CPU sample of 1 ms.
    let sampled = (summary.samples + summary.lost) as f64 / 1e3;
    let report = format!(
        "target CPU {truth:.3} s (rusage), spanprof says {:.3} s ({}); spanprof {:.1} ms in the \
         kernel + {:.1} ms own = {:.2}% of the truth, reported {:.2}%; {} on-CPU samples kept, \
         {} records lost (the samples' estimate would be {sampled:.3} s)\n{stderr}",
        cost.target_s,
        cost.source,
        cost.kernel_ms,
        cost.own_ms,
        expected * 100.0,
        cost.share * 100.0,
        summary.samples,
        summary.lost,
    );
    println!("{report}");
    assert!(cost.kernel_ms > 0.0, "in-kernel time not counted: {report}");
    assert_eq!(cost.source, "from /proc", "{report}");
    // The fault is there: many records lost, enough that a share of the samples' estimate
    // (lost records counted as on-CPU samples) misses the truth by more than the tolerance.
    assert!(summary.lost >= 500, "too few records lost: {report}");
    assert!(
        (truth / sampled - 1.0).abs() > TOLERANCE,
        "the samples' estimate is close to the truth: the test does not provoke the fault: \
         {report}"
    );
    assert!(
        (cost.share / expected - 1.0).abs() <= TOLERANCE,
        "share off by more than {:.0}%: {report}",
        TOLERANCE * 100.0
    );
    assert!(
        (cost.target_s / truth - 1.0).abs() <= TOLERANCE,
        "target CPU off: {report}"
    );
}

/// A free local TCP port (free when this returns; the daemon binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `spanprof daemon` with its metrics port (the few lines of tests/tests/daemon.rs's
/// helper this test needs).
struct Daemon {
    process: Background,
    metrics_port: u16,
}

impl Daemon {
    fn start(dir: &TempDir, config: &str) -> Daemon {
        let metrics_port = free_port();
        let path = dir.join("spanprof.toml");
        std::fs::write(
            &path,
            format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
        .unwrap();
        let mut cmd = spanprof_command(["daemon", "--config"]);
        cmd.arg(&path);
        let mut process = Background::spawn(cmd);
        process.wait_for_stderr("spanprof daemon: profiling", Duration::from_secs(60));
        Daemon {
            process,
            metrics_port,
        }
    }

    /// The metrics, by name.
    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).expect("metrics port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(head.contains(" 200 "), "{head}");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }
}

/// The daemon, `cpu,offcpu` at 1000 Hz with 8 s windows, stopped 3 s while the targets run in
/// its first window: the window's overhead ratio is of the CPU time the targets really used.
#[test]
fn daemon_window_share_with_lost_offcpu_records_is_of_the_targets_cpu() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("fault-overhead-daemon");
    let mut targets = Target::start_all(DAEMON_SLEEPERS);
    // Nothing listens on port 9: the windows wait in the queue; the metrics are what counts.
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 1000\nevents = [\"cpu\", \"offcpu\"]\nwindow = \"8s\"\n\
             [scope]\npids = [{}]\n[export]\nprotocol = \"http/protobuf\"\n\
             endpoint = \"http://127.0.0.1:9\"\ntimeout = \"1s\"\n",
            Target::pids(&targets)
        ),
    );
    let at_start: Vec<f64> = targets.iter().map(Target::cpu_now).collect();
    targets[0].go();
    std::thread::sleep(Duration::from_millis(300));
    daemon.process.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    daemon.process.signal(libc::SIGCONT);
    for t in &targets {
        t.wait_exited(Duration::from_secs(60));
    }
    let windows = daemon.metrics()["spanprof_windows_total"];
    assert_eq!(
        windows, 0.0,
        "the targets outlived the first window (a slow run): its figures are not of their whole \
         run"
    );
    // The first window closes 8 s after the start, with the targets' whole run in it.
    let end = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = daemon.metrics();
        if m.get("spanprof_windows_total").copied().unwrap_or(0.0) >= 1.0 {
            break m;
        }
        assert!(
            Instant::now() < end,
            "no window closed: {m:?}\n{}",
            daemon.process.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(m["spanprof_windows_total"], 1.0, "{m:?}");
    let truth = reap_all(targets, &at_start);
    daemon.process.signal(libc::SIGTERM);
    let limit = daemon.process.elapsed() + Duration::from_secs(60);
    let stderr = daemon.process.finish(limit).stderr;

    let get = |name: &str| {
        *m.get(name)
            .unwrap_or_else(|| panic!("no metric {name}: {m:?}\n{stderr}"))
    };
    let records = get("spanprof_samples_total") + get("spanprof_samples_lost_total");
    let kernel = get("spanprof_window_kernel_seconds_per_sample") * records;
    let own = get("spanprof_window_cpu_seconds_per_sample") * records;
    let ratio = get("spanprof_window_overhead_ratio");
    let target_cpu = get("spanprof_window_target_cpu_seconds");
    let bpf = get("spanprof_bpf_run_seconds_total");
    let expected = (kernel + own) / truth;
    let report = format!(
        "target CPU {truth:.3} s (rusage), the window says {target_cpu:.3} s; {records} records \
         ({} lost): {kernel:.3} s in the kernel (BPF statistics: {bpf:.3} s in all) + {own:.3} s \
         own = {:.2}% of the truth, ratio {:.2}%\n{m:?}\n{stderr}",
        get("spanprof_samples_lost_total"),
        expected * 100.0,
        ratio * 100.0
    );
    println!("{report}");
    // The fault is there: with the lost records alone counted as on-CPU samples of 1 ms, the
    // ratio would be too low by more than the tolerance.
    let lost = get("spanprof_samples_lost_total");
    assert!(
        lost >= 500.0 && 1.0 - truth / (lost / 1e3) > TOLERANCE,
        "too few records lost: {report}"
    );
    // The kernel's own figure: the window's in-kernel time is nearly all there was so far.
    assert!(
        kernel > 0.0 && (kernel / bpf - 1.0).abs() <= 0.1,
        "in-kernel time per sample × samples is not the BPF run time: {report}"
    );
    assert!(
        (target_cpu / truth - 1.0).abs() <= TOLERANCE,
        "target CPU off: {report}"
    );
    assert!(
        (ratio / expected - 1.0).abs() <= TOLERANCE,
        "overhead ratio off by more than {:.0}%: {report}",
        TOLERANCE * 100.0
    );
}
