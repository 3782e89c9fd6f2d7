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
//!   `spanprof --unwind fp` and `perf record --call-graph dwarf`, all at `UNWIND_HZ` ([`unwind`](mod@unwind)),
//!   interleaved. cpu_split runs for a time and is not gated, so it is started behind a shell
//!   gate that execs it on the release (`GATE`); the profilers attach to the shell's pid and
//!   follow the exec. Completeness (the share of the work's samples whose user stack ends
//!   main;dispatcher;hot_*) and depth come from spanprof's folded output and from `perf script`
//!   folded here (`fold_perf_script`); the costs are spanprof's in-kernel time and own CPU per
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
//!   `memray run`, interleaved; method in [`crate::bench::alloc`] and in its block.
//! - Daemon (the `bench-daemon` block): `spanprof daemon` host-wide at 19 Hz beside two busy
//!   Python processes, its own CPU and RSS, against `perf record -F 19 -a -g`; method in
//!   [`crate::bench::daemon`] and in BENCHMARKS.md.
//!
//! - Session (the `bench-session` block): the fixed CPU of a session and the CPU per sample in
//!   steady state of spanprof, py-spy record and perf record on a shallow Python stack, by the
//!   difference of two session lengths; method in [`crate::bench::session`].
//! - Dump (the `bench-dump` block): the wall time of `spanprof dump` and `py-spy dump` on an
//!   11-thread Python process, in turn; method in [`crate::bench::dump`].
//!
//! `--only native|python|spans|unwind|offcpu|alloc|daemon|sid|session|dump` runs one part. Each
//! round's raw measurements go to
//! `target/bench/{native,python,spans,unwind,offcpu,alloc,daemon,session}_rounds.txt`
//! (`spans_KIND_rounds.txt` for a `--span-kinds` other than both).
//!
//! The results are printed and written between the markers of BENCHMARKS.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub mod alloc;
mod blocks;
pub mod daemon;
mod dump;
mod json;
mod measure;
mod native;
mod offcpu;
mod profilers;
mod python;
mod session;
mod spans;
mod unwind;

pub(crate) use blocks::replace_block;
use blocks::write_block;
use dump::dump;
use native::native;
use offcpu::offcpu;
use python::{python, sid_pythons};
use session::session;
use spans::spans;
use unwind::unwind;

/// Which parts of the benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    All,
    Native,
    Python,
    Spans,
    Unwind,
    Offcpu,
    /// `--only alloc`: allocation profiling against memray ([`crate::bench::alloc`]).
    Alloc,
    /// `--only daemon`: the host-wide daemon's own cost ([`crate::bench::daemon`]).
    Daemon,
    /// `--only sid`: the 50-frame Python stack under Debian sid's 3.14 and 3.15, in a chroot.
    Sid,
    /// `--only session`: a session's fixed cost and its cost per sample
    /// ([`crate::bench::session`]).
    Session,
    /// `--only dump`: `spanprof dump` beside `py-spy dump` ([`crate::bench::dump`]).
    Dump,
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
        let mut tables = Vec::new();
        for (workload, units) in [
            (alloc::Workload::Mixed, cfg.alloc_units),
            (alloc::Workload::MallocHeavy, alloc::MALLOC_HEAVY_UNITS),
        ] {
            let alloc_cfg = alloc::Config {
                rounds: cfg.rounds,
                python: cfg.python.clone(),
                units,
                workload,
                alloc_units: cfg.alloc_units,
            };
            tables.push(alloc::run(root, spanprof, &out_dir, &alloc_cfg)?);
        }
        Some(tables.join("\n"))
    } else {
        None
    };
    let daemon_table = if wants(Part::Daemon) {
        let daemon_cfg = daemon::Config {
            rounds: cfg.rounds,
            python: cfg.python.clone(),
            venv_python: cfg.venv_python.clone(),
            seconds: cfg.daemon_seconds,
        };
        Some(daemon::run(root, spanprof, &out_dir, &daemon_cfg)?)
    } else {
        None
    };
    let sid_table = if wants(Part::Sid) {
        Some(sid_pythons(root, spanprof, &out_dir, cfg)?)
    } else {
        None
    };
    let session_table = if wants(Part::Session) {
        Some(session(root, spanprof, &out_dir, cfg)?)
    } else {
        None
    };
    let dump_table = if wants(Part::Dump) {
        Some(dump(root, spanprof, cfg)?)
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
            session_table,
            "bench-session",
            Some("Session: fixed cost and cost per sample, shallow Python stack"),
        ),
        (
            dump_table,
            "bench-dump",
            Some("dump: an 11-thread Python process, beside py-spy dump"),
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
