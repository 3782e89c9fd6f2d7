//! The stages between the kernel's records and a [`Profile`](spanprof_profile::profile::Profile).
//!
//! # Overview
//! The record path of one sample, as stages with data in and data out:
//! 1. [`resolve`]: a ring buffer record becomes a [`resolve::Resolved`] sample: its user stack
//!    unwound from the stack copy, its Python frames named (tokens of [`crate::python::Python`]),
//!    its span context and thread facts read. The live system is read here, and only here.
//! 2. [`count`]: a [`count::Counter`] interns and counts each `Resolved` sample; it reads nothing
//!    of the live system (the process descriptions it asks for are given to it as data).
//! 3. [`assemble`]: at the end, the counts and the facts gathered for them (the symbols of the
//!    addresses, the [`assemble::PythonFacts`], the clock offset, the run's metadata) become a
//!    [`spanprof_profile::profile::Profile`]; Python stacks are merged into native ones ([`merge`]) and
//!    off-CPU reasons classified there.
//!
//! [`record`] writes the stream between resolve and count, and the facts of assemble, to a file
//! (`spanprof profile --record`); [`replay`] runs count and assemble from such a file
//! (`spanprof replay`), without root or BPF. [`crate::aggregate::Aggregator`] drives the stages
//! for the collector.
//!
//! Beside them:
//! - [`python`]: CPython processes: finding their interpreter, handing its offsets to the BPF
//!   walker (through [`python::KernelMaps`], which the collector's `bpf::Programs` implements),
//!   and naming the Python frames it records (used by [`resolve`]).
//! - [`offcpu`]: why a blocked thread waited, from the stack it blocked in (used by
//!   [`assemble`]).
//!
//! The collector (crate `spanprof-collect`) drives these stages; this crate loads nothing into
//! the kernel.

// The modules of the profile crate at this crate's root: the modules moved here from the one
// `spanprof` crate keep naming them `crate::profile`, `crate::wording`… as before the split.
use spanprof_profile::{profile, resource, wording};

pub mod aggregate;
pub mod assemble;
pub mod count;
pub mod merge;
pub mod offcpu;
pub mod python;
pub mod record;
pub mod replay;
pub mod resolve;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What to keep of each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Keep kernel frames (`--no-kernel` clears it).
    pub kernel: bool,
    /// Keep the line numbers of Python and inlined native frames (`--no-lines` clears it: one
    /// frame per function).
    pub lines: bool,
    /// Keep only Python frames (`--python-only`).
    pub python_only: bool,
    /// Bytes between two sampled allocations on average (`--alloc-rate`), to scale them.
    pub alloc_rate: u64,
    /// Remember each sampled allocation's stack until the end, for the memory in use
    /// (`--event heap`).
    pub heap: bool,
    /// Keep each event's time (for outputs with timestamps: OTLP), up to
    /// [`count::MAX_TIMED`].
    pub timestamps: bool,
    /// Distinct count keys (stack, thread, span, event) at most, 0 for no limit; samples of
    /// new keys past it are dropped and counted ([`count::Counter::dropped`]).
    pub max_keys: usize,
    /// Processes at most, 0 for no limit; samples of new processes past it are dropped.
    pub max_processes: usize,
    /// Record the samples as they are counted and the facts of the profile, for
    /// `spanprof replay` (`--record`).
    pub record: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kernel: true,
            lines: true,
            python_only: false,
            alloc_rate: crate::profile::DEFAULT_ALLOC_RATE,
            heap: false,
            timestamps: false,
            max_keys: 0,
            max_processes: 0,
            record: false,
        }
    }
}
