//! `cargo xtask bench`: spanprof's overhead, side by side with `perf record -g` on a native
//! target and with `py-spy record` on a Python target, the in-kernel cost of reading span
//! contexts, and user stacks without frame pointers (`.eh_frame` unwinding against
//! `perf record --call-graph dwarf`), in one run.
//!
//! Method (also in BENCHMARKS.md):
//! - Targets do a fixed amount of work and are started gated: they print their pid and wait for
//!   a byte on stdin, so the profiler attaches first. The native target is `fixed_work`
//!   (frame-pointer C); the Python target is `tests/workloads/bench_py_stack.py`, a pure-Python
//!   loop run at a Python stack depth of exactly 50 frames (`<module>` → f0 → … → f48).
//! - For each target the configurations run interleaved, `--rounds` times each, with the order
//!   reversed every other round: the target alone, under `spanprof profile --pid`, and under the
//!   reference profiler (`perf record -g --pid`, or `py-spy record --pid` in its default
//!   blocking mode), all at 99 Hz. The target's own CPU time (user + system, from `wait4`) is
//!   measured in each; the slowdown is the median of the per-round ratios (profiled / alone),
//!   because these VMs vary ±25% run to run.
//! - The profiler's own CPU time and peak RSS come from `wait4` on the profiler process; divided
//!   by the samples it reports, that is the user-space cost per sample. spanprof's samples come
//!   from its summary, perf's from its closing line, py-spy's are the counts of its
//!   `--format raw` (folded) output summed.
//! - In-kernel cost: with `kernel.bpf_stats_enabled=1`, the run_time_ns and run_cnt counters of
//!   spanprof's sampling program (what `bpftool prog show` prints, read from the fdinfo of the
//!   spawned spanprof's own program fd, so a concurrent spanprof is never mixed in) are read
//!   three times per run: once spanprof is attached, 1 s later just before the target is
//!   released, and right after the target exits. The first interval has no target sample (the
//!   target is blocked on stdin): it prices the runs for other processes. The second holds every
//!   target sample spanprof reports; its time net of the other runs (priced by the first
//!   interval) divided by the target samples is the in-kernel cost per target sample. The
//!   counters are summed over the rounds before dividing. On the Python target spanprof then
//!   runs alone at 999 Hz for the same figure over ten times as many samples.
//! - Span reading: `tests/workloads/bench_py_span.py`, the Python target's 50-frame work run
//!   inside an OpenTelemetry span and an OSProfiler trace, under spanprof with span reading and
//!   with `--no-spans`, at 99 Hz and at 999 Hz, the four interleaved in each round (order
//!   reversed every other round). The same in-kernel figure per target sample is taken for each;
//!   the difference with and without spans is the cost of reading the span contexts. The
//!   summary's `spans:` line and the span-grouped folded output (`--group-by span`) prove the
//!   spans were read: the samples of the work must carry both span contexts. `--span-kinds otel`
//!   or `osprofiler` sets up one context alone; `published` sets up both after
//!   `spanprof_context.install()`, so spanprof reads the OTEP 4947 thread context record the
//!   process publishes (the `spans:` line's `; N read from the thread context the process
//!   publishes`) instead of the libraries' objects. Each kind has its own block in BENCHMARKS.md
//!   (`bench-spans`, `bench-spans-otel`, `bench-spans-osprofiler`, `bench-spans-published`).
//! - Unwinding (the `unwind` block): `cpu_split_nofp` (cpu_split built without frame pointers,
//!   main → dispatcher → hot_alpha 75% / hot_beta 25%) alone, under `spanprof --unwind dwarf`,
//!   `spanprof --unwind fp` and `perf record --call-graph dwarf`, all at [`UNWIND_HZ`],
//!   interleaved. cpu_split runs for a time and is not gated, so it is started behind a shell
//!   gate that execs it on the release ([`GATE`]); the profilers attach to the shell's pid and
//!   follow the exec. Completeness (the share of the work's samples whose user stack ends
//!   main;dispatcher;hot_*) and depth come from spanprof's folded output and from `perf script`
//!   folded here ([`fold_perf_script`]); the costs are spanprof's in-kernel time and own CPU per
//!   sample, `perf record`'s and `perf script`'s own CPU per sample and perf.data bytes per
//!   sample; the slowdown is the target's user CPU time alone / profiled (its work in the fixed
//!   time).
//!
//! - Off-CPU (the `bench-offcpu` block): `offcpu_pingpong` (two threads passing a byte through
//!   pipes, a fixed number of round trips, gated) alone, under `spanprof profile --event offcpu`
//!   and under `perf record -e sched:sched_switch -g`, interleaved: the slowdown of its loop, and
//!   the in-kernel time per run of spanprof's `on_switch` (every context switch of the machine)
//!   and `on_sys_exit` (every system call exit) programs, found by name among the spawned
//!   spanprof's program fds and read like the sampling program above; method in its block.
//! - Allocations (the `bench-alloc` block): `tests/workloads/py_alloc.py --bench` alone, under
//!   `spanprof profile --event alloc` (also `--event heap` and `--alloc-rate 1`) and under
//!   `memray run`, interleaved; method in [`crate::bench_alloc`] and in its block.
//! - Daemon (the `bench-daemon` block): `spanprof daemon` host-wide at 19 Hz beside two busy
//!   Python processes, its own CPU and RSS, against `perf record -F 19 -a -g`; method in
//!   [`crate::bench_daemon`] and in BENCHMARKS.md.
//!
//! `--only native|python|spans|unwind|offcpu|alloc|daemon` runs one part. Each round's raw
//! measurements go to `target/bench/{native,python,spans,unwind,offcpu,alloc,daemon}_rounds.txt`
//! (`spans_KIND_rounds.txt` for a `--span-kinds` other than both).
//!
//! The results are printed and written between the markers of BENCHMARKS.md.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::run::step;

/// Which parts of the benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    All,
    Native,
    Python,
    Spans,
    Unwind,
    Offcpu,
    /// `--only alloc`: allocation profiling against memray ([`crate::bench_alloc`]).
    Alloc,
    /// `--only daemon`: the host-wide daemon's own cost ([`crate::bench_daemon`]).
    Daemon,
    /// `--only sid`: the 50-frame Python stack under Debian sid's 3.14 and 3.15, in a chroot.
    Sid,
}

/// What to run and how much.
#[derive(Debug)]
pub struct Config {
    pub rounds: usize,
    pub part: Part,
    /// Rounds of `fixed_work`.
    pub work: u64,
    /// Units (100 000 loop iterations each) of `bench_py_stack.py`.
    pub py_work: u64,
    /// Seconds `cpu_split_nofp` runs in each run of the unwind part.
    pub unwind_seconds: u64,
    pub python: PathBuf,
    pub py_spy: PathBuf,
    /// `target/span-libs`: the tracing libraries of each CPython 3.X in `3.X` (`cargo xtask
    /// deps`), for the span target.
    pub span_libs: PathBuf,
    /// The span contexts the span target sets up: both, or one alone to see what each costs.
    pub span_kinds: SpanKinds,
    /// Units of `py_alloc.py --bench` work in each run of the alloc part.
    pub alloc_units: u64,
    /// Seconds measured in each run of the daemon part (after its warm-up).
    pub daemon_seconds: u64,
    /// The venv's interpreter (`cargo xtask deps`), for the daemon part's OTLP receiver.
    pub venv_python: PathBuf,
}

/// Which span contexts `bench_py_span.py` sets up (its `BENCH_SPAN_KINDS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKinds {
    /// An OpenTelemetry span and an OSProfiler trace, both walked (the `bench-spans` block).
    Both,
    /// Only an OpenTelemetry span (OSProfiler not imported).
    Otel,
    /// Only an OSProfiler trace (OpenTelemetry not imported).
    Osprofiler,
    /// Both, published by `spanprof_context.install()` (OTEP 4947 thread context): spanprof
    /// reads the thread's record instead of the libraries' objects.
    Published,
}

impl SpanKinds {
    fn name(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Otel => "otel",
            Self::Osprofiler => "osprofiler",
            Self::Published => "published",
        }
    }

    /// The BENCHMARKS.md block of its figures.
    fn block(self) -> String {
        match self {
            Self::Both => "bench-spans".to_string(),
            other => format!("bench-spans-{}", other.name()),
        }
    }
}

/// Sampling rate of every profiler in the side-by-side runs.
const HZ: u32 = 99;
/// The extra in-kernel measurement on the Python target: rate and number of runs.
const HIGH_HZ: u32 = 999;
const HIGH_RUNS: usize = 2;
/// Python frames of every sample of the Python target's work (`<module>` and f0..f48).
const PY_DEPTH: usize = 50;
const PY_FILE: &str = "bench_py_stack.py";
/// The span target: the same 50-frame work inside an OpenTelemetry span and an OSProfiler trace.
const SPAN_FILE: &str = "bench_py_span.py";

/// Resource usage of one finished process (with its waited-for children).
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    /// User + system.
    cpu: Duration,
    /// User alone: the work of a CPU-bound target that runs for a fixed time.
    user: Duration,
    max_rss_kib: u64,
}

/// Waits for `child` and returns its exit status, own CPU time and peak RSS.
fn wait_usage(child: &mut Child) -> Result<(i32, Usage)> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both pointers are valid.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if r < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok((
        status,
        Usage {
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
            user: tv(ru.ru_utime),
            max_rss_kib: ru.ru_maxrss as u64,
        },
    ))
}

/// A gated target: a program and its leading arguments; the amount of work is appended.
struct Target {
    program: PathBuf,
    args: Vec<OsString>,
    /// Extra environment variables.
    env: Vec<(OsString, OsString)>,
}

/// A started, gated target.
struct Gated {
    child: Child,
    pid: u32,
}

/// The target's CPU time (user + system, and user alone) and its wall time from release to
/// exit.
#[derive(Debug, Clone, Copy, Default)]
struct TargetRun {
    cpu: Duration,
    user: Duration,
    wall: Duration,
}

impl Target {
    fn start(&self, amount: u64) -> Result<Gated> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(amount.to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", self.program.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .context("target did not print its pid")?;
        let pid = line.trim().parse().context("target printed no pid")?;
        Ok(Gated { child, pid })
    }
}

impl Gated {
    /// Lets the target start its work; returns when it did.
    fn release(&mut self) -> Result<Instant> {
        let mut stdin = self.child.stdin.take().expect("piped");
        stdin
            .write_all(b"g")
            .context("failed to start the target")?;
        Ok(Instant::now())
    }

    fn wait(&mut self, released: Instant) -> Result<TargetRun> {
        let (status, usage) = wait_usage(&mut self.child)?;
        let wall = released.elapsed();
        if status != 0 {
            bail!("the target failed (wait status {status})");
        }
        Ok(TargetRun {
            cpu: usage.cpu,
            user: usage.user,
            wall,
        })
    }
}

/// Reads `stream` until a line contains `ready`, returning the reader.
pub(crate) fn wait_ready<R: Read>(stream: R, ready: &str) -> Result<BufReader<R>> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("profiler exited before it was ready");
        }
        if line.contains(ready) {
            return Ok(reader);
        }
    }
}

/// spanprof's sampling program (`on_cpu_sample`, its one perf_event program), held open by an
/// fd of our own: the counters stay readable after spanprof detaches, which it does as soon as
/// its target exits.
struct SamplingProg(OwnedFd);

