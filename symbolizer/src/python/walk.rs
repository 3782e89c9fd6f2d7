//! A user-space walk of one thread's Python stack, over any [`ProcessMemory`].
//!
//! This is the reference the in-kernel walker is compared with, and what validates the offset
//! tables against real interpreters. It yields, innermost first, (code object address,
//! instruction offset) per frame, exactly what the BPF program will record; [`code_info`] then
//! names a code object.
//!
//! Every loop is bounded and every pointer read is checked, so garbage memory ends a walk with
//! an error or a truncated stack, never a panic or a hang.

use rustc_hash::FxHashSet;

use super::lines::{line_for_prefix, LineTableFormat, MAX_LINE_TABLE};
use super::memory::{MemError, ProcessMemory};
use super::offsets::GLIBC_PTHREAD_TID_OFFSET;
use super::offsets::{
    FrameLayout, GilAt, PyOffsets, ThreadIdMatch, FRAME_OWNED_BY_SHIM, GIL_LAST_HOLDER, GIL_LOCKED,
    GIL_SWITCH_NUMBER, STACKREF_TAG_MASK,
};

/// At most this many frames are walked; a deeper stack is marked truncated.
pub const MAX_FRAMES: usize = 1024;
/// At most this many thread states are visited.
pub const MAX_THREADS: usize = 4096;
/// Longest string read from a code object (characters).
pub const MAX_STRING_CHARS: u64 = 4096;

/// Why a walk or a code-object read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    /// A read failed.
    #[error("memory read failed")]
    Memory(#[source] MemError),
    /// No thread state of any interpreter has this kernel thread id.
    #[error("no python thread state for thread {0}")]
    NoThreadState(u32),
    /// `_PyRuntime` has no interpreter (not initialized yet, or finalized).
    #[error("no interpreter in _PyRuntime")]
    NoInterpreter,
    /// A value read is not what it should be (wrong type pointer, absurd length, ...).
    #[error("invalid {0}")]
    Invalid(&'static str),
}

impl From<MemError> for WalkError {
    fn from(e: MemError) -> Self {
        Self::Memory(e)
    }
}

/// One Python frame, as the BPF walker will record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Address of the `PyCodeObject`.
    pub code: u64,
    /// Offset of the current instruction in the bytecode, in bytes (code units × 2). On 3.11+
    /// a frame that has not run its first instruction yet reads as 0.
    pub instr_offset: u32,
}

/// A thread's Python stack, innermost frame first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stack {
    /// The frames read.
    pub frames: Vec<Frame>,
    /// The walk stopped before the outermost frame: [`MAX_FRAMES`] reached, a frame seen twice,
    /// or a read failed midway.
    pub truncated: bool,
}

/// What a code object says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    pub name: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// Format of [`Self::line_table`], from the interpreter's version.
    pub line_format: LineTableFormat,
    /// The bytes of `co_lnotab` (3.8–3.9) or `co_linetable` (3.10+), at most
    /// [`MAX_LINE_TABLE`] of them.
    pub line_table: Vec<u8>,
    /// The table was longer than [`MAX_LINE_TABLE`] and only its start was read.
    pub line_table_truncated: bool,
}

impl CodeInfo {
    /// The line of the instruction at `instr_offset` (bytes, as in [`Frame::instr_offset`]),
    /// when the table gives one.
    pub fn line(&self, instr_offset: u32) -> Option<u32> {
        line_for_prefix(
            self.line_format,
            self.first_line,
            &self.line_table,
            !self.line_table_truncated,
            instr_offset,
        )
    }
}

/// Addresses of type objects used to validate what is read, when known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeAddrs {
    /// `&PyCode_Type`.
    pub code: Option<u64>,
    /// `&PyUnicode_Type`.
    pub unicode: Option<u64>,
}

