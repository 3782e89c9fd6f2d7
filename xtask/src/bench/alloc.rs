//! `cargo xtask bench --only alloc`: what allocation profiling costs a Python program, side by
//! side with memray (PyPI), the usual in-process Python memory profiler.
//!
//! Method (also in BENCHMARKS.md, block `bench-alloc`):
//! - Target: `tests/workloads/py_alloc.py --bench UNITS`, run by a pyenv CPython (3.12 by
//!   default, as the other Python parts of the bench). Each unit builds 1000 small dicts, lists
//!   and strs (pymalloc), a ~10 KB str, 100 bytes objects of 2-5.5 KB and a 256 KiB bytearray,
//!   all freed when the unit ends: ~145 calls of the malloc family per unit (counted with an
//!   LD_PRELOAD shim by hand; the bench counts them again with spanprof and memray), ~0.5-0.9 ms
//!   alone. It prints its pid, waits for a byte on stdin, times its loop itself (wall:
//!   perf_counter; CPU: process_time, user + system, so the time the kernel spends in a uprobe's
//!   trap is in it) and prints one JSON line.
//! - Configurations, each a command started by the bench, interleaved in each of `--rounds`
//!   rounds (order reversed every other round): the target alone; `spanprof profile --event
//!   alloc -o x.pb.gz -- PYTHON py_alloc.py --bench UNITS` (the default rate, 512 KiB);
//!   the same with `--event heap` (frees and returns probed too); the same with `--alloc-rate
//!   1` (every allocation recorded); `PYTHON -m memray run -q -f -o x.bin py_alloc.py --bench
//!   UNITS` (memray 1.20.0 with its defaults: every call of the system allocator, Python stacks,
//!   no native stacks, pymalloc not traced). memray comes from PyPI into
//!   `target/bench-libs/3.X` ([`crate::deps::memray`]), given to every configuration as
//!   `PYTHONPATH`. The target's stdin is the bench's pipe in each (spanprof passes its own
//!   stdin to the command), so each is released the same way.
//! - Figures: the slowdown of the loop (wall and CPU time, profiled / alone, median of the
//!   per-round ratios); the target's calls of the malloc family per run, as spanprof recorded
//!   them with `--alloc-rate 1` (its BPF programs keep the target's calls only; lost samples
//!   added back) and, independently, as memray recorded them (`memray stats`, the whole
//!   process); the CPU time each configuration adds to the loop per call; the in-kernel time
//!   per run of each of spanprof's uprobe programs (BPF statistics, `kernel.bpf_stats_enabled=1`,
//!   read from the spawned spanprof's own program fds, found by name with
//!   `BPF_OBJ_GET_INFO_BY_FD`, at three moments as in the off-CPU part: once spanprof says it is
//!   profiling, 1 s later with the target blocked on its gate, and when the target prints its
//!   result), summed over the rounds then divided by the runs, and of all of them per target
//!   call (an upper bound: a command's C library is probed in every process that maps it, the
//!   BPF programs dropping those not profiled, so other processes' calls run the programs too);
//!   those other processes' probe hits per second while the target was blocked; spanprof's own
//!   CPU time (`wait4` of spanprof, which includes its command's, less the target's own
//!   `getrusage`); the output's size; samples lost.
//!
//! - The same again with the malloc-heavy target, `py_alloc.py --bench-malloc 1000`: 1 M
//!   malloc+free of 600-3999 bytes from a Python loop (0.65-0.8 s alone), the worst case of a
//!   probe on every call (goals: `--event alloc` no slower than memray, `--event heap` at
//!   most 5 times the time alone).
//!
//! Every round's raw measurements go to `target/bench/alloc_rounds.txt` (malloc-heavy:
//! `alloc_malloc_rounds.txt`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::measure::{NamedProg, ProgWindow};

use crate::run::step;

/// What to run and how much.
#[derive(Debug, Clone)]
pub struct Config {
    pub rounds: usize,
    /// The interpreter of the target (a pyenv CPython: memray is installed for it).
    pub python: PathBuf,
    /// Units of work (`--bench`: ~0.9 ms each alone; `--bench-malloc`: ~0.65 ms).
    pub units: u64,
    pub workload: Workload,
    /// `--alloc-units` as given (the mixed workload's units), for the command line shown.
    pub alloc_units: u64,
}