impl SamplingProg {
    /// Finds the perf_event program among the fds of process `pid` and opens it by id.
    fn of(pid: u32) -> Option<Self> {
        const BPF_PROG_TYPE_PERF_EVENT: &str = "7";
        const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
        let id: u32 = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .ok()?
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .find(|text| fdinfo_field(text, "prog_type") == Some(BPF_PROG_TYPE_PERF_EVENT))
            .and_then(|text| fdinfo_field(&text, "prog_id")?.parse().ok())?;
        // union bpf_attr for BPF_PROG_GET_FD_BY_ID: prog_id, next_id, open_flags.
        let attr: [u32; 3] = [id, 0, 0];
        // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives for the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_FD_BY_ID,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        // SAFETY: a non-negative return is a new fd that nothing else owns.
        (fd >= 0).then(|| Self(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// (run_time_ns, run_cnt): the counters `bpftool prog show` prints, from our fd's fdinfo.
    fn stats(&self) -> Option<(u64, u64)> {
        let text =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.0.as_raw_fd())).ok()?;
        Some((
            fdinfo_field(&text, "run_time_ns")?.parse().ok()?,
            fdinfo_field(&text, "run_cnt")?.parse().ok()?,
        ))
    }
}

/// The value of `name:` in an fdinfo text.
fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// In-kernel counters of one spanprof run, as deltas over two intervals.
#[derive(Debug, Clone, Copy, Default)]
struct BpfWindow {
    /// 1 s with spanprof attached and the target blocked: every run is for another process.
    idle_ns: u64,
    idle_runs: u64,
    /// From the target's release to its exit.
    ns: u64,
    runs: u64,
    /// Target samples in that window: the samples spanprof reports plus the lost ones (the
    /// target runs only inside the window).
    target_samples: u64,
}

/// In-kernel figures pooled over several runs (sums of the counters, then one division).
struct BpfFigures {
    /// Per run of the program, every run in the windows (any process, any CPU).
    per_run_ns: f64,
    /// Per run for other processes (the idle intervals).
    other_run_ns: f64,
    /// Window time / target samples: every run charged to the target.
    gross_ns: f64,
    /// Window time less the other runs (priced at `other_run_ns`) / target samples.
    net_ns: f64,
    target_samples: u64,
    runs: u64,
}

fn bpf_figures(windows: &[BpfWindow]) -> Option<BpfFigures> {
    let sum = |f: fn(&BpfWindow) -> u64| windows.iter().map(f).sum::<u64>() as f64;
    let (ns, runs, n) = (sum(|w| w.ns), sum(|w| w.runs), sum(|w| w.target_samples));
    let (idle_ns, idle_runs) = (sum(|w| w.idle_ns), sum(|w| w.idle_runs));
    if n == 0.0 || runs == 0.0 || idle_runs == 0.0 {
        return None;
    }
    let other_run_ns = idle_ns / idle_runs;
    Some(BpfFigures {
        per_run_ns: ns / runs,
        other_run_ns,
        gross_ns: ns / n,
        net_ns: (ns - (runs - n).max(0.0) * other_run_ns) / n,
        target_samples: n as u64,
        runs: runs as u64,
    })
}

/// The counts of the summary's `spans:` line.
#[derive(Debug, Clone, Copy, Default)]
struct SpanCounts {
    /// Samples with an OpenTelemetry span.
    otel: u64,
    /// Samples in an OSProfiler trace.
    osp: u64,
    /// Samples whose span context was read from the thread context the process publishes.
    published: u64,
}

/// "spans: 1234 of 2000 samples in 12 OpenTelemetry spans (3 traces), 0 in OSProfiler traces"
/// (or "…, 5 in 1 OSProfiler trace (2 trace points)"), with
/// "; N read from the thread context the process publishes" at the end when N > 0.
fn parse_spans_line(line: &str) -> Option<SpanCounts> {
    const PUBLISHED: &str = " read from the thread context the process publishes";
    let line = line.strip_prefix("spans: ")?;
    let (line, published) = match line.strip_suffix(PUBLISHED) {
        Some(rest) => {
            let (rest, n) = rest.rsplit_once("; ")?;
            (rest, n.parse().ok()?)
        }
        None => (line, 0),
    };
    let (otel, rest) = line.split_once(" of ")?;
    let (_, osp) = rest.rsplit_once(", ")?;
    Some(SpanCounts {
        otel: otel.parse().ok()?,
        osp: osp.split_once(" in ")?.0.parse().ok()?,
        published,
    })
}

/// One run of the target under spanprof.
#[derive(Debug, Default)]
struct SpanprofRun {
    target: TargetRun,
    own: Usage,
    samples: u64,
    /// Samples lost (the ring buffer was full), from the summary.
    lost: u64,
    /// spanprof's own figure: CPU per sample in its sampling loop (no setup, no symbolization).
    loop_us: f64,
    bpf: Option<BpfWindow>,
    /// The summary's `spans:` line, which spanprof prints only when some sample has a span.
    spans: Option<SpanCounts>,
}

fn run_spanprof(
    spanprof: &Path,
    target: &Target,
    amount: u64,
    hz: u32,
    extra: &[&str],
    out: &Path,
) -> Result<SpanprofRun> {
    let mut t = target.start(amount)?;
    let mut prof = Command::new(spanprof)
        .args([
            "profile",
            "--frequency",
            &hz.to_string(),
            "--pid",
            &t.pid.to_string(),
        ])
        .args(extra)
        .arg("-o")
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start spanprof")?;
    let mut err = wait_ready(prof.stderr.take().expect("piped"), "spanprof: profiling")?;
    // The in-kernel counters: an interval without target samples, then the target's run.
    let prog = SamplingProg::of(prof.id());
    let stats = || prog.as_ref().and_then(SamplingProg::stats);
    let idle_start = stats();
    std::thread::sleep(Duration::from_secs(1));
    let window_start = stats();
    let released = t.release()?;
    let target = t.wait(released);
    let window_end = stats();
    let mut rest = String::new();
    err.read_to_string(&mut rest)?;
    let (status, own) = wait_usage(&mut prof)?;
    let target = target?;
    if status != 0 {
        bail!("spanprof failed (status {status}):\n{rest}");
    }
    // "spanprof: 520 samples, 0 lost, from 1 process in 5.3 s at 99 Hz: pid …"
    let (samples, lost) = rest
        .lines()
        .find_map(|l| {
            let (n, tail) = l.strip_prefix("spanprof: ")?.split_once(" samples, ")?;
            let lost = tail.split_once(" lost")?.0;
            Some((n.parse::<u64>().ok()?, lost.parse::<u64>().ok()?))
        })
        .with_context(|| format!("spanprof printed no sample count:\n{rest}"))?;
    // "spanprof own CPU: 48.5 ms setup, 16.6 µs per sample while sampling (8.1 ms), …"
    let loop_us = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("spanprof own CPU: ")?
                .split(" setup, ")
                .nth(1)?
                .split(" µs per sample")
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("spanprof printed no own-CPU line:\n{rest}"))?;
    let spans = rest.lines().find_map(parse_spans_line);
    let bpf = match (idle_start, window_start, window_end) {
        (Some(a), Some(b), Some(c)) => Some(BpfWindow {
            idle_ns: b.0 - a.0,
            idle_runs: b.1 - a.1,
            ns: c.0 - b.0,
            runs: c.1 - b.1,
            target_samples: samples + lost,
        }),
        _ => None,
    };
    Ok(SpanprofRun {
        target,
        own,
        samples,
        lost,
        loop_us,
        bpf,
        spans,
    })
}

/// One run of the target under perf record or py-spy record.
#[derive(Debug, Default)]
struct OtherRun {
    target: TargetRun,
    own: Usage,
    samples: u64,
}

/// `perf record CALL_GRAPH -F HZ -e cpu-clock -p PID -o OUT`; `call_graph` is `-g` (frame
/// pointers) or `--call-graph dwarf`.
fn run_perf(
    target: &Target,
    amount: u64,
    hz: u32,
    call_graph: &[&str],
    out: &Path,
) -> Result<OtherRun> {
    let mut t = target.start(amount)?;
    let mut perf = Command::new("perf")
        .arg("record")
        .args(call_graph)
        .args([
            "-F",
            &hz.to_string(),
            "-e",
            "cpu-clock",
            "-p",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    // perf prints nothing when it is attached; give it time, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    let released = t.release()?;
    let target = t.wait(released)?;
    let mut text = String::new();
    perf.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (_, own) = wait_usage(&mut perf)?;
    // "[ perf record: Captured and wrote 0.052 MB perf.data (198 samples) ]"
    let samples = text
        .rsplit_once(" samples)")
        .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
        .with_context(|| format!("perf printed no sample count:\n{text}"))?;
    Ok(OtherRun {
        target,
        own,
        samples,
    })
}

/// py-spy in its default mode: it pauses the target for each sample, so the stack it reads is
/// consistent (spanprof reads the stack while the thread is stopped in the kernel).
fn run_pyspy(py_spy: &Path, target: &Target, amount: u64, out: &Path) -> Result<OtherRun> {
    let mut t = target.start(amount)?;
    let mut prof = Command::new(py_spy)
        .args([
            "record",
            "--pid",
            &t.pid.to_string(),
            "--rate",
            &HZ.to_string(),
            "--format",
            "raw",
            "-o",
        ])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", py_spy.display()))?;
    // "py-spy> Sampling process 99 times a second. Press Control-C to exit."
    let ready = wait_ready(prof.stdout.take().expect("piped"), "py-spy> Sampling");
    let mut stdout = match ready {
        Ok(r) => r,
        Err(e) => {
            let mut text = String::new();
            let _ = prof.stderr.take().expect("piped").read_to_string(&mut text);
            let _ = wait_usage(&mut prof);
            let _ = t.child.kill();
            let _ = t.child.wait();
            return Err(e).context(format!("py-spy did not attach:\n{text}"));
        }
    };
    let released = t.release()?;
    let target = t.wait(released);
    let mut text = String::new();
    stdout.read_to_string(&mut text)?;
    prof.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (status, own) = wait_usage(&mut prof)?;
    let target = target?;
    if status != 0 {
        bail!("py-spy failed (status {status}):\n{text}");
    }
    let folded = std::fs::read_to_string(out)
        .with_context(|| format!("py-spy wrote no {}:\n{text}", out.display()))?;
    let samples = folded_stacks(&folded).map(|(_, n)| n).sum();
    Ok(OtherRun {
        target,
        own,
        samples,
    })
}

/// The (stack, count) lines of a folded file.
fn folded_stacks(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|l| {
        let (stack, n) = l.rsplit_once(' ')?;
        Some((stack, n.parse().ok()?))
    })
}

/// Samples of a folded profile, and those whose stack holds exactly the target's 50 Python
/// frames (the work; the rest are the moment of the release and interpreter exit).
fn python_depth(path: &Path) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let marker = format!("({PY_FILE}:");
    let (mut all, mut whole) = (0, 0);
    for (stack, n) in folded_stacks(&text) {
        all += n;
        if stack.split(';').filter(|f| f.contains(&marker)).count() == PY_DEPTH {
            whole += n;
        }
    }
    Ok((all, whole))
}

/// Samples of a span-grouped folded profile (`--group-by span`: the root frame names the span
/// context, e.g. `[span … trace … osprofiler …]`, or `[no span]`).
#[derive(Debug, Clone, Copy, Default)]
struct SpanDepth {
    all: u64,
    /// Samples whose stack holds exactly the 50 Python frames of the work.
    whole: u64,
    /// Of those, the samples under a root frame naming an OpenTelemetry span (`[span …]`).
    whole_otel: u64,
    /// Of those, the samples under a root frame naming an OSProfiler trace point.
    whole_osp: u64,
}

fn span_depth(path: &Path) -> Result<SpanDepth> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    // `<module>` is the span target's frame, f0..f48 bench_py_stack.py's (imported from it).
    let markers = [format!("({SPAN_FILE}:"), format!("({PY_FILE}:")];
    let ours = |f: &&str| markers.iter().any(|m| f.contains(m.as_str()));
    let mut d = SpanDepth::default();
    for (stack, n) in folded_stacks(&text) {
        d.all += n;
        if stack.split(';').filter(ours).count() == PY_DEPTH {
            d.whole += n;
            // `[span S trace T]`, `[osprofiler P base B]`, `[span S trace T osprofiler P]`.
            let root = stack.split(';').next().unwrap_or("");
            if root.starts_with("[span ") {
                d.whole_otel += n;
            }
            if root.starts_with("[osprofiler ") || root.contains(" osprofiler ") {
                d.whole_osp += n;
            }
        }
    }
    Ok(d)
}

fn run_alone(target: &Target, amount: u64) -> Result<TargetRun> {
    let mut t = target.start(amount)?;
    let released = t.release()?;
    t.wait(released)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn per_sample_us(own: Duration, n: u64) -> f64 {
    secs(own) * 1e6 / n.max(1) as f64
}

pub(crate) fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// "Linux …, N CPUs" for the headings.
pub(crate) fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} CPUs, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

/// Runs `f(i)` for each round with the round's progress line.
pub(crate) fn rounds<T>(
    name: &str,
    n: usize,
    mut f: impl FnMut(usize) -> Result<T>,
) -> Result<Vec<T>> {
    (0..n)
        .map(|i| {
            step(&format!("bench {name}: round {}/{n}", i + 1));
            f(i)
        })
        .collect()
}

#[derive(Debug, Default)]
struct NativeRound {
    alone: TargetRun,
    spanprof: SpanprofRun,
    perf: OtherRun,
}

/// fixed_work alone, under spanprof and under perf record; the markdown of its figures.
fn native(spanprof: &Path, workloads: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let target = Target {
        program: workloads.join("fixed_work"),
        args: Vec::new(),
        env: Vec::new(),
    };
    let (work, n) = (cfg.work, cfg.rounds);
    let sp_out = out_dir.join("bench.pb.gz");
    let perf_out = out_dir.join("perf.data");
    let results = rounds("native", n, |i| {
        let mut r = NativeRound::default();
        // Alternate the order so drift in the machine's speed does not favour one configuration.
        if i % 2 == 0 {
            r.alone = run_alone(&target, work)?;
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &sp_out)?;
            r.perf = run_perf(&target, work, HZ, &["-g"], &perf_out)?;
        } else {
            r.perf = run_perf(&target, work, HZ, &["-g"], &perf_out)?;
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &sp_out)?;
            r.alone = run_alone(&target, work)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("native_rounds.txt"), format!("{results:#?}\n"))?;

    // The median over rounds of one figure of each round.
    let med = |f: &dyn Fn(&NativeRound) -> f64| median(results.iter().map(f).collect());
    let sp_ratio = med(&|r| secs(r.spanprof.target.cpu) / secs(r.alone.cpu));
    let perf_ratio = med(&|r| secs(r.perf.target.cpu) / secs(r.alone.cpu));
    let sp_us = med(&|r| per_sample_us(r.spanprof.own.cpu, r.spanprof.samples));
    let sp_loop_us = med(&|r| r.spanprof.loop_us);
    let perf_us = med(&|r| per_sample_us(r.perf.own.cpu, r.perf.samples));
    let sp_rss = results.iter().map(|r| r.spanprof.own.max_rss_kib).max();
    let perf_rss = results.iter().map(|r| r.perf.own.max_rss_kib).max();
    let alone = med(&|r| secs(r.alone.cpu));
    let alone_wall = med(&|r| secs(r.alone.wall));
    let samples = med(&|r| r.spanprof.samples as f64);
    let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;

    Ok(format!(
        "Run of `cargo xtask bench --rounds {n} --work {work}` on {}: \
         target `fixed_work` alone {alone:.2} s CPU in {alone_wall:.2} s (medians), {samples:.0} samples per spanprof run.\n\n\
         | figure | spanprof --unwind fp | perf record -g | goal |\n\
         |---|---|---|---|\n\
         | target CPU time, profiled / alone (median of {n} interleaved rounds) | {sp_ratio:.4} | {perf_ratio:.4} | ≤ 1.005 |\n\
         | profiler's own CPU per sample, whole process (median) | {sp_us:.1} µs | {perf_us:.1} µs | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median) | {sp_loop_us:.1} µs | n/a | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | ≤ 64 MB |\n\
         | in-kernel time per sampling-program run, all runs while the target ran ({} runs) | {:.2} µs | n/a | |\n\
         | in-kernel time per target sample, net of the runs for other processes ({} samples) | {:.2} µs | n/a | |\n",
        machine(),
        mb(sp_rss.unwrap_or(0)),
        mb(perf_rss.unwrap_or(0)),
        bpf.runs,
        bpf.per_run_ns / 1000.0,
        bpf.target_samples,
        bpf.net_ns / 1000.0,
    ))
}

#[derive(Debug, Default)]
struct PyRound {
    alone: TargetRun,
    spanprof: SpanprofRun,
    /// (all samples, samples with the whole 50-frame Python stack) of spanprof's folded output.
    spanprof_depth: (u64, u64),
    pyspy: OtherRun,
    pyspy_depth: (u64, u64),
    /// spanprof with `--unwind fp`, for the cost of the default stack copy.
    spanprof_fp: SpanprofRun,
}

