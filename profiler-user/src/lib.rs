//! spanprof: a low-overhead eBPF sampling profiler for Linux with trace correlation.
//!
//! # Overview
//! One sample's life (ARCHITECTURE.md tells it in full), crate by crate:
//! 1. `spanprof_collect::bpf` loads the C programs of `profiler-ebpf/` and attaches a
//!    `perf_event` program to a software `cpu-clock` event on every CPU; for processes in the
//!    `target_pids` map it sends a [`profiler_common::Sample`] (kernel and user stacks, thread
//!    id and name, and for CPython processes the Python frames it walked and the thread's span
//!    context: OpenTelemetry's current span, OSProfiler's trace stack, or the OTEP 4947 thread
//!    context the process publishes) through a ring buffer. With `--event offcpu` or `wall`,
//!    blocked intervals of the targets' threads are sampled at `sched_switch` and sent, with the
//!    same stacks, when the thread leaves its system call (`spanprof_pipeline::offcpu` names
//!    why it waited); with `--event alloc` or `heap`, uprobes on the malloc family and
//!    CPython's arena allocator send byte-sampled allocations, and the heap profile tracks the
//!    sampled addresses until they are freed.
//! 2. The collector (crate `spanprof-collect`, driven by [`session`], [`daemon`] and
//!    [`verify`]) drains the ring buffer into the stages of crate `spanprof-pipeline`: the
//!    `Aggregator` interns stacks and counts them per thread, and has new addresses
//!    normalized while processes are alive; `python` finds CPython processes, hands their
//!    offsets to the BPF walker, names Python frames during the drain, and finds the tracing
//!    libraries' objects for the span reader (every drain, 50 or 100 ms, as modules are imported). Counts
//!    are kept per span context too.
//!    The `Aggregator` runs the pipeline's resolve stage (unwinding, Python naming: the live
//!    reads) and its count stage (interning and counting, reading nothing live).
//! 3. At the end, the aggregate is symbolized (crate `symbolizer`) and assembled into a
//!    `Profile` (crate `spanprof-profile`) from the counts and those facts as data
//!    (`spanprof_pipeline::assemble`), Python frames merged into the native stacks
//!    (`spanprof_pipeline::merge`). `profile --record` records what the count and assemble
//!    stages were given (`spanprof_pipeline::record`); `spanprof replay` runs them again from
//!    it (`spanprof_pipeline::replay`).
//! 4. `spanprof_profile::format` renders the profile as SVG, folded stacks, pprof (span ids
//!    and names as labels), speedscope or OTLP, grouped by span if asked, and reads pprof,
//!    folded and OTLP files back; `spanprof_profile::write` puts the files in place
//!    atomically with mode 0600, and [`export`] sends OTLP to a collector. Crate
//!    `spanprof-analysis` keeps one trace's or span's samples of a profile read back
//!    (`filter`: by id or name glob; or one event's, or threads'), and gives `report`, `diff`
//!    and `check` each function's share, the change of shares between two runs and budgets;
//!    [`summary`] prints the session's summary.
//!
//! This crate is the `spanprof` binary: the command line (`main.rs`, `cli.rs`), the three
//! drivers of the collector ([`session`] with [`command`], [`daemon`], [`verify`]), the OTLP
//! [`export`]er, the session [`summary`], and [`dump`] (every thread's stack, state and span now).
//!
//! # Design constraints
//! The per-sample path (BPF program and `spanprof_pipeline::aggregate::Aggregator::record`) is
//! bounded and does not allocate for stacks it has seen before. Nothing is lost silently: ring buffer overflows and
//! other in-kernel failures are counted per CPU and reported.
//!
//! # Minimum kernel
//! Linux 5.17 (`bpf_loop`, which the Python and span walks run in; also `bpf_task_pt_regs` from
//! 5.15, task storage, `tp_btf`, the BPF ring buffer, `CAP_BPF`/`CAP_PERFMON` from 5.8) with BTF
//! (`CONFIG_DEBUG_INFO_BTF=y`) for CO-RE relocation; [`dump`] needs 6.8 (a trusted task
//! argument of global BPF functions). Developed and tested on 6.18. Needs `CAP_BPF` and `CAP_PERFMON`
//! (or root / `CAP_SYS_ADMIN`); reading other users' processes' memory maps needs
//! `CAP_SYS_PTRACE`, and kernel symbols need `CAP_SYSLOG`.

// The modules of the crates below at this crate's root: the modules that stayed here when the
// one `spanprof` crate was split keep naming them `crate::profile`, `crate::collect`… as before.
use spanprof_analysis::stats;
use spanprof_collect as collect;
#[cfg(test)]
use spanprof_collect::target_cpu;
use spanprof_collect::{bpf, preflight};
use spanprof_pipeline::aggregate;
use spanprof_profile::{format, privacy, profile, resource, wording};

// Prints that never panic (`profiler_common::stderr_lossy!`): a closed stderr or stdout must
// not end a session before it writes its outputs.
#[allow(unused_macros)]
macro_rules! eprintln { ($($a:tt)*) => { profiler_common::stderr_line_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! eprint { ($($a:tt)*) => { profiler_common::stderr_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! println { ($($a:tt)*) => { profiler_common::stdout_line_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! print { ($($a:tt)*) => { profiler_common::stdout_lossy!($($a)*) } }

pub mod command;
pub mod daemon;
pub mod dump;
pub mod export;
pub mod session;
pub mod summary;
pub mod top;
pub mod verify;