/// The target's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `py_alloc.py --bench`: Python objects of all sizes, a few hundred thousand calls of the
    /// malloc family a second.
    Mixed,
    /// `py_alloc.py --bench-malloc`: 1000 malloc+free of 600-3999 bytes a unit, over a million
    /// calls a second: the worst case of a probe on every call.
    MallocHeavy,
}

impl Workload {
    fn arg(self) -> &'static str {
        match self {
            Workload::Mixed => "--bench",
            Workload::MallocHeavy => "--bench-malloc",
        }
    }

    /// The goals of the wall-time row.
    fn goal(self) -> &'static str {
        match self {
            Workload::Mixed => "≤ 1.2 for `--event alloc`",
            Workload::MallocHeavy => "`--event alloc` ≤ memray, `--event heap` ≤ 5",
        }
    }
}

/// Units of the malloc-heavy workload: 1 M malloc+free, 0.65-0.8 s alone.
pub const MALLOC_HEAVY_UNITS: u64 = 1000;

/// The default amount of work: about 3.5 s alone.
pub const DEFAULT_UNITS: u64 = 4000;

/// spanprof's entry probe: one program, one run per call of the malloc family or of the C
/// library's mmap (CPython's small-object allocator gets its arenas with mmap).
const ENTRY_PROGS: [&str; 1] = ["on_alloc"];

/// A program's name as the kernel keeps it: at most 15 bytes (`BPF_OBJ_NAME_LEN` with its NUL),
/// so `on_posix_memalign` is `on_posix_memali` in the program fds' info.
fn kernel_name(name: &str) -> &str {
    &name[..name.len().min(15)]
}

/// The programs only a heap profile adds: frees, unmaps and the returns of the allocating
/// functions.
const HEAP_PROGS: [&str; 3] = ["on_free", "on_munmap", "on_alloc_return"];

/// The configurations of each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Conf {
    Alone,
    /// `spanprof --event alloc`, default rate.
    Alloc,
    /// `spanprof --event heap`, default rate.
    Heap,
    /// `spanprof --event alloc --alloc-rate 1`.
    Every,
    Memray,
}

impl Conf {
    const ALL: [Conf; 5] = [
        Conf::Alone,
        Conf::Alloc,
        Conf::Heap,
        Conf::Every,
        Conf::Memray,
    ];
    const PROFILED: [Conf; 4] = [Conf::Alloc, Conf::Heap, Conf::Every, Conf::Memray];

    fn title(self) -> &'static str {
        match self {
            Conf::Alone => "alone",
            Conf::Alloc => "spanprof --event alloc",
            Conf::Heap => "spanprof --event heap",
            Conf::Every => "spanprof --event alloc --alloc-rate 1",
            Conf::Memray => "memray run",
        }
    }

    fn is_spanprof(self) -> bool {
        matches!(self, Conf::Alloc | Conf::Heap | Conf::Every)
    }

    /// spanprof's `--event` and `--alloc-rate` arguments.
    fn spanprof_args(self) -> &'static [&'static str] {
        match self {
            Conf::Alloc => &["--event", "alloc"],
            Conf::Heap => &["--event", "heap"],
            Conf::Every => &["--event", "alloc", "--alloc-rate", "1"],
            _ => &[],
        }
    }
}

/// One run of one configuration.
#[derive(Debug, Default)]
struct AllocRun {
    /// The target's loop: wall and CPU seconds, and its process's CPU seconds at the end.
    loop_wall: f64,
    loop_cpu: f64,
    process_cpu: f64,
    /// CPU seconds of the process the bench started (spanprof with its command, memray's
    /// python, or the target alone), from `wait4`.
    started_cpu: f64,
    /// The idle interval and the target's window, seconds (spanprof only).
    idle_secs: f64,
    window_secs: f64,
    /// spanprof's programs, by name.
    progs: BTreeMap<String, ProgWindow>,
    /// spanprof's summary line (`spanprof: …, N lost, from …`), the allocations it says it
    /// recorded (`… allocated in N allocations`: exact with `--alloc-rate 1`, an estimate
    /// otherwise) and the lost samples.
    summary: String,
    recorded: Option<u64>,
    lost: u64,
    /// The size of the profile written (spanprof's pprof, memray's capture file).
    output_bytes: u64,
    /// The allocations memray recorded (`memray stats`: the whole process, start-up and exit
    /// included): an independent count of the target's calls.
    memray_allocations: u64,
}