/// The first line `program args…` prints, e.g. "3.12.1" or "py-spy 0.4.3".
pub(crate) fn version(program: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("failed to run {}", program.display()))?;
    if !out.status.success() {
        bail!("{} {} failed", program.display(), args.join(" "));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// bench_py_stack.py alone, under spanprof and under py-spy record; then spanprof alone at a
/// higher rate for the in-kernel cost; the markdown of its figures.
fn python(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let script = root.join("tests/workloads").join(PY_FILE);
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    let pyspy_version = version(&cfg.py_spy, &["--version"])?;
    let target = Target {
        program: cfg.python.clone(),
        args: vec![script.into()],
        env: Vec::new(),
    };
    let (work, n) = (cfg.py_work, cfg.rounds);
    let sp_out = out_dir.join("bench_py.folded");
    let pyspy_out = out_dir.join("bench_py.pyspy.txt");
    let spanprof_run = |r: &mut PyRound| -> Result<()> {
        r.spanprof = run_spanprof(spanprof, &target, work, HZ, &[], &sp_out)?;
        r.spanprof_depth = python_depth(&sp_out)?;
        Ok(())
    };
    let pyspy_run = |r: &mut PyRound| -> Result<()> {
        r.pyspy = run_pyspy(&cfg.py_spy, &target, work, &pyspy_out)?;
        r.pyspy_depth = python_depth(&pyspy_out)?;
        Ok(())
    };
    let fp_out = out_dir.join("bench_py_fp.folded");
    let fp_run = |r: &mut PyRound| -> Result<()> {
        r.spanprof_fp = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &fp_out)?;
        Ok(())
    };
    let results = rounds("python", n, |i| {
        let mut r = PyRound::default();
        if i % 2 == 0 {
            r.alone = run_alone(&target, work)?;
            spanprof_run(&mut r)?;
            pyspy_run(&mut r)?;
            fp_run(&mut r)?;
        } else {
            fp_run(&mut r)?;
            pyspy_run(&mut r)?;
            spanprof_run(&mut r)?;
            r.alone = run_alone(&target, work)?;
        }
        Ok(r)
    })?;
    // At the higher rate, the default and --unwind fp alternate.
    let high = rounds(&format!("python at {HIGH_HZ} Hz"), 2 * HIGH_RUNS, |i| {
        let out = out_dir.join("bench_py_high.folded");
        let extra: &[&str] = if i % 2 == 0 { &[] } else { &["--unwind", "fp"] };
        let run = run_spanprof(spanprof, &target, work, HIGH_HZ, extra, &out)?;
        Ok((run, python_depth(&out)?))
    })?;
    std::fs::write(
        out_dir.join("python_rounds.txt"),
        format!("{results:#?}\n{high:#?}\n"),
    )?;

    let med = |f: &dyn Fn(&PyRound) -> f64| median(results.iter().map(f).collect());
    let sp_ratio = med(&|r| secs(r.spanprof.target.cpu) / secs(r.alone.cpu));
    let ps_ratio = med(&|r| secs(r.pyspy.target.cpu) / secs(r.alone.cpu));
    let sp_us = med(&|r| per_sample_us(r.spanprof.own.cpu, r.spanprof.samples));
    let ps_us = med(&|r| per_sample_us(r.pyspy.own.cpu, r.pyspy.samples));
    let sp_loop_us = med(&|r| r.spanprof.loop_us);
    let sp_rss = results.iter().map(|r| r.spanprof.own.max_rss_kib).max();
    let ps_rss = results.iter().map(|r| r.pyspy.own.max_rss_kib).max();
    let alone = med(&|r| secs(r.alone.cpu));
    let alone_wall = med(&|r| secs(r.alone.wall));
    let sp_samples = med(&|r| r.spanprof.samples as f64);
    let ps_samples = med(&|r| r.pyspy.samples as f64);
    let share = |d: &dyn Fn(&PyRound) -> (u64, u64)| {
        let (all, whole) = results
            .iter()
            .map(d)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        100.0 * whole as f64 / all.max(1) as f64
    };
    let sp_whole = share(&|r| r.spanprof_depth);
    let ps_whole = share(&|r| r.pyspy_depth);
    let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
    let fp_windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof_fp.bpf).collect();
    let fp_bpf = bpf_figures(&fp_windows).context("no in-kernel statistics were read")?;
    let fp_loop_us = med(&|r| r.spanprof_fp.loop_us);
    let high_windows: Vec<BpfWindow> = high.iter().step_by(2).filter_map(|(r, _)| r.bpf).collect();
    let high_bpf = bpf_figures(&high_windows).context("no in-kernel statistics were read")?;
    let high_fp_windows: Vec<BpfWindow> = high
        .iter()
        .skip(1)
        .step_by(2)
        .filter_map(|(r, _)| r.bpf)
        .collect();
    let high_fp_bpf = bpf_figures(&high_fp_windows).context("no in-kernel statistics were read")?;
    let high_default: Vec<&(SpanprofRun, (u64, u64))> = high.iter().step_by(2).collect();
    let (high_all, high_whole) = high_default
        .iter()
        .fold((0, 0), |a, (_, d)| (a.0 + d.0, a.1 + d.1));
    let high_whole = 100.0 * high_whole as f64 / high_all.max(1) as f64;

    Ok(format!(
        "Run of `cargo xtask bench --rounds {n} --py-work {work}` on {}: target `{PY_FILE}` \
         (CPython {python_version}, {PY_DEPTH} Python frames) alone {alone:.2} s CPU in {alone_wall:.2} s (medians); \
         {sp_samples:.0} samples per spanprof run, {ps_samples:.0} per py-spy run \
         (both at {HZ} Hz; spanprof samples the target's CPU time, py-spy wall-clock time). \
         {pyspy_version} in its default mode, which pauses the target for each sample.\n\n\
         | figure | spanprof | py-spy record | goal |\n\
         |---|---|---|---|\n\
         | target CPU time, profiled / alone (median of {n} interleaved rounds) | {sp_ratio:.4} | {ps_ratio:.4} | ≤ 1.005 |\n\
         | samples holding all {PY_DEPTH} Python frames | {sp_whole:.1}% | {ps_whole:.1}% | |\n\
         | profiler's own CPU per sample, whole process (median) | {sp_us:.1} µs | {ps_us:.1} µs | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median) | {sp_loop_us:.1} µs | n/a | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | ≤ 64 MB |\n\
         | in-kernel time per sampling-program run, all runs while the target ran ({} runs) | {:.2} µs | n/a | |\n\
         | in-kernel time per run for other processes (target blocked, 1 s per run) | {:.2} µs | n/a | |\n\
         | in-kernel time per target sample, all runs charged to the target ({} samples) | {:.2} µs | n/a | |\n\
         | **in-kernel time per target sample**, net of the runs for other processes | **{:.2} µs** | n/a | ≤ 10 µs |\n\
         | the same at {HIGH_HZ} Hz ({HIGH_RUNS} runs, {} samples, {high_whole:.1}% with all {PY_DEPTH} frames) | {:.2} µs | n/a | ≤ 10 µs |\n\
         | the same with `--unwind fp` (frame-pointer walk instead of the {STACK_COPY_BYTES}-byte stack copy: this interpreter has no frame pointers, so its native frames are cut), same rounds, at {HZ} Hz; at {HIGH_HZ} Hz | {:.2} µs; {:.2} µs | n/a | |\n\
         | spanprof's own CPU per sample in its sampling loop with `--unwind fp` (median) | {fp_loop_us:.1} µs | n/a | |\n",
        machine(),
        mb(sp_rss.unwrap_or(0)),
        mb(ps_rss.unwrap_or(0)),
        bpf.runs,
        bpf.per_run_ns / 1000.0,
        bpf.other_run_ns / 1000.0,
        bpf.target_samples,
        bpf.gross_ns / 1000.0,
        bpf.net_ns / 1000.0,
        high_bpf.target_samples,
        high_bpf.net_ns / 1000.0,
        fp_bpf.net_ns / 1000.0,
        high_fp_bpf.net_ns / 1000.0,
    ))
}

/// `bench_py_stack.py` under Debian sid's stripped python3.14 and python3.15 (run by `chroot`
/// into `target/sid-rootfs`, which execs the interpreter: the pid is the interpreter's),
/// spanprof alone at [`HZ`] and [`HIGH_HZ`], `cfg.rounds` runs each: the in-kernel time per
/// target sample, net of the runs for other processes, and the samples holding all
/// [`PY_DEPTH`] frames; the markdown of the figures.
fn sid_pythons(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let rootfs = crate::rootfs::ensure(root, &cfg.venv_python)?;
    let inside = PathBuf::from("/tmp/spanprof-bench");
    let host_dir = rootfs.join("tmp/spanprof-bench");
    std::fs::create_dir_all(&host_dir)?;
    std::fs::copy(
        root.join("tests/workloads").join(PY_FILE),
        host_dir.join(PY_FILE),
    )?;
    let mut rows = String::new();
    // The host's interpreter (`--python`, pyenv's 3.12 by default) first, in the same run, as
    // the reference the sid rows compare with.
    let mut targets: Vec<(String, Target)> = Vec::new();
    let host_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    targets.push((
        format!("{host_version} (`{}`, the reference)", cfg.python.display()),
        Target {
            program: cfg.python.clone(),
            args: vec![root.join("tests/workloads").join(PY_FILE).into()],
            env: Vec::new(),
        },
    ));
    for minor in [14u8, 15] {
        let python = format!("/usr/bin/python3.{minor}");
        let out = Command::new("chroot")
            .arg(&rootfs)
            .args([
                python.as_str(),
                "-c",
                "import platform; print(platform.python_version())",
            ])
            .output()
            .context("failed to run chroot")?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        targets.push((
            format!("Debian sid {version} (`{python}`, stripped, in a chroot)"),
            Target {
                program: PathBuf::from("chroot"),
                args: vec![
                    rootfs.clone().into(),
                    python.clone().into(),
                    inside.join(PY_FILE).into(),
                ],
                env: Vec::new(),
            },
        ));
    }
    for (i, (label, target)) in targets.iter().enumerate() {
        let mut cells = Vec::new();
        for hz in [HZ, HIGH_HZ] {
            let folded = out_dir.join(format!("bench_sid_{i}_{hz}.folded"));
            let runs = rounds(&format!("{label} at {hz} Hz"), cfg.rounds, |_| {
                let run = run_spanprof(spanprof, target, cfg.py_work, hz, &[], &folded)?;
                Ok((run, python_depth(&folded)?))
            })?;
            let windows: Vec<BpfWindow> = runs.iter().filter_map(|(r, _)| r.bpf).collect();
            let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
            let (all, whole) = runs.iter().fold((0, 0), |a, (_, d)| (a.0 + d.0, a.1 + d.1));
            cells.push(format!(
                "{:.2} µs ({} samples, {:.1}% with all {PY_DEPTH} frames)",
                bpf.net_ns / 1000.0,
                bpf.target_samples,
                100.0 * whole as f64 / all.max(1) as f64
            ));
        }
        rows.push_str(&format!("| {label} | {} | {} |\n", cells[0], cells[1]));
    }
    let _ = std::fs::remove_dir_all(&host_dir);
    Ok(format!(
        "Run of `cargo xtask bench --only sid --rounds {} --py-work {}` on {}: target `{PY_FILE}` \
         ({PY_DEPTH} Python frames) run by `chroot target/sid-rootfs python3.X`, and by the \
         host's interpreter as the reference, spanprof alone (default `--unwind dwarf`), the \
         interpreters one after the other. In-kernel time per target sample, net of the runs for \
         other processes, over every round:\n\n\
         | interpreter | at {HZ} Hz | at {HIGH_HZ} Hz |\n\
         |---|---|---|\n{rows}",
        cfg.rounds,
        cfg.py_work,
        machine()
    ))
}

/// spanprof's default `--stack-copy`.
const STACK_COPY_BYTES: u32 = 16384;

/// One run of the span target under spanprof, and its span-grouped folded output.
#[derive(Debug, Default)]
struct SpanRun {
    run: SpanprofRun,
    depth: SpanDepth,
}

/// One round of the span part: at each rate ([`HZ`], [`HIGH_HZ`]), spanprof reading spans and
/// spanprof with `--no-spans`.
#[derive(Debug, Default)]
struct SpanRound {
    spans: [SpanRun; 2],
    no_spans: [SpanRun; 2],
}

/// The figures of one configuration (spans read or not) at one rate, over every round.
struct SpanConfigFigures {
    bpf: BpfFigures,
    samples: u64,
    depth: SpanDepth,
    counts: SpanCounts,
}

