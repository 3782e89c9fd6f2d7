//! Recordings of a session (`spanprof profile --record FILE`), which `spanprof replay` runs
//! the count and assemble stages from, without root or BPF.
//!
//! # Format (version 4)
//! A gzip stream of:
//! - the header: [`MAGIC`], the format version (varint), the version of spanprof that wrote it
//!   (a string), and the [`Options`] counting and assembly depend on (a flags byte: kernel,
//!   lines, python-only, heap, timestamps; then alloc rate, key and process limits);
//! - events, each a tag byte and its fields, in the order the count stage saw them:
//!   [`TAG_SAMPLE`] a [`Resolved`](super::resolve::Resolved) sample, [`TAG_EXEC`] an execve,
//!   [`TAG_DESCRIBE`] a process's name and resource as read for the count stage, [`TAG_LIVE`]
//!   the allocations in use at the end (`heap`), [`TAG_ERRORS`] the kernel's error counters;
//! - [`TAG_END`], then the facts of assembly: the symbols of the user addresses (in the order
//!   of [`Counter::addresses`](super::count::Counter::addresses); since version 2 each with
//!   the functions inlined at it, their names, files and lines: a count, 0 for a kernel
//!   address; since version 3 then its module's GNU build id and `htlhash`, strings that may
//!   be absent) and of the kernel addresses, the [`PythonFacts`](super::assemble::PythonFacts) (since version 3 each function's first line,
//!   0 when unknown, else the line + 1), the clock offset and the
//!   run's metadata; then [`TAG_TRAILER`] and the end of the stream.
//!
//! Numbers are LEB128 varints (signed ones zigzag-encoded), strings have their length. A sample
//! says which of its optional fields follow in a flags varint; its stacks and span context are
//! written once, then referred to by index (stacks as the differences between addresses); its
//! thread's `comm` and Python thread name only when they changed; its time as the difference
//! from the sample before. Symbol strings are written once and referred to after.
//!
//! # Design constraints
//! The recording holds what the outputs would hold and no more: the profile's own addresses,
//! symbols, names, ids and command lines, and the facts they were made of. The writer keeps the
//! compressed stream in memory until the end ([`MAX_UNCOMPRESSED`] at most); the reader
//! ([`read`]) bounds every length and table before allocating, so a damaged or hostile file
//! gives a one-line error.

pub mod codec;
pub mod read;
pub mod write;

pub use read::{Header, Reader};
pub use write::Recorder;

use super::Options;

/// The first bytes of a recording (uncompressed).
pub const MAGIC: &[u8; 19] = b"spanprof recording\n";
/// The version of the format this build writes (and the newest it reads): 2 added the
/// functions inlined at a user address to its symbol, 3 its module file's ids (GNU build id,
/// `htlhash`) and a Python function's first line, 4 the module of a Python process's
/// interpreter.
pub const FORMAT_VERSION: u32 = 4;
/// The oldest version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Bytes of a recording, uncompressed, at most (written and read).
pub const MAX_UNCOMPRESSED: u64 = 1 << 30;

/// A sample ([`super::resolve::Resolved`]).
pub const TAG_SAMPLE: u8 = 1;
/// A process called execve.
pub const TAG_EXEC: u8 = 2;
/// A process's name and resource, as read for the count stage.
pub const TAG_DESCRIBE: u8 = 3;
/// The sampled allocations in use at the end (`--event heap`).
pub const TAG_LIVE: u8 = 4;
/// The kernel's error counters at the end of the session.
pub const TAG_ERRORS: u8 = 5;
/// The end of the events; the facts of assembly follow.
pub const TAG_END: u8 = 6;
/// The last byte of a recording.
pub const TAG_TRAILER: u8 = 0x5a;

/// Sample flag: the thread's `comm` follows.
const S_COMM: u64 = 1;
/// Sample flag: the thread's Python name follows.
const S_THREAD_NAME: u64 = 2;
/// Sample flag: the kernel stack follows (else its index).
const S_KERNEL_NEW: u64 = 4;
/// Sample flag: the user stack follows (else its index).
const S_USER_NEW: u64 = 8;
/// Sample flag: the Python stack follows (else its index).
const S_PYTHON_NEW: u64 = 16;
/// Sample flag: the sample has a span context (its index follows).
const S_SPAN: u64 = 32;
/// Sample flag: the span context follows (else its index).
const S_SPAN_NEW: u64 = 64;
/// Sample flag: the weight follows (off-CPU ns, allocated bytes).
const S_WEIGHT: u64 = 128;
/// Sample flag: the allocation id follows.
const S_ALLOC_ID: u64 = 256;
/// Sample flag: the off-CPU facts follow (an allocation's: `resolve::ALLOC_ARENA` for a pymalloc arena;
/// recordings made before it had none, and replay shows their arenas as plain mmaps).
const S_OFF_CPU: u64 = 512;
/// Every sample flag.
const S_ALL: u64 = 1023;

/// Options flags byte.
const O_KERNEL: u8 = 1;
const O_LINES: u8 = 2;
const O_PYTHON_ONLY: u8 = 4;
const O_HEAP: u8 = 8;
const O_TIMESTAMPS: u8 = 16;

#[cfg(test)]
mod tests;

use symbolizer::unwind::{FailedBy, TruncatedBy, UnwindStatus};

/// The byte of an [`UnwindStatus`].
fn unwind_code(s: UnwindStatus) -> u8 {
    match s {
        UnwindStatus::Complete => 0,
        UnwindStatus::Unchecked => 1,
        UnwindStatus::Truncated(TruncatedBy::StackCopy) => 2,
        UnwindStatus::Truncated(TruncatedBy::Depth) => 3,
        UnwindStatus::Failed(f) => {
            16 + match f {
                FailedBy::StackUnreadable => 0,
                FailedBy::OutsideStack => 1,
                FailedBy::FramePointerBackwards => 2,
                FailedBy::NoProgress => 3,
                FailedBy::Overflow => 4,
                FailedBy::NoUnwindInfo => 5,
                FailedBy::ProcessGone => 6,
                FailedBy::LeftMappedCode => 7,
            }
        }
    }
}

/// The [`UnwindStatus`] of a byte of [`unwind_code`].
fn unwind_status(b: u8) -> Option<UnwindStatus> {
    Some(match b {
        0 => UnwindStatus::Complete,
        1 => UnwindStatus::Unchecked,
        2 => UnwindStatus::Truncated(TruncatedBy::StackCopy),
        3 => UnwindStatus::Truncated(TruncatedBy::Depth),
        16 => UnwindStatus::Failed(FailedBy::StackUnreadable),
        17 => UnwindStatus::Failed(FailedBy::OutsideStack),
        18 => UnwindStatus::Failed(FailedBy::FramePointerBackwards),
        19 => UnwindStatus::Failed(FailedBy::NoProgress),
        20 => UnwindStatus::Failed(FailedBy::Overflow),
        21 => UnwindStatus::Failed(FailedBy::NoUnwindInfo),
        22 => UnwindStatus::Failed(FailedBy::ProcessGone),
        23 => UnwindStatus::Failed(FailedBy::LeftMappedCode),
        _ => return None,
    })
}

/// The options flags byte.
fn options_flags(o: &Options) -> u8 {
    let mut f = 0;
    for (on, bit) in [
        (o.kernel, O_KERNEL),
        (o.lines, O_LINES),
        (o.python_only, O_PYTHON_ONLY),
        (o.heap, O_HEAP),
        (o.timestamps, O_TIMESTAMPS),
    ] {
        if on {
            f |= bit;
        }
    }
    f
}
