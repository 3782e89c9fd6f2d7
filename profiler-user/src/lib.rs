//! spanprof: a low-overhead eBPF sampling profiler with trace correlation.
pub mod output;
pub mod profile;