fn span_config(runs: &[&SpanRun]) -> Result<SpanConfigFigures> {
    let windows: Vec<BpfWindow> = runs.iter().filter_map(|r| r.run.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
    let mut f = SpanConfigFigures {
        bpf,
        samples: 0,
        depth: SpanDepth::default(),
        counts: SpanCounts::default(),
    };
    for r in runs {
        f.samples += r.run.samples;
        f.depth.all += r.depth.all;
        f.depth.whole += r.depth.whole;
        f.depth.whole_otel += r.depth.whole_otel;
        f.depth.whole_osp += r.depth.whole_osp;
        let c = r.run.spans.unwrap_or_default();
        f.counts.otel += c.otel;
        f.counts.osp += c.osp;
        f.counts.published += c.published;
    }
    Ok(f)
}

fn percent(part: u64, all: u64) -> f64 {
    100.0 * part as f64 / all.max(1) as f64
}

/// bench_py_span.py under spanprof with and without span reading, at 99 and 999 Hz,
/// interleaved; the markdown of the in-kernel figures and the difference.
fn spans(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let script = root.join("tests/workloads").join(SPAN_FILE);
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    let minor = python_version
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    let libs = cfg.span_libs.join(&minor);
    if !libs.is_dir() {
        bail!(
            "no tracing libraries for CPython {minor} in {} (`cargo xtask deps` installs them \
             for pyenv's 3.8-3.13)",
            libs.display()
        );
    }
    let env = vec![
        (OsString::from("PYTHONPATH"), libs.clone().into_os_string()),
        (OsString::from("PYTHONNOUSERSITE"), OsString::from("1")),
        (
            OsString::from("BENCH_SPAN_KINDS"),
            OsString::from(cfg.span_kinds.name()),
        ),
    ];
    // The versions of the packages in `libs`, "?" for one that is missing.
    let lib_version = |package: &str| {
        Command::new(&cfg.python)
            .args([
                "-c",
                &format!("import importlib.metadata as m; print(m.version('{package}'))"),
            ])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "?".to_string())
    };
    let otel_version = lib_version("opentelemetry-sdk");
    let osp_version = lib_version("osprofiler");
    let inside = match cfg.span_kinds {
        SpanKinds::Both => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} and an \
             OSProfiler {osp_version} trace"
        ),
        SpanKinds::Otel => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} only, \
             `--span-kinds otel`"
        ),
        SpanKinds::Osprofiler => {
            format!("inside an OSProfiler {osp_version} trace only, `--span-kinds osprofiler`")
        }
        SpanKinds::Published => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} and an \
             OSProfiler {osp_version} trace published by spanprof-context {}'s `install()` as \
             an OTEP 4947 thread context, `--span-kinds published`",
            lib_version("spanprof-context")
        ),
    };
    let target = Target {
        program: cfg.python.clone(),
        args: vec![script.into()],
        env,
    };
    let (work, n) = (cfg.py_work, cfg.rounds);
    let rates = [HZ, HIGH_HZ];
    let one = |rate: usize, read_spans: bool| -> Result<SpanRun> {
        let out = out_dir.join(format!(
            "bench_span_{}{}.folded",
            rates[rate],
            if read_spans { "" } else { "_nospans" }
        ));
        let mut extra = vec!["--group-by", "span"];
        if !read_spans {
            extra.push("--no-spans");
        }
        let run = run_spanprof(spanprof, &target, work, rates[rate], &extra, &out)?;
        Ok(SpanRun {
            run,
            depth: span_depth(&out)?,
        })
    };
    let results = rounds("spans", n, |i| {
        let mut r = SpanRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            for rate in 0..rates.len() {
                r.spans[rate] = one(rate, true)?;
                r.no_spans[rate] = one(rate, false)?;
            }
        } else {
            for rate in (0..rates.len()).rev() {
                r.no_spans[rate] = one(rate, false)?;
                r.spans[rate] = one(rate, true)?;
            }
        }
        Ok(r)
    })?;
    let rounds_file = match cfg.span_kinds {
        SpanKinds::Both => "spans_rounds.txt".to_string(),
        k => format!("spans_{}_rounds.txt", k.name()),
    };
    std::fs::write(out_dir.join(rounds_file), format!("{results:#?}\n"))?;

    let published = cfg.span_kinds == SpanKinds::Published;
    let mut rows: Vec<[String; 2]> = vec![Default::default(); 11];
    for rate in 0..rates.len() {
        let with = span_config(&results.iter().map(|r| &r.spans[rate]).collect::<Vec<_>>())?;
        let without = span_config(
            &results
                .iter()
                .map(|r| &r.no_spans[rate])
                .collect::<Vec<_>>(),
        )?;
        // The same difference round by round (each pair of runs on its own), for its spread.
        let paired: Vec<f64> = results
            .iter()
            .filter_map(|r| {
                let a = bpf_figures(&[r.spans[rate].run.bpf?])?;
                let b = bpf_figures(&[r.no_spans[rate].run.bpf?])?;
                Some((a.net_ns - b.net_ns) / 1000.0)
            })
            .collect();
        let (lo, hi) = paired
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &d| {
                (lo.min(d), hi.max(d))
            });
        let us = |ns: f64| ns / 1000.0;
        let diff = us(with.bpf.net_ns - without.bpf.net_ns);
        let col = [
            format!("{:.2} µs", us(with.bpf.net_ns)),
            format!("{:.2} µs", us(without.bpf.net_ns)),
            format!("**{diff:.2} µs**"),
            format!("{:.2} µs ({lo:.2} to {hi:.2})", median(paired.clone())),
            format!(
                "{} / {}",
                with.bpf.target_samples, without.bpf.target_samples
            ),
            format!(
                "{:.2} / {:.2} µs",
                us(with.bpf.other_run_ns),
                us(without.bpf.other_run_ns)
            ),
            format!(
                "{:.1}% / {:.1}%",
                percent(with.counts.otel, with.samples),
                percent(with.counts.osp, with.samples)
            ),
            format!(
                "{:.1}% / {:.1}% (of {})",
                percent(with.depth.whole_otel, with.depth.whole),
                percent(with.depth.whole_osp, with.depth.whole),
                with.depth.whole
            ),
            format!(
                "{:.1}% / {:.1}%",
                percent(with.depth.whole, with.depth.all),
                percent(without.depth.whole, without.depth.all)
            ),
            format!(
                "{} / {}",
                without.counts.otel + without.counts.osp,
                without.depth.whole_otel + without.depth.whole_osp
            ),
            format!(
                "{:.1}% / {:.1}% ({} / {} / {})",
                percent(with.counts.published, with.samples),
                percent(with.counts.published, with.depth.whole),
                with.counts.published,
                with.samples,
                with.depth.whole
            ),
        ];
        for (row, cell) in rows.iter_mut().zip(col) {
            row[rate] = cell;
        }
    }
    let labels = [
        "in-kernel time per target sample, spans read (net of the runs for other processes)",
        "the same with `--no-spans`",
        "**span reading per sample** (the difference)",
        "median (min to max) of the per-round differences",
        "target samples, spans read / `--no-spans` (all rounds)",
        "in-kernel time per run for other processes, spans read / `--no-spans`",
        "samples with an OpenTelemetry span / in an OSProfiler trace (`spans:` line)",
        "samples of the work (all 50 frames) with an OpenTelemetry span / an OSProfiler trace",
        "samples holding all 50 Python frames, spans read / `--no-spans`",
        "samples with a span context under `--no-spans` (`spans:` line / span-grouped output)",
        "samples read from the thread context the process publishes (`spans:` line), share of \
         all samples / of the work's samples (read / all / work)",
    ];
    let goals = ["", "", "≤ 5 µs", "", "", "", "", "", "", "", ""];
    let mut table = String::new();
    for (i, ((label, row), goal)) in labels.iter().zip(&rows).zip(goals).enumerate() {
        // The published share is a figure of `--span-kinds published` only (0 otherwise).
        if i == labels.len() - 1 && !published {
            continue;
        }
        table += &format!("| {label} | {} | {} | {goal} |\n", row[0], row[1]);
    }
    let kinds_arg = match cfg.span_kinds {
        SpanKinds::Both => String::new(),
        k => format!(" --span-kinds {}", k.name()),
    };
    Ok(format!(
        "Run of `cargo xtask bench --only spans{kinds_arg} --rounds {n} --py-work {work}` on {}: target \
         `{SPAN_FILE}` (CPython {python_version}, {PY_DEPTH} Python frames, {inside}), spanprof reading spans and with `--no-spans`, at {HZ} Hz and at {HIGH_HZ} Hz, \
         the four runs interleaved in each of {n} rounds.\n\n\
         | figure | {HZ} Hz | {HIGH_HZ} Hz | goal |\n\
         |---|---|---|---|\n\
         {table}",
        machine(),
    ))
}

/// The unwind part: its target (built by `cargo xtask workloads`) and the rate of every
/// profiler in it.
const UNWIND_TARGET: &str = "cpu_split_nofp";
const UNWIND_HZ: u32 = 499;
/// `perf record --call-graph dwarf`'s default stack dump per sample, in bytes.
const PERF_STACK_DUMP: u32 = 8192;
/// `/bin/sh -c GATE PROGRAM SECONDS`: prints the shell's pid, waits for the release (a byte,
/// then EOF, on stdin) and execs PROGRAM, which keeps the pid. cpu_split works for a time from
/// its start and waits for nothing, so the gate sits before its exec: every profiler attaches
/// to the pid while the shell waits, follows the exec, and the target's seconds start at the
/// release in every configuration.
const GATE: &str = r#"echo $$; read gate; exec "$0" "$@""#;
/// The user frames of the work, leaf last, and the frames a sample of the work can end with.
const WORK_FRAMES: [&str; 3] = ["dispatcher", "hot_alpha", "hot_beta"];
const FULL_PATHS: [&[&str]; 3] = [
    &["main", "dispatcher", "hot_alpha"],
    &["main", "dispatcher", "hot_beta"],
    &["main", "dispatcher"],
];
/// The outermost frame of the target's main thread.
const ROOT_FRAME: &str = "_start";

/// What the user stacks of one run look like, from its folded stacks.
#[derive(Debug, Clone, Copy, Default)]
struct UnwindShape {
    samples: u64,
    /// Samples whose user stack has a frame of the work (dispatcher, hot_alpha or hot_beta),
    /// whatever else it has: a frame-pointer walk that stops at the leaf still counts.
    work: u64,
    /// Of those, the samples whose user stack ends with the whole path:
    /// main;dispatcher;hot_alpha or main;dispatcher;hot_beta (or main;dispatcher).
    full: u64,
    /// Of those, the samples whose user stack also starts at the process's root, `_start`.
    rooted: u64,
    /// Samples whose leaf user frame is hot_alpha, hot_beta.
    alpha: u64,
    beta: u64,
    /// User frames summed over every sample.
    user_frames: u64,
}

impl UnwindShape {
    fn add(&mut self, o: &Self) {
        self.samples += o.samples;
        self.work += o.work;
        self.full += o.full;
        self.rooted += o.rooted;
        self.alpha += o.alpha;
        self.beta += o.beta;
        self.user_frames += o.user_frames;
    }
}

/// A kernel frame (`name_[k]`, as spanprof and [`fold_perf_script`] write them) or a
/// placeholder such as `[truncated]` or `[no stack]` (an unknown frame, `[unknown] (module+0x…)`,
/// is a user frame).
fn not_user_frame(frame: &str) -> bool {
    frame.ends_with("_[k]") || (frame.starts_with('[') && frame.ends_with(']'))
}

fn unwind_shape<'a>(stacks: impl IntoIterator<Item = (&'a str, u64)>) -> UnwindShape {
    let mut s = UnwindShape::default();
    for (stack, n) in stacks {
        let user: Vec<&str> = stack.split(';').filter(|f| !not_user_frame(f)).collect();
        s.samples += n;
        s.user_frames += user.len() as u64 * n;
        if user.iter().any(|f| WORK_FRAMES.contains(f)) {
            s.work += n;
            if FULL_PATHS.iter().any(|path| user.ends_with(path)) {
                s.full += n;
                if user.first() == Some(&ROOT_FRAME) {
                    s.rooted += n;
                }
            }
        }
        match user.last() {
            Some(&"hot_alpha") => s.alpha += n,
            Some(&"hot_beta") => s.beta += n,
            _ => {}
        }
    }
    s
}

/// One frame line of `perf script`, `addr sym+off (dso)` trimmed, as a folded frame: the
/// symbol without its offset, `[unknown] (dso file name)` when perf has none, `_[k]` appended
/// to kernel frames (a kernel dso, or an address in the kernel half).
fn perf_frame(line: &str) -> String {
    let (addr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim();
    let (sym, dso) = match rest.rsplit_once(" (") {
        Some((sym, dso)) => (sym.trim(), dso.strip_suffix(')').unwrap_or(dso)),
        None => match rest.strip_prefix('(') {
            Some(dso) => ("", dso.strip_suffix(')').unwrap_or(dso)),
            None => (rest, ""),
        },
    };
    let name = sym.rsplit_once("+0x").map_or(sym, |(name, _)| name);
    let kernel = dso.contains("kernel.kallsyms")
        || dso.starts_with("[kernel")
        || u64::from_str_radix(addr, 16).is_ok_and(|a| a >= 0xffff_8000_0000_0000);
    let mut name = if name.is_empty() || name == "[unknown]" {
        format!("[unknown] ({})", dso.rsplit('/').next().unwrap_or(dso))
    } else {
        name.replace(';', ":")
    };
    if kernel {
        name.push_str("_[k]");
    }
    name
}

/// Folds `perf script` output: per sample a header line (`comm pid time: period event:`), one
/// line per frame, leaf first (`\t addr sym+off (dso)`), and a blank line. Returns the root-first
/// `;`-joined stacks and their sample counts (a sample without frames is `[no stack]`).
fn fold_perf_script(text: &str) -> BTreeMap<String, u64> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    let mut sample: Option<Vec<String>> = None;
    let mut end = |sample: &mut Option<Vec<String>>| {
        if let Some(mut frames) = sample.take() {
            frames.reverse();
            let stack = if frames.is_empty() {
                "[no stack]".to_string()
            } else {
                frames.join(";")
            };
            *stacks.entry(stack).or_default() += 1;
        }
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            end(&mut sample);
        } else if line.starts_with(char::is_whitespace) {
            if let Some(frames) = sample.as_mut() {
                frames.push(perf_frame(line.trim()));
            }
        } else {
            end(&mut sample);
            sample = Some(Vec::new());
        }
    }
    end(&mut sample);
    stacks
}

/// `perf script -i DATA`: its own CPU and peak RSS (the DWARF unwinding happens there) and the
/// samples folded; its output folded is written to `folded`, its stderr to `err`.
fn perf_script(data: &Path, folded: &Path, err: &Path) -> Result<(Usage, BTreeMap<String, u64>)> {
    let err_file = std::fs::File::create(err)
        .with_context(|| format!("failed to create {}", err.display()))?;
    let mut child = Command::new("perf")
        .args(["script", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err_file)
        .spawn()
        .context("failed to start perf script")?;
    let mut bytes = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut bytes)?;
    let (status, usage) = wait_usage(&mut child)?;
    if status != 0 {
        bail!(
            "perf script failed (wait status {status}); its errors are in {}",
            err.display()
        );
    }
    let stacks = fold_perf_script(&String::from_utf8_lossy(&bytes));
    let text: String = stacks.iter().map(|(s, n)| format!("{s} {n}\n")).collect();
    std::fs::write(folded, text)
        .with_context(|| format!("failed to write {}", folded.display()))?;
    Ok((usage, stacks))
}

