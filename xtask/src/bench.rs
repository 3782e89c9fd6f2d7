//! `cargo xtask bench`: spanprof's overhead, side by side with `perf record -g` on a native
//! target and with `py-spy record` on a Python target, and the in-kernel cost of reading span
//! contexts, in one run.
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
//!
//! `--only native|python|spans` runs one part. Each round's raw measurements go to
//! `target/bench/{native,python,spans}_rounds.txt` (`spans_KIND_rounds.txt` for a
//! `--span-kinds` other than both).
//!
//! The results are printed and written between the markers of BENCHMARKS.md.

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
    pub python: PathBuf,
    pub py_spy: PathBuf,
    /// `target/span-libs`: the tracing libraries of each CPython 3.X in `3.X` (`cargo xtask
    /// deps`), for the span target.
    pub span_libs: PathBuf,
    /// The span contexts the span target sets up: both, or one alone to see what each costs.
    pub span_kinds: SpanKinds,
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

/// Resource usage of one finished process.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu: Duration,
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

/// The target's CPU time and its wall time from release to exit.
#[derive(Debug, Clone, Copy, Default)]
struct TargetRun {
    cpu: Duration,
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
            wall,
        })
    }
}

/// Reads `stream` until a line contains `ready`, returning the reader.
fn wait_ready<R: Read>(stream: R, ready: &str) -> Result<BufReader<R>> {
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

fn run_perf(target: &Target, amount: u64, out: &Path) -> Result<OtherRun> {
    let mut t = target.start(amount)?;
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-g",
            "-F",
            &HZ.to_string(),
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

fn median(mut v: Vec<f64>) -> f64 {
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

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// "Linux …, N CPUs" for the headings.
fn machine() -> String {
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
fn rounds<T>(name: &str, n: usize, mut f: impl FnMut(usize) -> Result<T>) -> Result<Vec<T>> {
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
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &[], &sp_out)?;
            r.perf = run_perf(&target, work, &perf_out)?;
        } else {
            r.perf = run_perf(&target, work, &perf_out)?;
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &[], &sp_out)?;
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
         | figure | spanprof | perf record -g | goal |\n\
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
}

/// The first line `program args…` prints, e.g. "3.12.1" or "py-spy 0.4.3".
fn version(program: &Path, args: &[&str]) -> Result<String> {
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
    let results = rounds("python", n, |i| {
        let mut r = PyRound::default();
        if i % 2 == 0 {
            r.alone = run_alone(&target, work)?;
            spanprof_run(&mut r)?;
            pyspy_run(&mut r)?;
        } else {
            pyspy_run(&mut r)?;
            spanprof_run(&mut r)?;
            r.alone = run_alone(&target, work)?;
        }
        Ok(r)
    })?;
    let high = rounds(&format!("python at {HIGH_HZ} Hz"), HIGH_RUNS, |_| {
        let out = out_dir.join("bench_py_high.folded");
        let run = run_spanprof(spanprof, &target, work, HIGH_HZ, &[], &out)?;
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
    let high_windows: Vec<BpfWindow> = high.iter().filter_map(|(r, _)| r.bpf).collect();
    let high_bpf = bpf_figures(&high_windows).context("no in-kernel statistics were read")?;
    let (high_all, high_whole) = high.iter().fold((0, 0), |a, (_, d)| (a.0 + d.0, a.1 + d.1));
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
         | the same at {HIGH_HZ} Hz ({HIGH_RUNS} runs, {} samples, {high_whole:.1}% with all {PY_DEPTH} frames) | {:.2} µs | n/a | ≤ 10 µs |\n",
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
    ))
}

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

/// Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in BENCHMARKS.md.
fn write_block(root: &Path, name: &str, table: &str) -> Result<()> {
    let md_path = root.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    match (md.find(&begin), md.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            let new = format!("{}{begin}\n{table}{}", &md[..b], &md[e..]);
            std::fs::write(&md_path, new)?;
            step(&format!(
                "updated the {name} figures in {}",
                md_path.display()
            ));
        }
        _ => step(&format!(
            "BENCHMARKS.md has no {name} markers; figures printed only"
        )),
    }
    Ok(())
}

/// Runs the benchmark and updates BENCHMARKS.md. `workloads` (the built C workloads) is needed
/// by the native part only.
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
    drop(stats_off);
    // Each `--span-kinds` has its own block: `bench-spans` (both), `bench-spans-otel`, ….
    let spans_block = cfg.span_kinds.block();
    for (table, name) in [
        (native_table, "bench"),
        (python_table, "bench-python"),
        (spans_table, spans_block.as_str()),
    ] {
        if let Some(table) = table {
            println!("{table}");
            write_block(root, name, &table)?;
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
}