/// `offsetof(PyObject, ob_type)`, the same in every supported version (non-debug builds).
const OB_TYPE: u64 = 8;
/// `offsetof(PyASCIIObject, hash)` (3.8–3.13): `PyObject_HEAD`, then `length`, then `hash`.
pub const STR_HASH: u64 = 24;
/// `offsetof(PyVarObject, ob_size)` (non-debug builds, 3.8–3.13).
const OB_SIZE: u64 = 16;
/// `offsetof(PyBytesObject, ob_sval)`: `PyObject_VAR_HEAD` then `Py_hash_t ob_shash`
/// (Include/bytesobject.h 3.8, Include/cpython/bytesobject.h 3.9–3.13).
const BYTES_SVAL: u64 = 32;

/// Calls `f` with each thread state of the main interpreter, at most [`MAX_THREADS`], until it
/// returns true; whether it did.
pub fn each_thread_state<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    runtime_addr: u64,
    mut f: impl FnMut(u64) -> Result<bool, WalkError>,
) -> Result<bool, WalkError> {
    // NB: only the main interpreter (`interpreters.head`) is walked; sub-interpreters are rare
    // and their threads would need `PyInterpreterState.next`, which is not in the tables yet.
    let interp = mem.read_ptr(runtime_addr.wrapping_add(off.runtime_interpreters_head))?;
    if interp == 0 {
        return Err(WalkError::NoInterpreter);
    }
    let mut tstate = mem.read_ptr(interp.wrapping_add(off.interp_threads_head))?;
    let mut visited = 0usize;
    while tstate != 0 && visited < MAX_THREADS {
        visited += 1;
        if f(tstate)? {
            return Ok(true);
        }
        tstate = mem.read_ptr(tstate.wrapping_add(off.tstate_next))?;
    }
    Ok(false)
}

/// Finds the thread state of kernel thread `tid` by walking every interpreter's thread list.
pub fn find_thread_state<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    runtime_addr: u64,
    tid: u32,
) -> Result<u64, WalkError> {
    let mut found = None;
    each_thread_state(mem, off, runtime_addr, |tstate| {
        let matches = thread_matches(mem, off, tstate, tid)?;
        if matches {
            found = Some(tstate);
        }
        Ok(matches)
    })?;
    found.ok_or(WalkError::NoThreadState(tid))
}

fn thread_matches<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    tstate: u64,
    tid: u32,
) -> Result<bool, WalkError> {
    match off.thread_match {
        ThreadIdMatch::NativeThreadId(at) => {
            Ok(mem.read_u64(tstate.wrapping_add(at))? == u64::from(tid))
        }
        ThreadIdMatch::PthreadId => {
            let pthread = mem.read_u64(tstate.wrapping_add(off.tstate_thread_id))?;
            // A thread state whose thread exited may point at freed memory: not a match.
            Ok(mem
                .read_i32(pthread.wrapping_add(GLIBC_PTHREAD_TID_OFFSET))
                .is_ok_and(|t| t as u32 == tid))
        }
    }
}

/// Who holds the main interpreter's GIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GilState {
    /// No thread holds it (`locked` is 0, or -1 before the GIL exists).
    Free,
    /// The thread of this kernel id holds it.
    HeldBy(u32),
}