/// A JSON value: enough of JSON for spanprof's `--stats` file (xtask has no JSON library).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Result<Self> {
        let mut p = JsonParser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            bail!("JSON: unexpected text at byte {}", p.i);
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Option<&Self> {
        match self {
            Self::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::Num(n) if n >= 0.0 && n.fract() == 0.0 => Some(n as u64),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    /// Skips white space, then `c` if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let found = self.s.get(self.i) == Some(&c);
        if found {
            self.i += 1;
        }
        found
    }

    fn expect(&mut self, c: u8) -> Result<()> {
        if !self.eat(c) {
            bail!("JSON: expected `{}` at byte {}", c as char, self.i);
        }
        Ok(())
    }

    fn value(&mut self, depth: usize) -> Result<Json> {
        if depth > 64 {
            bail!("JSON: nested too deep");
        }
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.expect(b':')?;
                        fields.push((key, self.value(depth + 1)?));
                        if self.eat(b'}') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
                Ok(Json::Obj(fields))
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                if !self.eat(b']') {
                    loop {
                        items.push(self.value(depth + 1)?);
                        if self.eat(b']') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
                Ok(Json::Arr(items))
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(_) => {
                let start = self.i;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c))
                {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                match word {
                    "null" => Ok(Json::Null),
                    "true" => Ok(Json::Bool(true)),
                    "false" => Ok(Json::Bool(false)),
                    _ => word
                        .parse()
                        .map(Json::Num)
                        .map_err(|_| anyhow::anyhow!("JSON: bad value at byte {start}")),
                }
            }
            None => bail!("JSON: unexpected end"),
        }
    }

    fn string(&mut self) -> Result<String> {
        if self.s.get(self.i) != Some(&b'"') {
            bail!("JSON: expected a string at byte {}", self.i);
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                bail!("JSON: unterminated string");
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        bail!("JSON: unterminated string");
                    };
                    self.i += 1;
                    let ch = match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi)
                                && self.s.get(self.i..self.i + 2) == Some(b"\\u")
                            {
                                self.i += 2;
                                let lo = self.hex4()?;
                                0x10000 + ((hi - 0xd800) << 10) + lo.wrapping_sub(0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(code).unwrap_or('\u{fffd}')
                        }
                        other => other as char,
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(c),
            }
        }
        String::from_utf8(out).context("JSON: a string is not UTF-8")
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .with_context(|| format!("JSON: bad \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(digits)
    }
}

/// spanprof's `--stats` file, its stack counts summed over its processes (the one target here).
#[derive(Debug, Clone, Default)]
struct StackStats {
    /// `dwarf` or `fp`: what spanprof says it did.
    unwind: String,
    /// Bytes of user stack copied per sample (0 with frame pointers).
    stack_copy_bytes: u64,
    complete: u64,
    truncated: u64,
    failed: u64,
    unchecked: u64,
    /// Samples per reason, for truncated and failed stacks.
    reasons: BTreeMap<String, u64>,
}

impl StackStats {
    fn add(&mut self, o: &Self) {
        self.complete += o.complete;
        self.truncated += o.truncated;
        self.failed += o.failed;
        self.unchecked += o.unchecked;
        for (reason, n) in &o.reasons {
            *self.reasons.entry(reason.clone()).or_default() += n;
        }
    }

    fn total(&self) -> u64 {
        self.complete + self.truncated + self.failed + self.unchecked
    }
}

/// `{"unwind":"dwarf","stack_copy_bytes":16384,"processes":[{"pid":…,"name":…,"samples":…,
/// "stacks":{"complete":…,"truncated":…,"failed":…,"unchecked":…,"reasons":{…}}}]}`.
fn parse_stack_stats(text: &str) -> Result<StackStats> {
    let json = Json::parse(text)?;
    let mut s = StackStats {
        unwind: json
            .get("unwind")
            .and_then(Json::as_str)
            .context("no \"unwind\"")?
            .to_string(),
        stack_copy_bytes: json
            .get("stack_copy_bytes")
            .and_then(Json::as_u64)
            .unwrap_or(0),
        ..StackStats::default()
    };
    let Some(Json::Arr(processes)) = json.get("processes") else {
        bail!("no \"processes\" array");
    };
    for p in processes {
        let stacks = p.get("stacks").context("a process without \"stacks\"")?;
        let count = |key: &str| {
            stacks
                .get(key)
                .and_then(Json::as_u64)
                .with_context(|| format!("no \"{key}\" count"))
        };
        let mut one = StackStats {
            complete: count("complete")?,
            truncated: count("truncated")?,
            failed: count("failed")?,
            unchecked: count("unchecked")?,
            ..StackStats::default()
        };
        if let Some(Json::Obj(reasons)) = stacks.get("reasons") {
            for (reason, n) in reasons {
                one.reasons.insert(reason.clone(), n.as_u64().unwrap_or(0));
            }
        }
        s.add(&one);
    }
    Ok(s)
}

/// One run of the unwind target under spanprof.
#[derive(Debug, Default)]
struct UnwindSpanprofRun {
    run: SpanprofRun,
    shape: UnwindShape,
    stats: StackStats,
}

/// One run of the unwind target under `perf record --call-graph dwarf`, then `perf script`.
#[derive(Debug, Default)]
struct UnwindPerfRun {
    run: OtherRun,
    /// Size of perf.data.
    data_bytes: u64,
    /// `perf script`'s own resource usage.
    script: Usage,
    shape: UnwindShape,
}

#[derive(Debug, Default)]
struct UnwindRound {
    alone: TargetRun,
    dwarf: UnwindSpanprofRun,
    fp: UnwindSpanprofRun,
    perf: UnwindPerfRun,
}

/// cpu_split_nofp alone, under spanprof --unwind dwarf, spanprof --unwind fp and perf record
/// --call-graph dwarf, interleaved; the markdown of their figures.
fn unwind(spanprof: &Path, workloads: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let program = workloads.join(UNWIND_TARGET);
    if !program.is_file() {
        bail!(
            "{} is missing (`cargo xtask workloads` builds it)",
            program.display()
        );
    }
    let perf_version = version(Path::new("perf"), &["--version"])
        .context("perf (Debian package linux-perf) is needed")?;
    let target = Target {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), GATE.into(), program.into_os_string()],
        env: Vec::new(),
    };
    let (seconds, n) = (cfg.unwind_seconds, cfg.rounds);
    let spanprof_run = |mode: &str| -> Result<UnwindSpanprofRun> {
        let out = out_dir.join(format!("unwind_{mode}.folded"));
        let stats_path = out_dir.join(format!("unwind_{mode}.stats.json"));
        // A stale file from an earlier run must not pass for this run's.
        let _ = std::fs::remove_file(&stats_path);
        let stats_arg = stats_path.to_string_lossy().into_owned();
        let extra = ["--unwind", mode, "--stats", stats_arg.as_str()];
        let run = run_spanprof(spanprof, &target, seconds, UNWIND_HZ, &extra, &out)?;
        let folded = std::fs::read_to_string(&out)
            .with_context(|| format!("failed to read {}", out.display()))?;
        let stats_text = std::fs::read_to_string(&stats_path)
            .with_context(|| format!("spanprof wrote no {}", stats_path.display()))?;
        let stats = parse_stack_stats(&stats_text)
            .with_context(|| format!("failed to parse {}", stats_path.display()))?;
        if stats.unwind != mode {
            bail!(
                "spanprof --unwind {mode} says it unwound with `{}` in {}",
                stats.unwind,
                stats_path.display()
            );
        }
        Ok(UnwindSpanprofRun {
            run,
            shape: unwind_shape(folded_stacks(&folded)),
            stats,
        })
    };
    let perf_run = || -> Result<UnwindPerfRun> {
        let data = out_dir.join("unwind_perf.data");
        let run = run_perf(
            &target,
            seconds,
            UNWIND_HZ,
            &["--call-graph", "dwarf"],
            &data,
        )?;
        let data_bytes = std::fs::metadata(&data)
            .with_context(|| format!("perf wrote no {}", data.display()))?
            .len();
        let (script, stacks) = perf_script(
            &data,
            &out_dir.join("unwind_perf.folded"),
            &out_dir.join("unwind_perf_script.err"),
        )?;
        Ok(UnwindPerfRun {
            run,
            data_bytes,
            script,
            shape: unwind_shape(stacks.iter().map(|(s, n)| (s.as_str(), *n))),
        })
    };
    let results = rounds("unwind", n, |i| {
        let mut r = UnwindRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            r.alone = run_alone(&target, seconds)?;
            r.dwarf = spanprof_run("dwarf")?;
            r.fp = spanprof_run("fp")?;
            r.perf = perf_run()?;
        } else {
            r.perf = perf_run()?;
            r.fp = spanprof_run("fp")?;
            r.dwarf = spanprof_run("dwarf")?;
            r.alone = run_alone(&target, seconds)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("unwind_rounds.txt"), format!("{results:#?}\n"))?;
    Ok(unwind_table(&results, cfg, &perf_version))
}

