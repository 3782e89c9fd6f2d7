//! CPython support: finding the interpreter in a process, per-version struct offsets, and a
//! user-space reference walk of a thread's Python frames.
//!
//! # Overview
//! - [`detect::detect`] finds the module holding CPython (libpython or the executable), its
//!   version and the run-time address of `_PyRuntime`.
//! - [`offsets::for_version`] gives the struct offsets a frame walk needs, for 3.8–3.15;
//!   on 3.13+ they are cross-checked with the runtime's own `_Py_DebugOffsets`.
//! - [`walk::walk_thread`] walks the Python frames of one kernel thread through any
//!   [`memory::ProcessMemory`] and yields (code object, instruction offset) pairs, the
//!   record the BPF walker will produce; [`walk::code_info`] names a code object and reads
//!   its line table.
//! - [`names::CodeNames`] names the (code object, instruction offset) pairs the BPF walker
//!   records, per process, cached and validated against reuse of freed code objects.
//! - [`objects`] reads dicts, attributes and modules of a live process from user space, to find
//!   the tracing libraries' objects the BPF program reads span contexts through.
//! - [`lines`] turns an instruction offset into a line number for each version's line table
//!   format ([`walk::CodeInfo::line`]).
//!
//! # Design constraints
//! Reading a running process from user space races with it: objects may be freed while read.
//! The walker is only a reference and a test oracle; samples are read in BPF while the thread is
//! stopped. x86_64 only; default (non-debug, GIL) builds only.

pub mod cold;
pub mod detect;
pub mod lines;
pub mod memory;
pub mod names;
pub mod objects;
pub mod offsets;
pub mod threads;
pub mod walk;

#[cfg(test)]
mod header_check;

#[cfg(test)]
mod tests;