/// Waits for `child` (reaping it) and returns its wait status and CPU seconds (user + system,
/// with its waited-for children's).
fn wait_cpu(child: &Child) -> Result<(i32, f64)> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both pointers are valid.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if r < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((status, tv(ru.ru_utime) + tv(ru.ru_stime)))
}

/// The lines of `pipe` as they come.
fn lines(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to 60 s for a line of `rx` for which `want` holds; every line read is appended to
/// `seen`.
fn wait_line(
    rx: &mpsc::Receiver<String>,
    seen: &mut String,
    what: &str,
    want: impl Fn(&str) -> bool,
) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if want(&line) {
                    return Ok(line);
                }
            }
            Err(e) => bail!("no {what} ({e}); output so far:\n{seen}"),
        }
    }
}

/// A number of a JSON object line, found by key (the target's line is flat and written by
/// `json.dumps`).
fn json_number(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Runs one configuration once; see the module documentation.
fn run_one(
    conf: Conf,
    spanprof: &Path,
    script: &Path,
    cfg: &Config,
    memray_libs: &Path,
    out_dir: &Path,
) -> Result<AllocRun> {
    let units = cfg.units.to_string();
    let target: Vec<OsString> = vec![
        cfg.python.clone().into(),
        script.into(),
        cfg.workload.arg().into(),
        units.into(),
    ];
    let output = match conf {
        Conf::Memray => Some(out_dir.join("alloc_memray.bin")),
        c if c.is_spanprof() => Some(out_dir.join("alloc_spanprof.pb.gz")),
        _ => None,
    };
    if let Some(out) = &output {
        let _ = std::fs::remove_file(out);
    }
    let mut cmd = match conf {
        Conf::Alone => {
            let mut c = Command::new(&target[0]);
            c.args(&target[1..]);
            c
        }
        Conf::Memray => {
            let mut c = Command::new(&cfg.python);
            c.args(["-m", "memray", "run", "-q", "-f", "-o"])
                .arg(output.as_ref().expect("memray writes a file"))
                .args(&target[1..]);
            c
        }
        _ => {
            let mut c = Command::new(spanprof);
            c.arg("profile")
                .args(conf.spanprof_args())
                .arg("-o")
                .arg(output.as_ref().expect("spanprof writes a file"))
                .arg("--")
                .args(&target);
            c
        }
    };
    cmd.env("PYTHONPATH", memray_libs)
        .env("PYTHONNOUSERSITE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("failed to start {}", conf.title()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let out_lines = lines(child.stdout.take().expect("piped"));
    let err_lines = lines(child.stderr.take().expect("piped"));
    let (mut out_text, mut err_text) = (String::new(), String::new());
    let mut run = AllocRun::default();

    let mut progs = Vec::new();
    let mut marks: Vec<Vec<Option<(u64, u64)>>> = Vec::new();
    let mut times = Vec::new();
    if conf.is_spanprof() {
        wait_line(
            &err_lines,
            &mut err_text,
            "`spanprof: profiling` line",
            |l| l.starts_with("spanprof: profiling"),
        )?;
    }
    wait_line(&out_lines, &mut out_text, "pid line from the target", |l| {
        l.trim().parse::<u32>().is_ok()
    })?;
    if conf.is_spanprof() {
        progs = NamedProg::all_of(child.id());
        marks.push(progs.iter().map(NamedProg::stats).collect());
        times.push(Instant::now());
        std::thread::sleep(Duration::from_secs(1));
        marks.push(progs.iter().map(NamedProg::stats).collect());
        times.push(Instant::now());
    }
    stdin
        .write_all(b"g")
        .context("failed to release the target")?;
    drop(stdin);
    let result = wait_line(
        &out_lines,
        &mut out_text,
        "result line from the target",
        |l| l.trim_start().starts_with('{'),
    );
    if conf.is_spanprof() {
        marks.push(progs.iter().map(NamedProg::stats).collect());
        times.push(Instant::now());
        // The setting is machine-wide: another bench that ended meanwhile turns it off, and the
        // counters then stop.
        let stats =
            std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
        if stats.trim() != "1" {
            bail!(
                "kernel.bpf_stats_enabled is {:?}, not 1, at the end of a run of {}: another \
                 process (a concurrent `cargo xtask bench`?) turned it off; run the bench alone",
                stats.trim(),
                conf.title()
            );
        }
    }
    let (status, cpu) = wait_cpu(&child)?;
    // The rest of stderr: spanprof's summary.
    while let Ok(line) = err_lines.recv_timeout(Duration::from_secs(10)) {
        err_text.push_str(&line);
        err_text.push('\n');
    }
    let result = result.with_context(|| format!("{}:\n{err_text}", conf.title()))?;
    if status != 0 {
        bail!(
            "{} failed (wait status {status}):\n{out_text}{err_text}",
            conf.title()
        );
    }
    let number = |key: &str| {
        json_number(&result, key).with_context(|| format!("no {key} in the result {result}"))
    };
    if number("units")? as u64 != cfg.units {
        bail!(
            "the target did not do the {} units asked: {result}",
            cfg.units
        );
    }
    run.loop_wall = number("loop_wall")?;
    run.loop_cpu = number("loop_cpu")?;
    run.process_cpu = number("process_cpu")?;
    run.started_cpu = cpu;
    if let Some(out) = &output {
        run.output_bytes = std::fs::metadata(out)
            .with_context(|| format!("{} wrote no {}", conf.title(), out.display()))?
            .len();
    }
    if conf == Conf::Memray {
        run.memray_allocations = memray_allocations(
            &cfg.python,
            memray_libs,
            output.as_ref().expect("memray writes a file"),
        )?;
    }
    if conf.is_spanprof() {
        run.idle_secs = (times[1] - times[0]).as_secs_f64();
        run.window_secs = (times[2] - times[1]).as_secs_f64();
        for (i, prog) in progs.iter().enumerate() {
            if let (Some(a), Some(b), Some(c)) = (marks[0][i], marks[1][i], marks[2][i]) {
                run.progs
                    .insert(prog.name.clone(), ProgWindow::between(a, b, c));
            }
        }
        let (summary, lost) = err_text
            .lines()
            .find_map(|l| {
                let (head, _) = l.strip_prefix("spanprof: ")?.split_once(" lost, from ")?;
                let lost = head.rsplit(", ").next()?.trim().parse::<u64>().ok()?;
                Some((l.to_string(), lost))
            })
            .with_context(|| format!("spanprof printed no summary line:\n{err_text}"))?;
        run.recorded = parse_recorded(&summary);
        run.summary = summary;
        run.lost = lost;
        if !ENTRY_PROGS.iter().any(|p| run.progs.contains_key(*p)) {
            bail!(
                "{} holds none of the programs {ENTRY_PROGS:?} (it holds {:?})",
                conf.title(),
                run.progs.keys().collect::<Vec<_>>()
            );
        }
    }
    Ok(run)
}

/// The `Total allocations` of `memray stats CAPTURE`.
fn memray_allocations(python: &Path, libs: &Path, capture: &Path) -> Result<u64> {
    let out = Command::new(python)
        .args(["-m", "memray", "stats"])
        .arg(capture)
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1")
        .stdin(Stdio::null())
        .output()
        .context("failed to run memray stats")?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_memray_total(&text).with_context(|| {
        format!(
            "memray stats printed no `Total allocations`:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The number on the line after the one that ends in `Total allocations:`.
fn parse_memray_total(text: &str) -> Option<u64> {
    let mut lines = text.lines();
    lines.find(|l| l.trim_end().ends_with("Total allocations:"))?;
    lines.next()?.trim().parse().ok()
}

/// The `N` of `… allocated in N allocations` in spanprof's summary line (`1,234` → 1234).
fn parse_recorded(summary: &str) -> Option<u64> {
    let (_, rest) = summary.split_once(" allocated in ")?;
    let (n, _) = rest.split_once(" allocation")?;
    n.replace(',', "").parse().ok()
}

impl AllocRun {
    /// Runs of the entry probes while the target ran, whatever the process (a command's C
    /// library is probed in every process).
    fn entry_runs(&self) -> u64 {
        ENTRY_PROGS
            .iter()
            .filter_map(|name| self.progs.get(kernel_name(name)))
            .map(|w| w.runs)
            .sum()
    }

    /// Runs of every program per second while the target was blocked: other processes' calls.
    fn idle_rate(&self) -> f64 {
        let runs: u64 = self.progs.values().map(|w| w.idle_runs).sum();
        runs as f64 / self.idle_secs.max(1e-9)
    }

    /// spanprof's own CPU seconds: `wait4`'s figure less its command's.
    fn own_cpu(&self) -> f64 {
        self.started_cpu - self.process_cpu
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
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

/// The first line `program ARGS…` prints, or `?`.
fn version(program: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// "N CPUs, Linux …" for the heading.
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

/// The allocation benchmark: `cfg.rounds` interleaved rounds of every configuration; the
/// markdown of its figures (for the `bench-alloc` block of BENCHMARKS.md). Needs root and
/// `kernel.bpf_stats_enabled=1` (which [`crate::bench::run`] sets for the whole run).
pub fn run(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    if cfg.rounds == 0 || cfg.units == 0 {
        bail!("the allocation bench needs at least one round and one unit of work");
    }
    let script = root.join("tests/workloads/py_alloc.py");
    if !script.is_file() {
        bail!("{} is missing", script.display());
    }
    let memray_libs = crate::deps::memray(root, &cfg.python)?;
    std::fs::create_dir_all(out_dir)?;
    let mut results: Vec<BTreeMap<Conf, AllocRun>> = Vec::new();
    for i in 0..cfg.rounds {
        step(&format!("bench alloc: round {}/{}", i + 1, cfg.rounds));
        let mut order = Conf::ALL.to_vec();
        if i % 2 == 1 {
            order.reverse();
        }
        let mut round = BTreeMap::new();
        for conf in order {
            round.insert(
                conf,
                run_one(conf, spanprof, &script, cfg, &memray_libs, out_dir)?,
            );
        }
        results.push(round);
    }
    let rounds_file = match cfg.workload {
        Workload::Mixed => "alloc_rounds.txt",
        Workload::MallocHeavy => "alloc_malloc_rounds.txt",
    };
    std::fs::write(out_dir.join(rounds_file), format!("{results:#?}\n"))?;
    let python_version = version(&cfg.python, &["--version"], &[]);
    let memray_version = version(
        &cfg.python,
        &["-c", "import memray; print(memray.__version__)"],
        &[("PYTHONPATH", &memray_libs)],
    );
    Ok(table(&results, cfg, &python_version, &memray_version))
}

/// The markdown of the figures.
fn table(
    results: &[BTreeMap<Conf, AllocRun>],
    cfg: &Config,
    python_version: &str,
    memray_version: &str,
) -> String {
    let n = results.len();
    let med = |conf: Conf, f: &dyn Fn(&AllocRun, &AllocRun) -> f64| {
        median(
            results
                .iter()
                .map(|r| f(&r[&conf], &r[&Conf::Alone]))
                .collect(),
        )
    };
    let alone_wall = med(Conf::Alone, &|r, _| r.loop_wall);
    let alone_cpu = med(Conf::Alone, &|r, _| r.loop_cpu);
    // The target's calls per run, the same in every configuration: what spanprof recorded
    // with --alloc-rate 1 (its BPF programs keep the target's calls only), lost samples
    // included; memray's count of the whole process if spanprof's summary said nothing.
    let every = med(Conf::Every, &|r, _| {
        r.recorded.map_or(f64::NAN, |n| (n + r.lost) as f64)
    });
    let calls = if every.is_finite() {
        every
    } else {
        med(Conf::Memray, &|r, _| r.memray_allocations as f64)
    };
    let cols = |f: &dyn Fn(Conf) -> String| -> String {
        Conf::PROFILED
            .iter()
            .map(|c| f(*c))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let ratio =
        |f: fn(&AllocRun) -> f64| move |c: Conf| format!("{:.3}", med(c, &|r, a| f(r) / f(a)));
    let wall_row = cols(&ratio(|r| r.loop_wall));
    let cpu_row = cols(&ratio(|r| r.loop_cpu));
    let added_row = cols(&|c| {
        let added = med(c, &|r, a| r.loop_cpu - a.loop_cpu);
        format!("{:.2} µs", added * 1e6 / calls.max(1.0))
    });
    let calls_row = cols(&|c| {
        if c.is_spanprof() {
            format!("{:.0}", med(c, &|r, _| r.entry_runs() as f64))
        } else {
            "n/a".into()
        }
    });
    // In-kernel time per run of each program, pooled over the rounds.
    let pooled = |c: Conf, name: &str| -> ProgWindow {
        let mut w = ProgWindow::default();
        for r in results {
            if let Some(p) = r[&c].progs.get(name) {
                w.idle_ns += p.idle_ns;
                w.idle_runs += p.idle_runs;
                w.ns += p.ns;
                w.runs += p.runs;
            }
        }
        w
    };
    // Every program any spanprof run held: the allocation programs (entry probes first) each
    // on a row of its own when it ran, the others (the process-tracking programs) on one row.
    let mut names: Vec<&str> = ENTRY_PROGS
        .iter()
        .chain(HEAP_PROGS.iter())
        .map(|n| kernel_name(n))
        .collect();
    let alloc_progs = names.len();
    for r in results {
        for c in [Conf::Alloc, Conf::Heap, Conf::Every] {
            for name in r[&c].progs.keys() {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
    }
    let per_run = |w: &ProgWindow| w.ns as f64 / w.runs.max(1) as f64 / 1e3;
    let ran = |name: &str| {
        [Conf::Alloc, Conf::Heap, Conf::Every]
            .iter()
            .any(|c| pooled(*c, name).runs > 0)
    };
    let mut prog_rows = String::new();
    for name in names[..alloc_progs].iter().filter(|n| ran(n)) {
        let row = cols(&|c| {
            if !c.is_spanprof() {
                return "n/a".into();
            }
            let w = pooled(c, name);
            if w.runs == 0 {
                "-".into()
            } else {
                format!("{:.3} µs ({} runs)", per_run(&w), w.runs)
            }
        });
        prog_rows.push_str(&format!(
            "| in-kernel time per run of `{name}` while the target ran (all rounds) | {row} | |\n"
        ));
    }
    let others = cols(&|c| {
        if !c.is_spanprof() {
            return "n/a".into();
        }
        let list: Vec<String> = names[alloc_progs..]
            .iter()
            .map(|n| (n, pooled(c, n)))
            .filter(|(_, w)| w.runs > 0)
            .map(|(n, w)| format!("`{n}` {} runs, {:.3} µs", w.runs, per_run(&w)))
            .collect();
        if list.is_empty() {
            "none".into()
        } else {
            list.join("; ")
        }
    });
    prog_rows.push_str(&format!(
        "| other programs that ran while the target ran (all rounds) | {others} | |\n"
    ));
    let kernel_per_call = cols(&|c| {
        if !c.is_spanprof() {
            return "n/a".into();
        }
        let ns: u64 = names.iter().map(|p| pooled(c, p).ns).sum();
        format!(
            "{:.2} µs",
            ns as f64 / (calls * results.len() as f64).max(1.0) / 1e3
        )
    });
    let idle_rate = cols(&|c| {
        if !c.is_spanprof() {
            return "n/a".into();
        }
        format!("{:.0}", med(c, &|r, _| r.idle_rate()))
    });
    let own_row = cols(&|c| {
        if c.is_spanprof() {
            format!("{:.3} s", med(c, &|r, _| r.own_cpu()))
        } else {
            "n/a (in the target's process)".into()
        }
    });
    let process_row = cols(&ratio(|r| r.process_cpu));
    let bytes_row = cols(&|c| format!("{:.1} kB", med(c, &|r, _| r.output_bytes as f64) / 1e3));
    let memray_row = cols(&|c| {
        if c == Conf::Memray {
            format!("{:.0}", med(c, &|r, _| r.memray_allocations as f64))
        } else {
            "n/a".into()
        }
    });
    let lost_row = cols(&|c| {
        if c.is_spanprof() {
            format!("{}", results.iter().map(|r| r[&c].lost).sum::<u64>())
        } else {
            "n/a".into()
        }
    });
    let summaries: Vec<String> = [Conf::Alloc, Conf::Heap, Conf::Every]
        .iter()
        .filter_map(|c| {
            let s = &results.last()?[c].summary;
            Some(format!("`{}`: {s}", c.title()))
        })
        .collect();
    format!(
        "Run of `cargo xtask bench --only alloc --rounds {n} --alloc-units {alloc_units}` on \
         {machine}: target `py_alloc.py {arg} {units}` ({python_version}, memray {memray_version}) alone \
         {alone_wall:.3} s wall, {alone_cpu:.3} s CPU for its loop, {calls:.0} calls of the \
         malloc family per run ({rate:.0} per second alone; as recorded by spanprof with \
         `--alloc-rate 1`, lost samples included) (medians).\n\n\
         | figure | {heads} | goal |\n\
         |---|---|---|---|---|---|\n\
         | loop wall time, profiled / alone (median of {n} interleaved rounds) | {wall_row} | {goal} |\n\
         | loop CPU time, profiled / alone (median) | {cpu_row} | |\n\
         | target process CPU time, profiled / alone (median; memray's set-up included) | {process_row} | |\n\
         | CPU time added to the loop per malloc-family call, (profiled − alone) / calls (median) | {added_row} | |\n\
         | runs of spanprof's entry probes while the target ran, any process (median) | {calls_row} | |\n\
         | allocations memray recorded per run, whole process (`memray stats`, median) | {memray_row} | |\n\
         {prog_rows}\
         | in-kernel time of all spanprof's programs while the target ran, per target call (other processes' runs included: an upper bound; all rounds) | {kernel_per_call} | |\n\
         | probe hits of other processes per second, target blocked (median) | {idle_rate} | |\n\
         | spanprof's own CPU time, whole session (median) | {own_row} | |\n\
         | profile written (median size) | {bytes_row} | |\n\
         | samples lost (all rounds) | {lost_row} | |\n\n\
         spanprof's summaries (last round): {summaries}\n",
        units = cfg.units,
        arg = cfg.workload.arg(),
        goal = cfg.workload.goal(),
        alloc_units = cfg.alloc_units,
        machine = machine(),
        rate = calls / alone_wall,
        heads = Conf::PROFILED
            .iter()
            .map(|c| c.title())
            .collect::<Vec<_>>()
            .join(" | "),
        summaries = summaries.join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_target_line() {
        let line = r#"{"units": 4000, "loop_wall": 3.5, "loop_cpu": 3.25, "process_cpu": 3.4, "python": "3.12.1", "check": 1}"#;
        assert_eq!(json_number(line, "units"), Some(4000.0));
        assert_eq!(json_number(line, "loop_cpu"), Some(3.25));
        assert_eq!(json_number(line, "check"), Some(1.0));
        assert_eq!(json_number(line, "absent"), None);
    }

    #[test]
    fn reads_memray_stats() {
        let text = "\n📏 Total allocations:\n\t145420\n\n📦 Total memory allocated:\n\t792.310MB\n";
        assert_eq!(parse_memray_total(text), Some(145420));
        assert_eq!(
            parse_memray_total("📦 Total memory allocated:\n\t1MB\n"),
            None
        );
    }

    #[test]
    fn counts_probe_runs() {
        let mut run = AllocRun {
            idle_secs: 2.0,
            window_secs: 2.0,
            ..AllocRun::default()
        };
        run.progs.insert(
            "on_alloc".into(),
            ProgWindow {
                idle_ns: 1000,
                idle_runs: 10,
                ns: 100_000,
                runs: 1020,
            },
        );
        run.progs.insert(
            "on_free".into(),
            ProgWindow {
                idle_ns: 0,
                idle_runs: 5,
                ns: 0,
                runs: 900,
            },
        );
        // The frees are not entries; the idle runs of both are other processes'.
        assert_eq!(run.entry_runs(), 1020);
        assert_eq!(run.idle_rate(), 7.5);
        assert_eq!(
            parse_recorded(
                "spanprof: 3.0 GiB allocated in 584,791 allocations, 290 lost, from 1 process"
            ),
            Some(584791)
        );
        assert_eq!(
            parse_recorded("spanprof: 0 B in use at the end in 0, 0 lost"),
            None
        );
        assert!(median(vec![3.0, f64::NAN, 1.0, 2.0]) == 2.0);
    }
}