/// The markdown of the unwind part's figures.
fn unwind_table(results: &[UnwindRound], cfg: &Config, perf_version: &str) -> String {
    let (seconds, n) = (cfg.unwind_seconds, cfg.rounds);
    let med = |f: &dyn Fn(&UnwindRound) -> f64| median(results.iter().map(f).collect());
    let us = |ns: f64| ns / 1000.0;
    // The work of a CPU-bound target that runs a fixed time is its user CPU time.
    let slowdown = |t: &dyn Fn(&UnwindRound) -> TargetRun| {
        med(&|r| secs(r.alone.user) / secs(t(r).user).max(1e-9))
    };
    let alone_user = med(&|r| secs(r.alone.user));
    let alone_wall = med(&|r| secs(r.alone.wall));

    // spanprof's two modes: one column each.
    struct SpanprofColumn {
        samples: f64,
        lost: u64,
        shape: UnwindShape,
        stats: StackStats,
        slowdown: f64,
        bpf: Option<BpfFigures>,
        own_us: f64,
        loop_us: f64,
        rss: u64,
    }
    let column = |get: fn(&UnwindRound) -> &UnwindSpanprofRun| {
        let mut shape = UnwindShape::default();
        let mut stats = StackStats::default();
        for r in results {
            shape.add(&get(r).shape);
            stats.add(&get(r).stats);
        }
        stats.stack_copy_bytes = results.first().map_or(0, |r| get(r).stats.stack_copy_bytes);
        let windows: Vec<BpfWindow> = results.iter().filter_map(|r| get(r).run.bpf).collect();
        SpanprofColumn {
            samples: med(&|r| get(r).run.samples as f64),
            lost: results.iter().map(|r| get(r).run.lost).sum(),
            shape,
            stats,
            slowdown: slowdown(&|r| get(r).run.target),
            bpf: bpf_figures(&windows),
            own_us: med(&|r| per_sample_us(get(r).run.own.cpu, get(r).run.samples)),
            loop_us: med(&|r| get(r).run.loop_us),
            rss: results
                .iter()
                .map(|r| get(r).run.own.max_rss_kib)
                .max()
                .unwrap_or(0),
        }
    };
    let cols = [column(|r| &r.dwarf), column(|r| &r.fp)];
    let mut perf_shape = UnwindShape::default();
    for r in results {
        perf_shape.add(&r.perf.shape);
    }
    let perf_samples = med(&|r| r.perf.run.samples as f64);
    let perf_slowdown = slowdown(&|r| r.perf.run.target);
    let record_us = med(&|r| per_sample_us(r.perf.run.own.cpu, r.perf.run.samples));
    let script_us = med(&|r| per_sample_us(r.perf.script.cpu, r.perf.run.samples));
    let perf_total_us =
        med(&|r| per_sample_us(r.perf.run.own.cpu + r.perf.script.cpu, r.perf.run.samples));
    let bytes = med(&|r| r.perf.data_bytes as f64 / r.perf.run.samples.max(1) as f64);
    let record_rss = results.iter().map(|r| r.perf.run.own.max_rss_kib).max();
    let script_rss = results.iter().map(|r| r.perf.script.max_rss_kib).max();

    let full =
        |s: &UnwindShape| format!("{:.1}% ({} of {})", percent(s.full, s.work), s.full, s.work);
    let rooted = |s: &UnwindShape| {
        format!(
            "{:.1}% ({} of {})",
            percent(s.rooted, s.work),
            s.rooted,
            s.work
        )
    };
    let alpha = |s: &UnwindShape| format!("{:.1}%", percent(s.alpha, s.alpha + s.beta));
    let depth = |s: &UnwindShape| format!("{:.2}", s.user_frames as f64 / s.samples.max(1) as f64);
    let verdict = |s: &StackStats| {
        let t = s.total();
        format!(
            "{:.1}% / {:.1}% / {:.1}% / {:.1}%",
            percent(s.complete, t),
            percent(s.truncated, t),
            percent(s.failed, t),
            percent(s.unchecked, t)
        )
    };
    let reasons = |s: &StackStats| {
        let mut r: Vec<(&String, &u64)> = s.reasons.iter().filter(|(_, &n)| n > 0).collect();
        r.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        if r.is_empty() {
            "none".to_string()
        } else {
            r.iter()
                .map(|(reason, n)| format!("{reason}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let bpf_cell = |c: &SpanprofColumn| match &c.bpf {
        Some(b) => format!("{:.2} µs ({} samples)", us(b.net_ns), b.target_samples),
        None => "not read".to_string(),
    };
    let total_cell = |c: &SpanprofColumn| match &c.bpf {
        Some(b) => format!("**{:.1} µs**", us(b.net_ns) + c.own_us),
        None => format!("≥ {:.1} µs (in-kernel not read)", c.own_us),
    };
    let [d, f] = &cols;
    let row =
        |label: &str, d: String, f: String, p: String| format!("| {label} | {d} | {f} | {p} |\n");
    let mut table = String::new();
    table += &row(
        "samples per run (median); lost, all rounds",
        format!("{:.0}; {} lost", d.samples, d.lost),
        format!("{:.0}; {} lost", f.samples, f.lost),
        format!("{perf_samples:.0}"),
    );
    table += &row(
        "**samples of the work with the whole path main;dispatcher;hot_\\*** (of those with dispatcher, hot_alpha or hot_beta; all rounds)",
        format!("**{}**", full(&d.shape)),
        format!("**{}**", full(&f.shape)),
        format!("**{}**", full(&perf_shape)),
    );
    table += &row(
        "the same, the stack also starting at the process's root (`_start`)",
        rooted(&d.shape),
        rooted(&f.shape),
        rooted(&perf_shape),
    );
    table += &row(
        "spanprof's own verdict (`--stats`, all rounds): complete / truncated / failed / unchecked",
        verdict(&d.stats),
        verdict(&f.stats),
        "n/a".to_string(),
    );
    table += &row(
        "reasons of truncated and failed stacks (`--stats`, samples, all rounds)",
        reasons(&d.stats),
        reasons(&f.stats),
        "n/a".to_string(),
    );
    table += &row(
        "hot_alpha's share of the samples whose leaf is hot_alpha or hot_beta (75% by construction)",
        alpha(&d.shape),
        alpha(&f.shape),
        alpha(&perf_shape),
    );
    table += &row(
        "mean user-stack depth, frames per sample (as each tool prints them, inlined frames included)",
        depth(&d.shape),
        depth(&f.shape),
        depth(&perf_shape),
    );
    table += &row(
        &format!("target's work, alone / profiled (user CPU time in its {seconds} s; median of {n} interleaved rounds)"),
        format!("{:.4}", d.slowdown),
        format!("{:.4}", f.slowdown),
        format!("{perf_slowdown:.4}"),
    );
    table += &row(
        "in-kernel time per target sample, net of the runs for other processes (BPF statistics, all rounds)",
        bpf_cell(d),
        bpf_cell(f),
        "n/a (perf copies the stack in the target's interrupt)".to_string(),
    );
    table += &row(
        "profiler's own CPU per sample, whole process (spanprof; perf record) (median)",
        format!("{:.1} µs", d.own_us),
        format!("{:.1} µs", f.own_us),
        format!("{record_us:.1} µs"),
    );
    table += &row(
        "spanprof's own CPU per sample in its sampling loop, as it reports it (median)",
        format!("{:.1} µs", d.loop_us),
        format!("{:.1} µs", f.loop_us),
        "n/a".to_string(),
    );
    table += &row(
        "`perf script`'s CPU per sample: DWARF unwinding and symbolization (median)",
        "n/a".to_string(),
        "n/a".to_string(),
        format!("{script_us:.1} µs"),
    );
    table += &row(
        "**CPU per sample, all told**: spanprof in-kernel + whole process; perf record + perf script (median)",
        total_cell(d),
        total_cell(f),
        format!("**{perf_total_us:.1} µs** + its in-kernel copy, not measured"),
    );
    table += &row(
        "bytes written per sample (perf.data size / samples, median)",
        "n/a".to_string(),
        "n/a".to_string(),
        format!("{bytes:.0} B"),
    );
    table += &row(
        "peak RSS (max): spanprof; perf record / perf script",
        format!("{:.1} MB", mb(d.rss)),
        format!("{:.1} MB", mb(f.rss)),
        format!(
            "{:.1} / {:.1} MB",
            mb(record_rss.unwrap_or(0)),
            mb(script_rss.unwrap_or(0))
        ),
    );

    format!(
        "Method: `tests/workloads/cpu_split.c` built by `cargo xtask workloads` without frame \
         pointers as `{UNWIND_TARGET}` (`-O2 -g -fomit-frame-pointer -momit-leaf-frame-pointer`): \
         main → dispatcher → hot_alpha (75% of the work) / hot_beta (25%). It works for a fixed \
         time and waits for nothing, so each run starts it behind a shell that prints its pid, \
         waits for the release and execs it (the pid stays): the profiler attaches to that pid \
         (`--pid`/`-p`) and follows the exec, and the {seconds} s of work start at the release in \
         every configuration. Each round runs it alone, under `spanprof profile --unwind dwarf` \
         (the kernel copies {} bytes of user stack per sample, spanprof unwinds them with \
         `.eh_frame`), `spanprof profile --unwind fp` (the kernel follows frame pointers) and \
         `perf record --call-graph dwarf` ({PERF_STACK_DUMP} bytes per sample, unwound by \
         `perf script`), all at {UNWIND_HZ} Hz of cpu-clock, the order reversed every other \
         round. Stacks: spanprof's folded output (`-o x.folded`) and `perf script`'s output \
         folded by the bench, kernel frames left out; a sample of the work is one whose user \
         stack has dispatcher, hot_alpha or hot_beta, and it has the whole path when its user \
         stack ends main;dispatcher;hot_alpha or main;dispatcher;hot_beta (or main;dispatcher). \
         Costs: spanprof's in-kernel time per target sample as in the native block (BPF \
         statistics, net of the runs for other processes) plus its whole-process CPU \
         (`wait4`) per sample; `perf record`'s and `perf script`'s own CPU (`wait4`) per sample \
         (perf copies the stack into its buffer in the target's interrupt, which is not \
         measured apart and shows at most in the target's work). The target's work is its user \
         CPU time in the fixed time, so the slowdown is alone / profiled.\n\n\
         Run of `cargo xtask bench --only unwind --rounds {n} --unwind-seconds {seconds}` on {}, \
         {perf_version}: target `{UNWIND_TARGET}` alone {alone_user:.2} s user CPU in \
         {alone_wall:.2} s (medians).\n\n\
         | figure | spanprof --unwind dwarf | spanprof --unwind fp | perf record --call-graph dwarf |\n\
         |---|---|---|---|\n\
         {table}",
        d.stats.stack_copy_bytes,
        machine(),
    )
}

// ---------------------------------------------------------------------------
// Off-CPU (`--only offcpu`): what `--event offcpu` costs a context-switch-heavy target
// ---------------------------------------------------------------------------

/// The off-CPU part's target (built by `cargo xtask workloads` from
/// `xtask/workloads/offcpu_pingpong.c`) and its round trips per run.
const OFFCPU_TARGET: &str = "offcpu_pingpong";
const OFFCPU_ROUND_TRIPS: u64 = 200_000;
/// spanprof's off-CPU programs: `tp_btf/sched_switch` (every context switch on the machine) and
/// `tp_btf/sys_exit` (every system call exit; sends the off-CPU samples).
const ON_SWITCH: &str = "on_switch";
const ON_SYS_EXIT: &str = "on_sys_exit";
/// perf's tracepoint for the side-by-side: one record with a frame-pointer call graph per
/// switch out of a target thread.
const PERF_SWITCH_EVENT: &str = "sched:sched_switch";

/// A BPF program of a spanprof process, opened by id from the fds it holds (as
/// [`SamplingProg`]), so its counters stay readable once spanprof detached.
pub(crate) struct NamedProg {
    pub(crate) name: String,
    fd: OwnedFd,
}

impl NamedProg {
    /// Every BPF program among the fds of process `pid`, by name, each once.
    pub(crate) fn all_of(pid: u32) -> Vec<Self> {
        const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
        const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
        let mut ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .map(|dir| {
                dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .filter(|text| fdinfo_field(text, "prog_type").is_some())
                    .filter_map(|text| fdinfo_field(&text, "prog_id")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        let mut progs: Vec<Self> = Vec::new();
        for id in ids {
            // union bpf_attr for BPF_PROG_GET_FD_BY_ID: prog_id, next_id, open_flags.
            let attr: [u32; 3] = [id, 0, 0];
            // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives for the call.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_PROG_GET_FD_BY_ID,
                    attr.as_ptr(),
                    std::mem::size_of_val(&attr),
                )
            };
            if fd < 0 {
                continue;
            }
            // SAFETY: a non-negative return is a new fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // struct bpf_prog_info up to its `name` (char[16] at byte 64): the kernel fills
            // `info_len` bytes of it.
            let mut info = [0u8; 80];
            // union bpf_attr for BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info (a pointer).
            #[repr(C)]
            struct InfoAttr {
                bpf_fd: u32,
                info_len: u32,
                info: u64,
            }
            let attr = InfoAttr {
                bpf_fd: fd.as_raw_fd() as u32,
                info_len: info.len() as u32,
                info: info.as_mut_ptr() as u64,
            };
            // SAFETY: bpf(2) reads `attr` and writes at most `info_len` bytes to `info`; both
            // live for the call.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_OBJ_GET_INFO_BY_FD,
                    &attr as *const InfoAttr,
                    std::mem::size_of::<InfoAttr>(),
                )
            };
            if r != 0 {
                continue;
            }
            let name = &info[64..80];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let name = String::from_utf8_lossy(&name[..len]).into_owned();
            if !progs.iter().any(|p| p.name == name) {
                progs.push(Self { name, fd });
            }
        }
        progs
    }

    /// (run_time_ns, run_cnt), as [`SamplingProg::stats`].
    pub(crate) fn stats(&self) -> Option<(u64, u64)> {
        let text =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.fd.as_raw_fd())).ok()?;
        Some((
            fdinfo_field(&text, "run_time_ns")?.parse().ok()?,
            fdinfo_field(&text, "run_cnt")?.parse().ok()?,
        ))
    }
}

/// One program's counters over the two intervals of a spanprof run (see [`BpfWindow`]): 1 s
/// with the target blocked on its gate, then from the release to the target's exit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProgWindow {
    pub(crate) idle_ns: u64,
    pub(crate) idle_runs: u64,
    pub(crate) ns: u64,
    pub(crate) runs: u64,
}

impl ProgWindow {
    /// From a program's (run_time_ns, run_cnt) at the start of the idle interval, at the
    /// release, and at the end.
    pub(crate) fn between(start: (u64, u64), release: (u64, u64), end: (u64, u64)) -> Self {
        ProgWindow {
            idle_ns: release.0 - start.0,
            idle_runs: release.1 - start.1,
            ns: end.0 - release.0,
            runs: end.1 - release.1,
        }
    }
}

/// What `offcpu_pingpong` says of its loop.
#[derive(Debug, Clone, Copy, Default)]
struct PingPong {
    round_trips: u64,
    /// The loop's wall time (CLOCK_MONOTONIC around it).
    seconds: f64,
    /// Context switches of the process (every thread) during the loop, from getrusage.
    voluntary: u64,
    involuntary: u64,
}

impl PingPong {
    fn switches_per_second(&self) -> f64 {
        (self.voluntary + self.involuntary) as f64 / self.seconds
    }
}

/// Parses the target's JSON line.
fn parse_pingpong(text: &str) -> Result<PingPong> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{OFFCPU_TARGET} printed no JSON line: {text:?}"))?;
    let json = Json::parse(line)?;
    let int = |key: &str| {
        json.get(key)
            .and_then(Json::as_u64)
            .with_context(|| format!("no integer {key} in {line}"))
    };
    let seconds = match json.get("seconds") {
        Some(Json::Num(s)) if *s > 0.0 => *s,
        _ => bail!("no positive seconds in {line}"),
    };
    Ok(PingPong {
        round_trips: int("round_trips")?,
        seconds,
        voluntary: int("voluntary_switches")?,
        involuntary: int("involuntary_switches")?,
    })
}

impl Gated {
    /// Like [`Gated::wait`], then the target's JSON line (what it printed after its pid),
    /// which must say it made the [`OFFCPU_ROUND_TRIPS`] it was asked for.
    fn wait_pingpong(&mut self, released: Instant) -> Result<(TargetRun, PingPong)> {
        let run = self.wait(released)?;
        let mut text = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            stdout.read_to_string(&mut text)?;
        }
        let pingpong = parse_pingpong(&text)?;
        if pingpong.round_trips != OFFCPU_ROUND_TRIPS {
            bail!(
                "{OFFCPU_TARGET} made {} round trips, not {OFFCPU_ROUND_TRIPS}",
                pingpong.round_trips
            );
        }
        Ok((run, pingpong))
    }
}

/// The off-CPU stacks of a folded output weighed in nanoseconds, by root frame
/// (`[off-cpu: io]`, …; other roots are on-CPU stacks, under `on-CPU`).
fn offcpu_by_reason(path: &Path) -> Result<BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in folded_stacks(&text) {
        let root = stack.split(';').next().unwrap_or("");
        let key = root
            .strip_prefix("[off-cpu: ")
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or("on-CPU");
        *by_reason.entry(key.to_string()).or_default() += n;
    }
    Ok(by_reason)
}

/// One run of the ping-pong target alone or under a profiler.
#[derive(Debug, Default)]
struct OffcpuRun {
    target: TargetRun,
    pingpong: PingPong,
    /// The profiler's own resource usage.
    own: Usage,
}

/// One run under `spanprof profile --event offcpu`.
#[derive(Debug, Default)]
struct OffcpuSpanprofRun {
    run: OffcpuRun,
    /// Every program spanprof held, by name.
    progs: BTreeMap<String, ProgWindow>,
    /// What the summary's first line says was recorded (`500.5 ms off-CPU`), and lost samples.
    recorded: String,
    lost: u64,
    /// The off-CPU lines of the summary, as printed.
    summary: Vec<String>,
    /// Nanoseconds by reason (and `on-CPU`), from the folded output.
    by_reason: BTreeMap<String, u64>,
}

/// One run under `perf record -e sched:sched_switch -g`.
#[derive(Debug, Default)]
struct OffcpuPerfRun {
    run: OffcpuRun,
    samples: u64,
    data_bytes: u64,
}

#[derive(Debug, Default)]
struct OffcpuRound {
    alone: OffcpuRun,
    spanprof: OffcpuSpanprofRun,
    perf: OffcpuPerfRun,
}

fn run_pingpong_alone(target: &Target) -> Result<OffcpuRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let released = t.release()?;
    let (target, pingpong) = t.wait_pingpong(released)?;
    Ok(OffcpuRun {
        target,
        pingpong,
        own: Usage::default(),
    })
}

