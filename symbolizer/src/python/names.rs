//! Naming the Python frames the BPF walker records: (code object, check, instruction offset)
//! → (function, line), per process, cached.
//!
//! The walker reads only addresses while the thread is stopped; names are read here, from user
//! space, shortly after (at the next drain of the ring buffer). By then a code object may have
//! been freed and its address reused, so each frame carries a check value taken in the kernel:
//! on 3.11+ the address of the frame's function object (which holds a reference to its code),
//! before 3.11 `co_filename`'s address and `co_firstlineno` ([`PyFrame::check_value`]). A name
//! is trusted only when the memory read now agrees (the function still points at the code, or
//! the code's fields give the same value). A cache entry is keyed by the code address and
//! replaced when a frame arrives with another check value.
//!
//! The hot path (a code object and an instruction offset seen before) is two hash lookups and
//! allocates nothing.

use profiler_common::PyFrame;
use rustc_hash::FxHashMap;

use super::memory::{MemError, ProcessMemory};
use super::offsets::PyOffsets;
use super::walk::{code_info, CodeInfo, TypeAddrs, WalkError};

/// At most this many code objects are cached per process; beyond, the cache starts over (a
/// process that generates code endlessly must not grow spanprof without bound).
pub const MAX_CODES: usize = 1 << 16;

/// What [`CodeNames::resolve`] hands to the caller's interner for a new code object.
#[derive(Debug, Clone, Copy)]
pub enum CodeRead<'a> {
    /// The object was read and matches the sample.
    Code(&'a CodeInfo),
    /// The object could not be read (process gone, garbage, freed).
    Unreadable(&'a WalkError),
    /// The object read does not match what the kernel saw: it was freed and the address reused.
    Replaced,
}

#[derive(Debug)]
struct Slot {
    check: u64,
    /// The caller's id for the function (from its interner).
    func: u32,
    /// What identifies the object named: its name, `co_filename` and first line.
    fingerprint: Option<Fingerprint>,
    info: Option<CodeInfo>,
    /// Line by instruction offset, computed once each.
    lines: FxHashMap<u32, Option<u32>>,
}

/// Statistics, for the summary and for tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NameStats {
    /// Code objects read from the process.
    pub reads: u64,
    /// Reads that failed.
    pub failed: u64,
    /// Code objects that no longer matched the sample (freed and reused).
    pub replaced: u64,
    /// Known code objects met with another check value and compared by fingerprint.
    pub fingerprints: u64,
}

/// The addresses of a code object's name and `co_filename`, and its `co_firstlineno`: two
/// code objects alike in all three are the same function.
type Fingerprint = (u64, u64, u32);

/// Reads a code object's [`Fingerprint`] in one read of the span of the three fields.
fn fingerprint<M: ProcessMemory>(
    mem: &M,
    off: &PyOffsets,
    code: u64,
) -> Result<Fingerprint, MemError> {
    let name = off.code_qualname.unwrap_or(off.code_name);
    let lo = name.min(off.code_filename).min(off.code_firstlineno);
    let hi = (name.max(off.code_filename) + 8).max(off.code_firstlineno + 4);
    let mut buf = [0u8; 256];
    let span = usize::try_from(hi - lo).unwrap_or(usize::MAX);
    let buf = buf.get_mut(..span).ok_or(MemError::OutOfBounds {
        addr: code,
        len: span,
    })?;
    mem.read(code.wrapping_add(lo), buf)?;
    let at = |o: u64| (o - lo) as usize;
    let u64_at = |o: u64| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[at(o)..at(o) + 8]);
        u64::from_le_bytes(b)
    };
    let mut first = [0u8; 4];
    first.copy_from_slice(&buf[at(off.code_firstlineno)..at(off.code_firstlineno) + 4]);
    Ok((
        u64_at(name),
        u64_at(off.code_filename),
        u32::from_le_bytes(first),
    ))
}

/// The code-object names of one CPython process.
#[derive(Debug)]
pub struct CodeNames<M> {
    mem: M,
    offsets: &'static PyOffsets,
    types: TypeAddrs,
    codes: FxHashMap<u64, Slot>,
    stats: NameStats,
}

