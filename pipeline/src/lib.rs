//! The stages between the kernel's records and a [`Profile`](spanprof_profile::profile::Profile).
//!
//! # Overview
//! - [`aggregate`]: decoding each record, unwinding its user stack, interning the stacks and
//!   counting them per thread and span; at the end, symbolizing (crate `symbolizer`) and
//!   assembling the profile, with Python frames merged into the native stacks
//!   ([`aggregate::merge`]).
//! - [`python`]: CPython processes: finding their interpreter, handing its offsets to the BPF
//!   walker (through [`python::KernelMaps`], which the collector's `bpf::Programs` implements),
//!   and naming the Python frames it records.
//! - [`offcpu`]: why a blocked thread waited, from the stack it blocked in.
//!
//! The collector (crate `spanprof-collect`) drives these stages; this crate loads nothing into
//! the kernel.

// The modules of the profile crate at this crate's root: the modules moved here from the one
// `spanprof` crate keep naming them `crate::profile`, `crate::wording`… as before the split.
use spanprof_profile::{profile, resource, wording};

pub mod aggregate;
pub mod offcpu;
pub mod python;

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