/// `spanprof profile --event offcpu --pid PID -o OUT` (folded) on the gated target, with the
/// counters of each of its programs read as in [`run_spanprof`].
fn run_spanprof_offcpu(spanprof: &Path, target: &Target, out: &Path) -> Result<OffcpuSpanprofRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let mut prof = Command::new(spanprof)
        .args([
            "profile",
            "--event",
            "offcpu",
            "--frequency",
            &HZ.to_string(),
            "--pid",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start spanprof")?;
    let mut err = wait_ready(prof.stderr.take().expect("piped"), "spanprof: profiling")?;
    let progs = NamedProg::all_of(prof.id());
    let stats = || -> Vec<Option<(u64, u64)>> { progs.iter().map(NamedProg::stats).collect() };
    let idle_start = stats();
    std::thread::sleep(Duration::from_secs(1));
    let window_start = stats();
    let released = t.release()?;
    let target_run = t.wait_pingpong(released);
    let window_end = stats();
    let mut rest = String::new();
    err.read_to_string(&mut rest)?;
    let (status, own) = wait_usage(&mut prof)?;
    let (target_run, pingpong) = target_run?;
    if status != 0 {
        bail!("spanprof failed (status {status}):\n{rest}");
    }
    let names: Vec<&str> = progs.iter().map(|p| p.name.as_str()).collect();
    if !names.contains(&ON_SWITCH) || !names.contains(&ON_SYS_EXIT) {
        bail!(
            "spanprof --event offcpu holds no {ON_SWITCH} and {ON_SYS_EXIT} programs (it holds \
             {names:?})"
        );
    }
    let mut windows = BTreeMap::new();
    for (i, prog) in progs.iter().enumerate() {
        if let (Some(a), Some(b), Some(c)) = (idle_start[i], window_start[i], window_end[i]) {
            windows.insert(prog.name.clone(), ProgWindow::between(a, b, c));
        }
    }
    // "spanprof: 500.5 ms off-CPU, 0 lost, from 1 process in …": what was recorded, then the
    // lost samples.
    let (recorded, lost) = rest
        .lines()
        .find_map(|l| {
            let (head, _) = l.strip_prefix("spanprof: ")?.split_once(" lost, from ")?;
            let (recorded, lost) = head.rsplit_once(", ")?;
            Some((recorded.to_string(), lost.parse::<u64>().ok()?))
        })
        .with_context(|| format!("spanprof printed no summary line with a lost count:\n{rest}"))?;
    let summary = rest
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("off-cpu"))
        .map(str::to_string)
        .collect();
    Ok(OffcpuSpanprofRun {
        run: OffcpuRun {
            target: target_run,
            pingpong,
            own,
        },
        progs: windows,
        recorded,
        lost,
        summary,
        by_reason: offcpu_by_reason(out)?,
    })
}

/// `perf record -e sched:sched_switch -g -p PID -o OUT` on the gated target.
fn run_perf_switch(target: &Target, out: &Path) -> Result<OffcpuPerfRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-e",
            PERF_SWITCH_EVENT,
            "-g",
            "-p",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    // perf prints nothing when it is attached; give it time, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    let released = t.release()?;
    let (target_run, pingpong) = t.wait_pingpong(released)?;
    let mut text = String::new();
    perf.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (_, own) = wait_usage(&mut perf)?;
    let samples = text
        .rsplit_once(" samples)")
        .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
        .with_context(|| format!("perf printed no sample count:\n{text}"))?;
    let data_bytes = std::fs::metadata(out)
        .with_context(|| format!("perf wrote no {}", out.display()))?
        .len();
    Ok(OffcpuPerfRun {
        run: OffcpuRun {
            target: target_run,
            pingpong,
            own,
        },
        samples,
        data_bytes,
    })
}

/// offcpu_pingpong alone, under `spanprof --event offcpu` and under `perf record -e
/// sched:sched_switch -g`, interleaved; the markdown of their figures.
fn offcpu(spanprof: &Path, workloads: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let program = workloads.join(OFFCPU_TARGET);
    if !program.is_file() {
        bail!(
            "{} is missing (`cargo xtask workloads` builds it)",
            program.display()
        );
    }
    let perf_version = version(Path::new("perf"), &["--version"])
        .context("perf (Debian package linux-perf) is needed")?;
    let cpu = offcpu_cpu();
    let target = Target {
        program,
        args: vec!["--cpu".into(), cpu.to_string().into()],
        env: Vec::new(),
    };
    let sp_out = out_dir.join("offcpu.folded");
    let perf_out = out_dir.join("offcpu_perf.data");
    let n = cfg.rounds;
    let results = rounds("offcpu", n, |i| {
        let mut r = OffcpuRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            r.alone = run_pingpong_alone(&target)?;
            r.spanprof = run_spanprof_offcpu(spanprof, &target, &sp_out)?;
            r.perf = run_perf_switch(&target, &perf_out)?;
        } else {
            r.perf = run_perf_switch(&target, &perf_out)?;
            r.spanprof = run_spanprof_offcpu(spanprof, &target, &sp_out)?;
            r.alone = run_pingpong_alone(&target)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("offcpu_rounds.txt"), format!("{results:#?}\n"))?;
    Ok(offcpu_table(&results, cfg, &perf_version))
}

/// The CPU both threads of the ping-pong are pinned to: the last one, so that the first one is
/// left to the profilers (their own threads are not pinned). Pinned, each round trip is two
/// switches from one thread to the other, and the loop's time is steady; left to the scheduler
/// on these 2-CPU VMs it takes 1 s or 8 s depending on whether the threads share a CPU.
fn offcpu_cpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
}

/// The markdown of the off-CPU part's figures.
fn offcpu_table(results: &[OffcpuRound], cfg: &Config, perf_version: &str) -> String {
    let n = cfg.rounds;
    let trips = OFFCPU_ROUND_TRIPS as f64;
    let med = |f: &dyn Fn(&OffcpuRound) -> f64| median(results.iter().map(f).collect());
    let loop_secs = |r: &OffcpuRun| r.pingpong.seconds;
    let alone_secs = med(&|r| loop_secs(&r.alone));
    let alone_rate = med(&|r| r.alone.pingpong.switches_per_second());
    let alone_cpu = med(&|r| secs(r.alone.target.cpu));
    let vol_per_trip = med(&|r| r.alone.pingpong.voluntary as f64 / trips);
    let invol_per_trip = med(&|r| r.alone.pingpong.involuntary as f64 / trips);

    // Per configuration: (wall ratio, CPU ratio, µs added per round trip, switches per second).
    let ratios = |run: &dyn Fn(&OffcpuRound) -> &OffcpuRun| {
        (
            med(&|r| loop_secs(run(r)) / loop_secs(&r.alone)),
            med(&|r| secs(run(r).target.cpu) / secs(r.alone.target.cpu)),
            med(&|r| (loop_secs(run(r)) - loop_secs(&r.alone)) * 1e6 / trips),
            med(&|r| run(r).pingpong.switches_per_second()),
        )
    };
    let (sp_wall, sp_cpu, sp_added, sp_rate) = ratios(&|r| &r.spanprof.run);
    let (perf_wall, perf_cpu, perf_added, perf_rate) = ratios(&|r| &r.perf.run);

    // In-kernel: each program's counters summed over the rounds, then divided.
    let prog = |name: &str| {
        let mut sum = ProgWindow::default();
        for r in results {
            if let Some(w) = r.spanprof.progs.get(name) {
                sum.idle_ns += w.idle_ns;
                sum.idle_runs += w.idle_runs;
                sum.ns += w.ns;
                sum.runs += w.runs;
            }
        }
        sum
    };
    let per_run = |ns: u64, runs: u64| {
        if runs == 0 {
            "n/a".to_string()
        } else {
            format!("{:.3} µs", ns as f64 / runs as f64 / 1000.0)
        }
    };
    let switch = prog(ON_SWITCH);
    let sys_exit = prog(ON_SYS_EXIT);
    let window_secs: f64 = results
        .iter()
        .map(|r| secs(r.spanprof.run.target.wall))
        .sum();
    let machine_switch_rate = switch.runs as f64 / window_secs.max(1e-9);
    let kernel_per_trip = (switch.ns + sys_exit.ns) as f64 / (trips * n as f64) / 1000.0;
    // Other programs that ran in the windows (e.g. an on-CPU sampling program).
    let mut others = Vec::new();
    let mut names: Vec<&String> = results
        .iter()
        .flat_map(|r| r.spanprof.progs.keys())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        if name != ON_SWITCH && name != ON_SYS_EXIT {
            let w = prog(name);
            if w.runs > 0 {
                others.push(format!(
                    "`{name}` {} runs, {}",
                    w.runs,
                    per_run(w.ns, w.runs)
                ));
            }
        }
    }
    let others = if others.is_empty() {
        "none".to_string()
    } else {
        others.join("; ")
    };

    // Off-CPU time spanprof recorded, by reason.
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    for r in results {
        for (reason, ns) in &r.spanprof.by_reason {
            *by_reason.entry(reason.clone()).or_default() += ns;
        }
    }
    let recorded: u64 = by_reason
        .iter()
        .filter(|(k, _)| k.as_str() != "on-CPU")
        .map(|(_, v)| v)
        .sum();
    let reasons = by_reason
        .iter()
        .filter(|(k, _)| k.as_str() != "on-CPU")
        .map(|(k, v)| format!("{k} {:.1}%", percent(*v, recorded)))
        .collect::<Vec<_>>()
        .join(", ");
    let lost: u64 = results.iter().map(|r| r.spanprof.lost).sum();
    let summary = results
        .last()
        .map(|r| r.spanprof.summary.join(" / "))
        .unwrap_or_default();

    let sp_own = med(&|r| secs(r.spanprof.run.own.cpu) * 1e6 / trips);
    let perf_own = med(&|r| secs(r.perf.run.own.cpu) * 1e6 / trips);
    let sp_own_total = med(&|r| secs(r.spanprof.run.own.cpu));
    let perf_own_total = med(&|r| secs(r.perf.run.own.cpu));
    let sp_rss = results
        .iter()
        .map(|r| r.spanprof.run.own.max_rss_kib)
        .max()
        .unwrap_or(0);
    let perf_rss = results
        .iter()
        .map(|r| r.perf.run.own.max_rss_kib)
        .max()
        .unwrap_or(0);
    let perf_samples = med(&|r| r.perf.samples as f64);
    let perf_bytes = med(&|r| r.perf.data_bytes as f64 / trips);

    format!(
        "Method: `xtask/workloads/{OFFCPU_TARGET}.c` (built by `cargo xtask workloads`, frame \
         pointers): two threads pass a byte back and forth through two pipes, \
         {OFFCPU_ROUND_TRIPS} round trips per run, each hop waking the other thread and blocking \
         the writer in a read of an empty pipe, both threads pinned to CPU {} (`--cpu`: two \
         switches per round trip from one thread straight to the other; unpinned, the loop takes \
         1 s or 8 s on these VMs depending on whether the threads share a CPU). It is gated like `fixed_work` and times its loop \
         itself (CLOCK_MONOTONIC), with the context switches of its threads in the loop \
         (getrusage). Each round runs it alone, under `spanprof profile --event offcpu \
         --frequency {HZ} --pid` (folded output) and under `perf record -e {PERF_SWITCH_EVENT} -g \
         -p` (one record with a frame-pointer call graph per switch out of a target thread, the \
         classic off-CPU recipe), the order reversed every other round. Slowdowns are medians \
         of the per-round ratios (loop wall time; target CPU time from `wait4`). In-kernel: the \
         run_time_ns and run_cnt of spanprof's `{ON_SWITCH}` (tp_btf/sched_switch: runs on every \
         context switch of the machine) and `{ON_SYS_EXIT}` (tp_btf/sys_exit: every system call \
         exit; sends the off-CPU sample of a thread whose blocked interval was sampled), read \
         from the spawned spanprof's own program fds (`kernel.bpf_stats_enabled=1`) once \
         attached, 1 s later with the target still blocked on its gate (the runs for other \
         processes), and when the target exits; summed over the rounds, then divided by the \
         runs.\n\n\
         Run of `cargo xtask bench --only offcpu --rounds {n}` on {}, {perf_version}: target \
         `{OFFCPU_TARGET}` alone {alone_secs:.3} s for {OFFCPU_ROUND_TRIPS} round trips \
         ({:.2} µs each), {alone_cpu:.2} s CPU, {alone_rate:.0} context switches per second of \
         its threads ({vol_per_trip:.2} voluntary and {invol_per_trip:.2} involuntary per round \
         trip) (medians).\n\n\
         | figure | spanprof --event offcpu | perf record -e {PERF_SWITCH_EVENT} -g | goal |\n\
         |---|---|---|---|\n\
         | loop wall time, profiled / alone (median of {n} interleaved rounds) | {sp_wall:.3} | {perf_wall:.3} | |\n\
         | target CPU time, profiled / alone (median) | {sp_cpu:.3} | {perf_cpu:.3} | |\n\
         | wall time added per round trip, profiled − alone (median) | {sp_added:.2} µs | {perf_added:.2} µs | |\n\
         | context switches per second of the target's threads (median; alone {alone_rate:.0}) | {sp_rate:.0} | {perf_rate:.0} | |\n\
         | **in-kernel time per `{ON_SWITCH}` run** while the target ran ({} runs, {machine_switch_rate:.0} switches/s on the machine) | **{}** | n/a | ≤ 1 µs |\n\
         | the same while the target was blocked (other processes' switches, {} runs) | {} | n/a | |\n\
         | in-kernel time per `{ON_SYS_EXIT}` run while the target ran ({} runs) | {} | n/a | |\n\
         | the same while the target was blocked ({} runs) | {} | n/a | |\n\
         | in-kernel time of both programs per round trip, while the target ran | {kernel_per_trip:.2} µs | n/a | |\n\
         | other programs that ran while the target ran | {others} | n/a | |\n\
         | off-CPU time recorded, by reason (folded output, all rounds) | {reasons} | n/a | |\n\
         | recorded per run (summary, last round); samples lost, all rounds | {}; {lost} lost | {perf_samples:.0} records per run (median) | |\n\
         | profiler's own CPU, whole process (median); per round trip | {sp_own_total:.3} s; {sp_own:.2} µs | {perf_own_total:.3} s; {perf_own:.2} µs | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | |\n\
         | bytes written per round trip (perf.data size / round trips, median) | n/a | {perf_bytes:.0} B | |\n\n\
         spanprof's summary (last round): {summary}\n",
        offcpu_cpu(),
        machine(),
        alone_secs * 1e6 / trips,
        switch.runs,
        per_run(switch.ns, switch.runs),
        switch.idle_runs,
        per_run(switch.idle_ns, switch.idle_runs),
        sys_exit.runs,
        per_run(sys_exit.ns, sys_exit.runs),
        sys_exit.idle_runs,
        per_run(sys_exit.idle_ns, sys_exit.idle_runs),
        results
            .last()
            .map_or("", |r| r.spanprof.recorded.as_str()),
        mb(sp_rss),
        mb(perf_rss),
    )
}