/// Reads who holds the main interpreter's GIL now: `locked` and `last_holder` of its
/// `struct _gil_runtime_state`, twice, with `switch_number` (bumped at every hand-over): a
/// state that changed between the two reads is an error, not a guess. The holder must be one
/// of the interpreter's thread states (at most [`MAX_THREADS`] visited), and names its thread as
/// a sample's walk does (`native_thread_id`, or glibc's `struct pthread` before 3.11).
pub fn gil_state<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    runtime_addr: u64,
) -> Result<GilState, WalkError> {
    let gil = match off.gil {
        GilAt::Runtime(at) => runtime_addr.wrapping_add(at),
        GilAt::InterpreterPointer(at) => {
            let interp = mem.read_ptr(runtime_addr.wrapping_add(off.runtime_interpreters_head))?;
            if interp == 0 {
                return Err(WalkError::NoInterpreter);
            }
            mem.read_ptr(interp.wrapping_add(at))?
        }
    };
    // `interval`, `last_holder`, `locked` (and padding), `switch_number`.
    let read = || -> Result<(u64, i32, u64), WalkError> {
        let mut b = [0u8; 32];
        mem.read(gil, &mut b)?;
        let word = |at: u64| {
            let at = at as usize;
            u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
        };
        let locked = i32::from_le_bytes(
            b[GIL_LOCKED as usize..GIL_LOCKED as usize + 4]
                .try_into()
                .expect("4 bytes"),
        );
        Ok((word(GIL_LAST_HOLDER), locked, word(GIL_SWITCH_NUMBER)))
    };
    let first = read()?;
    let (holder, locked, _) = first;
    match locked {
        1 => {}
        0 | -1 => return Ok(GilState::Free),
        _ => return Err(WalkError::Invalid("GIL lock state")),
    }
    if read()? != first {
        return Err(WalkError::Invalid(
            "GIL state (it changed hands while read)",
        ));
    }
    let known = each_thread_state(mem, off, runtime_addr, |tstate| Ok(tstate == holder))?;
    if !known {
        return Err(WalkError::Invalid("GIL holder (not a thread state)"));
    }
    let tid = match off.thread_match {
        ThreadIdMatch::NativeThreadId(at) => mem.read_u64(holder.wrapping_add(at))?,
        ThreadIdMatch::PthreadId => {
            let pthread = mem.read_u64(holder.wrapping_add(off.tstate_thread_id))?;
            mem.read_i32(pthread.wrapping_add(GLIBC_PTHREAD_TID_OFFSET))? as u64
        }
    };
    match u32::try_from(tid) {
        Ok(tid) if tid > 0 && tid < i32::MAX as u32 => Ok(GilState::HeldBy(tid)),
        _ => Err(WalkError::Invalid("GIL holder's thread id")),
    }
}

/// The innermost frame pointer of a thread state (0 when the thread runs no Python code).
pub fn current_frame<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    tstate: u64,
) -> Result<u64, WalkError> {
    let ptr = mem.read_ptr(tstate.wrapping_add(off.tstate_frame))?;
    match off.frame_layout {
        FrameLayout::CFrame { current_frame } if ptr != 0 => {
            Ok(mem.read_ptr(ptr.wrapping_add(current_frame))?)
        }
        _ => Ok(ptr),
    }
}

/// Walks the frames of thread state `tstate`, innermost first.
pub fn walk_thread_state<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    tstate: u64,
) -> Result<Stack, WalkError> {
    let mut frame = current_frame(mem, off, tstate)?;
    let mut stack = Stack::default();
    let mut seen = FxHashSet::default();
    let mut steps = 0usize;
    while frame != 0 {
        if steps == MAX_FRAMES || !seen.insert(frame) {
            stack.truncated = true;
            break;
        }
        steps += 1;
        match read_frame(mem, off, frame) {
            Ok((Some(f), previous)) => {
                stack.frames.push(f);
                frame = previous;
            }
            Ok((None, previous)) => frame = previous,
            Err(e) if stack.frames.is_empty() => return Err(e),
            Err(_) => {
                stack.truncated = true;
                break;
            }
        }
    }
    Ok(stack)
}

/// The bytes of one frame that [`read_frame`] looks at, read at once: one read per frame
/// instead of three or four (user space walks every thread of a process ahead of its samples in
/// off-CPU sessions). It spans from the first field read to the end of the last, gaps
/// included, all within the frame's struct (76-84 bytes on 3.8-3.10, 32-75 after), and reads
/// the code and instruction fields of a shim frame too (not used).
struct FrameBytes {
    base: u64,
    len: usize,
    buf: [u8; FRAME_BYTES_MAX],
}