impl<M: ProcessMemory> CodeNames<M> {
    /// Names for a process read through `mem`, of the version `offsets` describes.
    pub fn new(mem: M, offsets: &'static PyOffsets, types: TypeAddrs) -> Self {
        CodeNames {
            mem,
            offsets,
            types,
            codes: FxHashMap::default(),
            stats: NameStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> NameStats {
        self.stats
    }

    /// Whether the code object read now is the one the kernel saw: on 3.11+ the frame's
    /// function still runs this code; before, the check value of the code's own fields agrees.
    fn matches(&self, info: &CodeInfo, frame: &PyFrame) -> bool {
        match self.offsets.func_code {
            // A frame without a function (none seen in practice): the type check must do.
            Some(_) if frame.check == 0 => true,
            Some(at) => self
                .mem
                .read_ptr(frame.check.wrapping_add(at))
                .is_ok_and(|code| code == frame.code),
            None => PyFrame::check_value(info.filename_addr, info.first_line as i32) == frame.check,
        }
    }

    /// The function id and line of a recorded frame. `intern` is called once per new code
    /// object (or changed one) and returns the caller's id for it.
    pub fn resolve(
        &mut self,
        frame: &PyFrame,
        mut intern: impl FnMut(CodeRead<'_>) -> u32,
    ) -> (u32, Option<u32>) {
        let fresh = match self.codes.get_mut(&frame.code) {
            Some(slot) if slot.check == frame.check => false,
            // Another check value for a code object named before: on 3.11+ most often the
            // same code run by another function object (closures, lambdas, generator
            // expressions make one per call). Keep the name if the object at this address is
            // still the one named; one read, no allocation.
            Some(slot) if slot.info.is_some() => {
                self.stats.fingerprints += 1;
                let same = fingerprint(&self.mem, self.offsets, frame.code)
                    .is_ok_and(|f| Some(f) == slot.fingerprint);
                if same {
                    slot.check = frame.check;
                }
                !same
            }
            _ => true,
        };
        if fresh {
            if self.codes.len() >= MAX_CODES {
                self.codes.clear();
            }
            self.stats.reads += 1;
            let slot = match code_info(&self.mem, self.offsets, self.types, frame.code) {
                Ok(info) if self.matches(&info, frame) => Slot {
                    check: frame.check,
                    func: intern(CodeRead::Code(&info)),
                    fingerprint: fingerprint(&self.mem, self.offsets, frame.code).ok(),
                    info: Some(info),
                    lines: FxHashMap::default(),
                },
                Ok(_) => {
                    self.stats.replaced += 1;
                    Slot {
                        check: frame.check,
                        func: intern(CodeRead::Replaced),
                        fingerprint: None,
                        info: None,
                        lines: FxHashMap::default(),
                    }
                }
                Err(e) => {
                    self.stats.failed += 1;
                    Slot {
                        check: frame.check,
                        func: intern(CodeRead::Unreadable(&e)),
                        fingerprint: None,
                        info: None,
                        lines: FxHashMap::default(),
                    }
                }
            };
            self.codes.insert(frame.code, slot);
        }
        let slot = self
            .codes
            .get_mut(&frame.code)
            .expect("inserted above when missing");
        let line = match &slot.info {
            None => None,
            Some(info) => *slot
                .lines
                .entry(frame.instr)
                .or_insert_with(|| info.line(frame.instr)),
        };
        (slot.func, line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::FixtureMemory;
    use crate::python::offsets::{for_version, PyOffsets};

    const BASE: u64 = 0x10_0000;
    const CODE: u64 = BASE;
    const NAME: u64 = BASE + 0x400;
    const FILE: u64 = BASE + 0x500;
    const TABLE: u64 = BASE + 0x600;
    const FUNC: u64 = BASE + 0x700;

    fn ascii(mem: &mut FixtureMemory, o: &PyOffsets, at: u64, s: &str) {
        mem.write_u64(at + o.unicode_length, s.len() as u64);
        // kind 1 (bits 2-4), compact (bit 5), ascii (bit 6).
        let state: u32 = (1 << 2) | (1 << 5) | (1 << 6);
        mem.write(at + o.unicode_state, &state.to_le_bytes());
        mem.write(at + o.unicode_ascii_size, s.as_bytes());
    }

    /// A 3.12 code object `Worker.run` in `app.py` at line 10, run by the function at FUNC.
    fn fixture() -> (FixtureMemory, &'static PyOffsets) {
        let o = for_version(3, 12).expect("3.12 table");
        let mut mem = FixtureMemory::new();
        mem.insert(BASE, vec![0; 0x1000]);
        ascii(&mut mem, o, NAME, "Worker.run");
        ascii(&mut mem, o, FILE, "/srv/app.py");
        mem.write_u64(CODE + o.code_qualname.unwrap(), NAME);
        mem.write_u64(CODE + o.code_filename, FILE);
        mem.write(CODE + o.code_firstlineno, &10i32.to_le_bytes());
        mem.write_u64(CODE + o.code_linetable, TABLE);
        // One location entry without columns: 4 code units, line +1.
        mem.write_u64(TABLE + 16, 2);
        mem.write(TABLE + 32, &[0x80 | (13 << 3) | 3, 2]);
        mem.write_u64(FUNC + o.func_code.unwrap(), CODE);
        (mem, o)
    }

    fn frame(instr: u32) -> PyFrame {
        PyFrame {
            code: CODE,
            check: FUNC,
            instr,
            flags: 0,
        }
    }

    /// Resolves and returns (function id, line, what the interner was given).
    fn resolve(names: &mut CodeNames<FixtureMemory>, f: &PyFrame) -> (u32, Option<u32>, String) {
        let mut seen = String::new();
        let (id, line) = names.resolve(f, |read| {
            seen = match read {
                CodeRead::Code(info) => format!("{} {}", info.name, info.filename),
                CodeRead::Unreadable(_) => "unreadable".into(),
                CodeRead::Replaced => "replaced".into(),
            };
            7
        });
        (id, line, seen)
    }

    #[test]
    fn names_a_code_object_once_and_its_lines_from_the_table() {
        let (mem, o) = fixture();
        let mut names = CodeNames::new(mem, o, TypeAddrs::default());
        assert_eq!(
            resolve(&mut names, &frame(2)),
            (7, Some(11), "Worker.run /srv/app.py".into())
        );
        // Cached: the interner is not called again, other offsets get their own line.
        assert_eq!(resolve(&mut names, &frame(4)), (7, Some(11), String::new()));
        assert_eq!(names.stats().reads, 1);
    }

    #[test]
    fn a_code_object_freed_and_reused_is_not_misnamed() {
        let (mut mem, o) = fixture();
        // The function sampled no longer runs this code: the address was reused.
        mem.write_u64(FUNC + o.func_code.unwrap(), CODE + 0x100);
        // Another function runs the code now at that address.
        mem.write_u64(FUNC + 0x80 + o.func_code.unwrap(), CODE);
        let mut names = CodeNames::new(mem, o, TypeAddrs::default());
        assert_eq!(resolve(&mut names, &frame(2)).2, "replaced");
        assert_eq!(names.stats().replaced, 1);
        // Its frames, at the same code address, are read afresh and named.
        let other = PyFrame {
            check: FUNC + 0x80,
            ..frame(2)
        };
        assert_eq!(resolve(&mut names, &other).2, "Worker.run /srv/app.py");
        assert_eq!(names.stats().reads, 2);
    }

    #[test]
    fn closures_sharing_one_code_object_keep_its_name_without_a_new_read() {
        let (mem, o) = fixture();
        let mut names = CodeNames::new(mem, o, TypeAddrs::default());
        assert_eq!(resolve(&mut names, &frame(2)).0, 7);
        // Another function object (gone by now: its memory holds nothing) runs the same code.
        let closure = PyFrame {
            check: FUNC + 0x40,
            ..frame(2)
        };
        assert_eq!(resolve(&mut names, &closure), (7, Some(11), String::new()));
        assert_eq!((names.stats().reads, names.stats().fingerprints), (1, 1));
        // A new code object at that address (another first line), run by a live function:
        // read afresh, with its own line.
        names
            .mem
            .write(CODE + o.code_firstlineno, &20i32.to_le_bytes());
        names
            .mem
            .write_u64(FUNC + 0x80 + o.func_code.unwrap(), CODE);
        let other = PyFrame {
            check: FUNC + 0x80,
            ..frame(2)
        };
        assert_eq!(
            resolve(&mut names, &other),
            (7, Some(21), "Worker.run /srv/app.py".into())
        );
        assert_eq!(names.stats().reads, 2);
    }

    #[test]
    fn corrupted_objects_are_unknown_not_a_crash() {
        let (fixture_mem, o) = fixture();
        // Every byte of the fixture region in turn set to junk values; wild code addresses too.
        for at in (0..0x800u64).step_by(4) {
            for junk in [0xffu8, 0x80, 0x00] {
                let mut mem = fixture_mem.clone();
                mem.write(BASE + at, &[junk; 4]);
                let mut names = CodeNames::new(mem, o, TypeAddrs::default());
                let _ = resolve(&mut names, &frame(at as u32));
            }
        }
        for code in [0, 8, u64::MAX, u64::MAX - 7, BASE + 0xff9] {
            let (mem, o) = fixture();
            let mut names = CodeNames::new(mem, o, TypeAddrs::default());
            let (_, line, seen) = resolve(&mut names, &PyFrame { code, ..frame(0) });
            assert_eq!(
                (line, seen.as_str()),
                (None, "unreadable"),
                "code {code:#x}"
            );
        }
    }
}