/// `md` with the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` replaced by
/// `table`. Without those markers: `None`, or with a `heading`, `md` with a new `### heading`
/// section holding the markers and `table` after the last block of figures (the last line with
/// an `:end -->` marker; the end of `md` if there is none).
pub(crate) fn replace_block(
    md: &str,
    name: &str,
    table: &str,
    heading: Option<&str>,
) -> Option<String> {
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    match (md.find(&begin), md.find(&end)) {
        (Some(b), Some(e)) if b < e => Some(format!("{}{begin}\n{table}{}", &md[..b], &md[e..])),
        _ => {
            let heading = heading?;
            let at = md
                .rfind(":end -->")
                .map(|i| md[i..].find('\n').map_or(md.len(), |nl| i + nl + 1))
                .unwrap_or(md.len());
            let (head, tail) = md.split_at(at);
            let sep = if head.is_empty() || head.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            Some(format!(
                "{head}{sep}\n### {heading}\n\n{begin}\n{table}{end}\n{tail}"
            ))
        }
    }
}

/// Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in BENCHMARKS.md;
/// without those markers, adds them in a new `### heading` section if a heading is given (see
/// [`replace_block`]). The headline table at the top is made again from the new figures
/// ([`crate::bench_headline`]).
fn write_block(root: &Path, name: &str, table: &str, heading: Option<&str>) -> Result<()> {
    let md_path = root.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    match replace_block(&md, name, table, heading) {
        Some(new) => {
            let headline = crate::bench_headline::render(&new);
            let new =
                replace_block(&new, crate::bench_headline::BLOCK, &headline, None).unwrap_or(new);
            std::fs::write(&md_path, new)?;
            step(&format!(
                "updated the {name} figures in {}",
                md_path.display()
            ));
        }
        None => step(&format!(
            "BENCHMARKS.md has no {name} markers; figures printed only"
        )),
    }
    Ok(())
}

/// Runs the benchmark and updates BENCHMARKS.md. `workloads` (the built C workloads) is needed
/// by the native, unwind and offcpu parts only.
pub fn run(root: &Path, spanprof: &Path, workloads: Option<&Path>, cfg: &Config) -> Result<()> {
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
        .context("failed to enable kernel.bpf_stats_enabled (needs root)")?;
    // Turned off again however the run ends: the setting is system-wide and costs every program.
    struct StatsOff;
    impl Drop for StatsOff {
        fn drop(&mut self) {
            let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
        }
    }
    let stats_off = StatsOff;
    let wants = |part: Part| cfg.part == Part::All || cfg.part == part;
    let native_table = if wants(Part::Native) {
        let workloads = workloads.context("the native part needs the built workloads")?;
        Some(native(spanprof, workloads, &out_dir, cfg)?)
    } else {
        None
    };
    let python_table = if wants(Part::Python) {
        Some(python(root, spanprof, &out_dir, cfg)?)
    } else {
        None
    };
    let spans_table = if wants(Part::Spans) {
        Some(spans(root, spanprof, &out_dir, cfg)?)
    } else {
        None
    };
    let unwind_table = if wants(Part::Unwind) {
        let workloads = workloads.context("the unwind part needs the built workloads")?;
        Some(unwind(spanprof, workloads, &out_dir, cfg)?)
    } else {
        None
    };
    let offcpu_table = if wants(Part::Offcpu) {
        let workloads = workloads.context("the offcpu part needs the built workloads")?;
        Some(offcpu(spanprof, workloads, &out_dir, cfg)?)
    } else {
        None
    };
    let alloc_table = if wants(Part::Alloc) {
        let alloc_cfg = crate::bench_alloc::Config {
            rounds: cfg.rounds,
            python: cfg.python.clone(),
            units: cfg.alloc_units,
        };
        Some(crate::bench_alloc::run(
            root, spanprof, &out_dir, &alloc_cfg,
        )?)
    } else {
        None
    };
    let daemon_table = if wants(Part::Daemon) {
        let daemon_cfg = crate::bench_daemon::Config {
            rounds: cfg.rounds,
            python: cfg.python.clone(),
            venv_python: cfg.venv_python.clone(),
            seconds: cfg.daemon_seconds,
        };
        Some(crate::bench_daemon::run(
            root,
            spanprof,
            &out_dir,
            &daemon_cfg,
        )?)
    } else {
        None
    };
    let sid_table = if wants(Part::Sid) {
        Some(sid_pythons(root, spanprof, &out_dir, cfg)?)
    } else {
        None
    };
    drop(stats_off);
    // Each `--span-kinds` has its own block: `bench-spans` (both), `bench-spans-otel`, ….
    let spans_block = cfg.span_kinds.block();
    for (table, name, heading) in [
        (native_table, "bench", None),
        (python_table, "bench-python", None),
        (spans_table, spans_block.as_str(), None),
        (
            unwind_table,
            "unwind",
            Some("User stacks without frame pointers: cpu_split_nofp"),
        ),
        (
            offcpu_table,
            "bench-offcpu",
            Some("Off-CPU: offcpu_pingpong, a context switch per hop"),
        ),
        (
            alloc_table,
            "bench-alloc",
            Some("Allocations: py_alloc.py --bench, spanprof against memray"),
        ),
        (
            daemon_table,
            "bench-daemon",
            Some("Daemon: host-wide at 19 Hz beside two busy Python processes"),
        ),
        (
            sid_table,
            "bench-sid",
            Some("CPython 3.14 and 3.15: Debian sid's stripped builds in a chroot"),
        ),
    ] {
        if let Some(table) = table {
            println!("{table}");
            write_block(root, name, &table, heading)?;
        }
    }
    Ok(())
}

/// The newest pyenv CPython 3.12 (`$PYENV_ROOT` or `~/.pyenv`), the Python target's default
/// interpreter.
pub fn default_python() -> Option<PathBuf> {
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(std::env::var_os("HOME")?).join(".pyenv")))?;
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(pyenv.join("versions"))
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let patch = e
                .file_name()
                .to_str()?
                .strip_prefix("3.12.")?
                .parse()
                .ok()?;
            let bin = e.path().join("bin/python3.12");
            bin.is_file().then_some((patch, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_line_counts() {
        let c = parse_spans_line(
            "spans: 131 of 153 samples in 1 OpenTelemetry span (1 trace), 0 in OSProfiler traces",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp), (131, 0));
        let c = parse_spans_line(
            "spans: 0 of 176 samples in 0 OpenTelemetry spans (0 traces), 131 in 1 OSProfiler \
             trace (1 trace point)",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp, c.published), (0, 131, 0));
        let c = parse_spans_line(
            "spans: 700 of 705 samples in 1 OpenTelemetry span (1 trace), 700 in 1 OSProfiler \
             trace (1 trace point); 695 read from the thread context the process publishes",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp, c.published), (700, 700, 695));
        assert!(parse_spans_line("spanprof: 176 samples, 0 lost").is_none());
    }

    /// `perf script` output as Debian's perf 6.1 prints it for `--call-graph dwarf`.
    const PERF_SCRIPT: &str = "\
cpu_split_nofp  6449 26844.392251:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t            13a4 dispatcher+0x4 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)
\t           27249 __libc_start_call_main+0x79 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t           27304 __libc_start_main_impl+0x84 (inlined)
\t            1250 _start+0x20 (/tmp/cpu_split_nofp)

cpu_split_nofp  6449 26844.394256:    2004008 cpu-clock: 
\tffffffff81a0b2c1 asm_sysvec_apic_timer_interrupt+0x1 ([kernel.kallsyms])
\t            1384 hot_beta+0x24 (/tmp/cpu_split_nofp)
\t            13a9 dispatcher+0x9 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)

cpu_split_nofp  6449 26844.396259:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t        41d9a5b3 [unknown] ([unknown])

cpu_split_nofp  6449 26844.398268:    2004008 cpu-clock: 

cpu_split_nofp  6449 26844.400268:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t            13a4 dispatcher+0x4 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)
\t           27249 __libc_start_call_main+0x79 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t           27304 __libc_start_main_impl+0x84 (inlined)
\t            1250 _start+0x20 (/tmp/cpu_split_nofp)
";

    #[test]
    fn perf_script_folds_root_first() {
        let stacks = fold_perf_script(PERF_SCRIPT);
        let full = "_start;__libc_start_main_impl;__libc_start_call_main;main;dispatcher;hot_alpha";
        assert_eq!(stacks.get(full), Some(&2));
        assert_eq!(
            stacks.get("main;dispatcher;hot_beta;asm_sysvec_apic_timer_interrupt_[k]"),
            Some(&1)
        );
        assert_eq!(stacks.get("[unknown] ([unknown]);hot_alpha"), Some(&1));
        assert_eq!(stacks.get("[no stack]"), Some(&1));
        assert_eq!(stacks.values().sum::<u64>(), 5);
    }

    #[test]
    fn unwind_shape_counts_whole_paths() {
        let stacks = fold_perf_script(PERF_SCRIPT);
        let s = unwind_shape(stacks.iter().map(|(k, n)| (k.as_str(), *n)));
        assert_eq!((s.samples, s.work, s.full, s.rooted), (5, 4, 3, 2));
        assert_eq!((s.alpha, s.beta), (3, 1));
        // 6 + 6 + 3 + 2 user frames; the kernel frame and `[no stack]` are not user frames.
        assert_eq!(s.user_frames, 17);

        // spanprof's folded output: a frame-pointer walk that stopped at the leaf, a stack cut
        // short under a placeholder, a stack reaching main from dispatcher as the leaf.
        let folded = "hot_alpha 7\n\
                      [truncated];dispatcher;hot_beta 2\n\
                      _start;__libc_start_main;main;dispatcher 1\n\
                      _start;__libc_start_main;main;dispatcher;hot_alpha;do_syscall_64_[k] 4\n\
                      _start;main 3\n";
        let s = unwind_shape(folded_stacks(folded));
        assert_eq!((s.samples, s.work, s.full, s.rooted), (17, 14, 5, 5));
        assert_eq!((s.alpha, s.beta), (11, 2));
        assert_eq!(s.user_frames, 7 + 2 * 2 + 4 + 4 * 5 + 3 * 2);
    }

    #[test]
    fn stack_stats_are_summed_over_processes() {
        let text = r#"{"unwind": "dwarf", "stack_copy_bytes": 16384, "processes": [
            {"pid": 12, "name": "cpu_split_nofp", "samples": 2490,
             "stacks": {"complete": 2480, "truncated": 6, "failed": 4, "unchecked": 0,
                        "reasons": {"stack copy too small": 6, "no CFI": 4}}},
            {"pid": 13, "name": "caf\u00e9 \"x\"", "samples": 10,
             "stacks": {"complete": 10, "truncated": 0, "failed": 0, "unchecked": 0,
                        "reasons": {}}}]}"#;
        let s = parse_stack_stats(text).unwrap();
        assert_eq!(s.unwind, "dwarf");
        assert_eq!(s.stack_copy_bytes, 16384);
        assert_eq!(
            (s.complete, s.truncated, s.failed, s.unchecked),
            (2490, 6, 4, 0)
        );
        assert_eq!(s.reasons.get("no CFI"), Some(&4));
        assert_eq!(s.total(), 2500);
        let fp = r#"{"unwind":"fp","processes":[{"pid":1,"name":"a","samples":3,
            "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":3,"reasons":{}}}]}"#;
        let s = parse_stack_stats(fp).unwrap();
        assert_eq!(
            (s.unwind.as_str(), s.unchecked, s.stack_copy_bytes),
            ("fp", 3, 0)
        );
        assert_eq!(
            Json::parse(r#"["\u00e9\ud83d\ude00", -1.5e3, true, null]"#).unwrap(),
            Json::Arr(vec![
                Json::Str("é😀".to_string()),
                Json::Num(-1500.0),
                Json::Bool(true),
                Json::Null
            ])
        );
        assert!(parse_stack_stats(r#"{"unwind":"dwarf"}"#).is_err());
        assert!(Json::parse(r#"{"a":1"#).is_err());
        assert!(Json::parse(r#"{"a":1} x"#).is_err());
    }

    #[test]
    fn pingpong_line_and_offcpu_reasons() {
        let p = parse_pingpong(
            "4242\n{\"round_trips\": 200000, \"seconds\": 1.215983076, \
             \"voluntary_switches\": 233734, \"involuntary_switches\": 166286}\n",
        )
        .unwrap();
        assert_eq!(
            (p.round_trips, p.voluntary, p.involuntary),
            (200000, 233734, 166286)
        );
        assert!((p.switches_per_second() - 400020.0 / 1.215983076).abs() < 1e-6);
        assert!(parse_pingpong("4242\n").is_err());
        assert!(parse_pingpong("{\"round_trips\": 1, \"seconds\": 0}").is_err());

        let dir = std::env::temp_dir().join(format!("xtask-offcpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.folded");
        std::fs::write(
            &path,
            "[off-cpu: io];_start;main;ping_side;read;pipe_read_[k] 7000\n\
             [off-cpu: io];_start;start_thread;pong_side;read 3000\n\
             [off-cpu: lock];_start;main;pthread_join 500\n\
             _start;main;ping_side;write 2004008\n",
        )
        .unwrap();
        let by_reason = offcpu_by_reason(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(by_reason.get("io"), Some(&10000));
        assert_eq!(by_reason.get("lock"), Some(&500));
        assert_eq!(by_reason.get("on-CPU"), Some(&2004008));
        assert_eq!(by_reason.len(), 3);
    }

    #[test]
    fn blocks_are_replaced_or_added() {
        let md = "# B\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n### Later\n\ntext\n";
        assert_eq!(
            replace_block(md, "a", "new\n", None).unwrap(),
            "# B\n\n<!-- a:begin -->\nnew\n<!-- a:end -->\n\n### Later\n\ntext\n"
        );
        assert!(replace_block(md, "u", "t\n", None).is_none());
        assert_eq!(
            replace_block(md, "u", "t\n", Some("U")).unwrap(),
            "# B\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n### U\n\n<!-- u:begin -->\nt\n\
             <!-- u:end -->\n\n### Later\n\ntext\n"
        );
        // Once added, the block is replaced in place.
        let added = replace_block(md, "u", "t\n", Some("U")).unwrap();
        assert_eq!(
            replace_block(&added, "u", "t2\n", Some("U")).unwrap(),
            added.replace("\nt\n", "\nt2\n")
        );
        assert_eq!(
            replace_block("# B", "u", "t\n", Some("U")).unwrap(),
            "# B\n\n### U\n\n<!-- u:begin -->\nt\n<!-- u:end -->\n"
        );
    }
}