/// The span of a frame's fields in every supported version is well under this.
const FRAME_BYTES_MAX: usize = 256;

/// `(offset, size)` of each frame field [`read_frame`] reads.
fn frame_fields(off: &PyOffsets) -> impl Iterator<Item = (u64, u64)> {
    let instr_size = match off.frame_layout {
        FrameLayout::FrameObject { .. } => 4,
        _ => 8,
    };
    [
        (off.frame_previous, 8),
        (off.frame_code, 8),
        (off.frame_instr, instr_size),
    ]
    .into_iter()
    .chain(off.frame_owner.map(|o| (o, 1)))
}

impl FrameBytes {
    fn read<M: ProcessMemory>(mem: &M, off: &PyOffsets, frame: u64) -> Result<Self, WalkError> {
        let (lo, hi) = frame_fields(off).fold((u64::MAX, 0), |(lo, hi), (at, size)| {
            (lo.min(at), hi.max(at.saturating_add(size)))
        });
        let len = usize::try_from(hi - lo)
            .ok()
            .filter(|&l| l <= FRAME_BYTES_MAX)
            .ok_or(WalkError::Invalid("frame fields too far apart"))?;
        let base = frame.wrapping_add(lo);
        let mut buf = [0u8; FRAME_BYTES_MAX];
        mem.read(base, &mut buf[..len])?;
        Ok(FrameBytes { base, len, buf })
    }
}

impl ProcessMemory for FrameBytes {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let range = addr
            .checked_sub(self.base)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| Some(at..at.checked_add(buf.len())?))
            .filter(|r| r.end <= self.len)
            .ok_or(MemError::OutOfBounds {
                addr,
                len: buf.len(),
            })?;
        buf.copy_from_slice(&self.buf[range]);
        Ok(())
    }
}

/// Reads one frame: the [`Frame`] (None for a C-stack shim frame) and the previous frame.
fn read_frame<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    frame: u64,
) -> Result<(Option<Frame>, u64), WalkError> {
    let mem = &FrameBytes::read(mem, off, frame)?;
    let previous = mem.read_ptr(frame.wrapping_add(off.frame_previous))?;
    if let Some(owner) = off.frame_owner {
        if mem.read_u8(frame.wrapping_add(owner))? >= FRAME_OWNED_BY_SHIM {
            return Ok((None, previous));
        }
    }
    let code = mem.read_ptr(frame.wrapping_add(off.frame_code))? & !STACKREF_TAG_MASK;
    if code == 0 {
        return Err(WalkError::Invalid("null code object"));
    }
    let instr_offset = match (off.frame_layout, off.code_adaptive) {
        (
            FrameLayout::FrameObject {
                lasti_in_code_units,
            },
            _,
        ) => {
            let lasti = mem.read_i32(frame.wrapping_add(off.frame_instr))?.max(0) as u32;
            if lasti_in_code_units {
                lasti.saturating_mul(2)
            } else {
                lasti
            }
        }
        (_, Some(adaptive)) => {
            let ip = mem.read_ptr(frame.wrapping_add(off.frame_instr))?;
            let start = code.wrapping_add(adaptive);
            // Before the first instruction 3.11/3.12 point one code unit before the start.
            // A frame suspended in a call points into its CALL instruction: 3.11/3.12
            // `prev_instr` at the CALL itself (C callee) or at its last inline cache entry
            // (Python callee), 3.13 `instr_ptr` at the CALL opcode ("currently executing").
            // Either way the offset is used as is for the line, as CPython's own
            // `_PyInterpreterFrame_LASTI` does; caches share their instruction's location.
            u32::try_from(ip.saturating_sub(start)).unwrap_or(u32::MAX)
        }
        (_, None) => return Err(WalkError::Invalid("offset table without co_code_adaptive")),
    };
    Ok((Some(Frame { code, instr_offset }), previous))
}

