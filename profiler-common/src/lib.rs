//! The kernel/user ABI of spanprof.
//!
//! # Overview
//! The C header `profiler-ebpf/include/spanprof_abi.h` is the source of truth. This crate mirrors
//! it in `#[repr(C)]` types that user space reads out of ring buffer records and writes into maps.
//! A test generates C `_Static_assert`s from the Rust layout (size, alignment and every field
//! offset) and compiles them against the header, so a change on one side fails the build of the
//! tests until the other side follows.
//!
//! # Design constraints
//! Fixed-width integers only, explicit padding, no `bool`, every struct `Copy` and a multiple of
//! 8 bytes, so a record can be read from any byte slice with [`Sample::from_bytes`].
#![no_std]

/// Maximum frames of one kernel or user stack (perf's default `kernel.perf_event_max_stack`).
pub const MAX_STACK_DEPTH: usize = 127;
/// Length of a task's `comm`, NUL-padded.
pub const TASK_COMM_LEN: usize = 16;
/// Record kind of a [`Sample`].
pub const RECORD_SAMPLE: u32 = 1;

/// Process named by the user (`--pid` or the `--` command).
pub const TARGET_EXPLICIT: u32 = 1;
/// Process forked by a profiled process.
pub const TARGET_CHILD: u32 = 2;

/// Indexes of the per-CPU error counters in the `errors` map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    /// The ring buffer was full; the sample was lost.
    RingbufFull = 0,
    /// `bpf_get_stack` failed for the kernel stack.
    KernelStack = 1,
    /// `bpf_get_stack` failed for the user stack.
    UserStack = 2,
    /// A child process could not be added to `target_pids`.
    PidMapFull = 3,
}

/// Number of slots in the `errors` map.
pub const ERROR_COUNT: u32 = 8;

impl ErrorCode {
    /// Every code, for reporting.
    pub const ALL: [ErrorCode; 4] = [
        ErrorCode::RingbufFull,
        ErrorCode::KernelStack,
        ErrorCode::UserStack,
        ErrorCode::PidMapFull,
    ];

    /// What the counter means, for summaries.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorCode::RingbufFull => "samples lost: ring buffer full",
            ErrorCode::KernelStack => "kernel stacks not captured",
            ErrorCode::UserStack => "user stacks not captured",
            ErrorCode::PidMapFull => "child processes not followed: pid map full",
        }
    }
}

/// Value of the `target_pids` map (`struct spanprof_target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Target {
    /// [`TARGET_EXPLICIT`] or [`TARGET_CHILD`].
    pub flags: u32,
    /// Parent process of a child target, 0 for explicit ones.
    pub parent_tgid: u32,
}

/// Size of [`SampleHeader`], where the frames of a sample record begin.
pub const SAMPLE_HEADER_SIZE: usize = 48;

/// The fixed part of one on-CPU sample record (`struct spanprof_sample` up to `stack`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct SampleHeader {
    /// [`RECORD_SAMPLE`].
    pub kind: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the sample.
    pub time_ns: u64,
    /// Kernel frames captured, or a negative errno.
    pub kstack_len: i32,
    /// User frames captured, or a negative errno.
    pub ustack_len: i32,
    /// Thread name, NUL-padded.
    pub comm: [u8; TASK_COMM_LEN],
}

// SAFETY: plain old data, every bit pattern valid, no padding (checked by the layout test).
unsafe impl Pod for SampleHeader {}
// SAFETY: as above.
unsafe impl Pod for Target {}

/// Types that may be reinterpreted from any bytes of the right length.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding and accept every bit pattern.
pub unsafe trait Pod: Copy {}

/// A sample record read from the ring buffer: the header and the frames that follow it.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The fixed fields.
    pub header: &'a SampleHeader,
    kernel: &'a [u64],
    user: &'a [u64],
}

impl<'a> Sample<'a> {
    /// Reads a record, or `None` when it is not a sample, is misaligned, or is shorter than its
    /// header says: the lengths are clamped to what the record holds, never trusted.
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Sample<'a>> {
        if bytes.len() < SAMPLE_HEADER_SIZE || bytes.as_ptr().align_offset(8) != 0 {
            return None;
        }
        // SAFETY: length and alignment checked above; SampleHeader is Pod.
        let header = unsafe { &*(bytes.as_ptr() as *const SampleHeader) };
        if header.kind != RECORD_SAMPLE {
            return None;
        }
        let frames_bytes = &bytes[SAMPLE_HEADER_SIZE..];
        // SAFETY: the pointer is 8-aligned (the record is, and the header is 48 bytes) and the
        // length covers whole u64s inside `bytes`; every bit pattern is a valid u64.
        let frames = unsafe {
            core::slice::from_raw_parts(frames_bytes.as_ptr() as *const u64, frames_bytes.len() / 8)
        };
        let k = clamp(header.kstack_len).min(frames.len());
        let u = clamp(header.ustack_len).min(frames.len() - k);
        Some(Sample {
            header,
            kernel: &frames[..k],
            user: &frames[k..k + u],
        })
    }

    /// The kernel stack, leaf first (empty on error or in user mode).
    pub fn kernel_stack(&self) -> &'a [u64] {
        self.kernel
    }

    /// The user stack, leaf first (empty on error).
    pub fn user_stack(&self) -> &'a [u64] {
        self.user
    }

    /// The thread name up to its first NUL.
    pub fn comm(&self) -> &'a [u8] {
        comm_bytes(&self.header.comm)
    }
}

/// A NUL-padded task name up to its first NUL.
pub fn comm_bytes(comm: &[u8; TASK_COMM_LEN]) -> &[u8] {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(TASK_COMM_LEN);
    &comm[..end]
}

fn clamp(len: i32) -> usize {
    usize::try_from(len).unwrap_or(0).min(MAX_STACK_DEPTH)
}

// SAFETY: Target is repr(C), padding-free and valid for every bit pattern (layout test).
#[cfg(feature = "user")]
unsafe impl aya::Pod for Target {}

#[cfg(test)]
mod tests;