/// Walks the Python stack of kernel thread `tid`.
pub fn walk_thread<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    runtime_addr: u64,
    tid: u32,
) -> Result<Stack, WalkError> {
    let tstate = find_thread_state(mem, off, runtime_addr, tid)?;
    walk_thread_state(mem, off, tstate)
}

/// Names a code object.
pub fn code_info<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    types: TypeAddrs,
    code: u64,
) -> Result<CodeInfo, WalkError> {
    if let Some(code_type) = types.code {
        if mem.read_ptr(code.wrapping_add(OB_TYPE))? != code_type {
            return Err(WalkError::Invalid("code object type"));
        }
    }
    let name_field = off.code_qualname.unwrap_or(off.code_name);
    let name = read_str(
        mem,
        off,
        types,
        mem.read_ptr(code.wrapping_add(name_field))?,
    )?;
    let filename = read_str(
        mem,
        off,
        types,
        mem.read_ptr(code.wrapping_add(off.code_filename))?,
    )?;
    let first_line = mem.read_i32(code.wrapping_add(off.code_firstlineno))?;
    let first_line = u32::try_from(first_line).map_err(|_| WalkError::Invalid("co_firstlineno"))?;
    let line_format = LineTableFormat::for_minor(off.version.1).ok_or(WalkError::Invalid(
        "python version without a line table format",
    ))?;
    let (line_table, line_table_truncated) = read_bytes(
        mem,
        mem.read_ptr(code.wrapping_add(off.code_linetable))?,
        MAX_LINE_TABLE,
    )?;
    Ok(CodeInfo {
        name,
        filename,
        first_line,
        line_format,
        line_table,
        line_table_truncated,
    })
}

/// Reads at most `cap` bytes of a `bytes` object; the flag tells whether it was longer.
/// (Its type is not checked: `PyBytes_Type`'s address is not known here.)
pub fn read_bytes<M: ProcessMemory>(
    mem: &M,
    obj: u64,
    cap: usize,
) -> Result<(Vec<u8>, bool), WalkError> {
    let size = mem.read_u64(obj.wrapping_add(OB_SIZE))?;
    // `ob_size` is a `Py_ssize_t`: a negative one is garbage.
    if size > i64::MAX as u64 {
        return Err(WalkError::Invalid("bytes size"));
    }
    let len = usize::try_from(size).unwrap_or(usize::MAX).min(cap);
    let mut buf = vec![0u8; len];
    if len > 0 {
        mem.read(obj.wrapping_add(BYTES_SVAL), &mut buf)?;
    }
    Ok((buf, size > len as u64))
}

/// Reads a compact `str` object (every `str` in a code object is compact).
pub fn read_str<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    types: TypeAddrs,
    obj: u64,
) -> Result<String, WalkError> {
    if let Some(unicode_type) = types.unicode {
        if mem.read_ptr(obj.wrapping_add(OB_TYPE))? != unicode_type {
            return Err(WalkError::Invalid("str type"));
        }
    }
    let len = mem.read_u64(obj.wrapping_add(off.unicode_length))?;
    if len > MAX_STRING_CHARS {
        return Err(WalkError::Invalid("str length"));
    }
    let state = mem.read_u32(obj.wrapping_add(off.unicode_state))?;
    // Include/cpython/unicodeobject.h: interned:2, kind:3, compact:1, ascii:1.
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err(WalkError::Invalid("str state"));
    }
    let data = obj.wrapping_add(if ascii {
        off.unicode_ascii_size
    } else {
        off.unicode_compact_size
    });
    let mut buf = vec![0u8; (len * u64::from(kind)) as usize];
    mem.read(data, &mut buf)?;
    let s = match kind {
        1 if ascii => String::from_utf8(buf).map_err(|_| WalkError::Invalid("ascii str"))?,
        1 => buf.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(
            buf.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => buf
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    };
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::FixtureMemory;
    use crate::python::offsets::ALL;

    /// Every version's frame fields fit one read, and each field read through it is what a
    /// read of the field alone gives.
    #[test]
    fn frame_fields_fit_one_read() {
        for off in ALL {
            let mut mem = FixtureMemory::default();
            let frame = 0x10_0000u64;
            let pattern: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
            mem.insert(frame, pattern);
            let bytes = FrameBytes::read(&mem, off, frame)
                .unwrap_or_else(|e| panic!("{:?}: {e}", off.version));
            assert!(bytes.len <= FRAME_BYTES_MAX, "{:?}", off.version);
            for (at, size) in frame_fields(off) {
                let size = size as usize;
                let (mut one, mut alone) = (vec![0u8; size], vec![0u8; size]);
                bytes.read(frame + at, &mut one).expect("in the span");
                mem.read(frame + at, &mut alone).expect("fixture");
                assert_eq!(one, alone, "{:?} at {at}", off.version);
            }
            // Nothing past the span.
            assert!(bytes
                .read(bytes.base + bytes.len as u64, &mut [0u8; 1])
                .is_err());
        }
    }

    /// The GIL's holder read from a fixture of each version's layout: held, free, a holder
    /// that is not a thread state, and a lock state no interpreter writes.
    #[test]
    fn gil_state_names_the_holder_and_rejects_garbage() {
        for off in ALL {
            let runtime = 0x10_0000u64;
            let interp = 0x20_0000u64;
            let gil_ptr_target = 0x30_0000u64;
            let (t1, t2) = (0x40_0000u64, 0x50_0000u64);
            let pthread = 0x60_0000u64;
            let mut mem = FixtureMemory::new();
            mem.insert(runtime, vec![0; 4096])
                .insert(interp, vec![0; 8192])
                .insert(gil_ptr_target, vec![0; 64])
                .insert(t1, vec![0; 512])
                .insert(t2, vec![0; 512])
                .insert(pthread, vec![0; 1024]);
            mem.write_u64(runtime + off.runtime_interpreters_head, interp)
                .write_u64(interp + off.interp_threads_head, t1)
                .write_u64(t1 + off.tstate_next, t2);
            let gil = match off.gil {
                GilAt::Runtime(at) => runtime + at,
                GilAt::InterpreterPointer(at) => {
                    mem.write_u64(interp + at, gil_ptr_target);
                    gil_ptr_target
                }
            };
            match off.thread_match {
                ThreadIdMatch::NativeThreadId(at) => {
                    mem.write_u64(t2 + at, 4242);
                }
                ThreadIdMatch::PthreadId => {
                    mem.write_u64(t2 + off.tstate_thread_id, pthread)
                        .write(pthread + GLIBC_PTHREAD_TID_OFFSET, &4242i32.to_le_bytes());
                }
            }
            let v = off.version;
            mem.write_u64(gil + GIL_LAST_HOLDER, t2)
                .write(gil + GIL_LOCKED, &1i32.to_le_bytes());
            assert_eq!(
                gil_state(&mem, off, runtime),
                Ok(GilState::HeldBy(4242)),
                "{v:?}"
            );
            mem.write(gil + GIL_LOCKED, &0i32.to_le_bytes());
            assert_eq!(gil_state(&mem, off, runtime), Ok(GilState::Free), "{v:?}");
            mem.write(gil + GIL_LOCKED, &(-1i32).to_le_bytes());
            assert_eq!(gil_state(&mem, off, runtime), Ok(GilState::Free), "{v:?}");
            mem.write(gil + GIL_LOCKED, &7i32.to_le_bytes());
            assert!(gil_state(&mem, off, runtime).is_err(), "{v:?}");
            mem.write(gil + GIL_LOCKED, &1i32.to_le_bytes())
                .write_u64(gil + GIL_LAST_HOLDER, 0x70_0000);
            assert!(gil_state(&mem, off, runtime).is_err(), "{v:?}");
        }
    }
}
