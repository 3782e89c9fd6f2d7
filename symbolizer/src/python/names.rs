//! Naming the Python frames the BPF walker records: (code object, check, instruction offset)
//! → (function, line), per process, cached.
//!
//! The walker reads only addresses while the thread is stopped; names are read here, from user
//! space, shortly after (at the next drain of the ring buffer). By then a code object may have
//! been freed and its address reused, so each frame carries a check value taken in the kernel
//! from the code object itself ([`PyFrame::check_value`]: on 3.12+ its first line and
//! `co_version`, a counter CPython bumps for every code object it creates; before 3.12 its first
//! line, the addresses of its file name and line table, and its name's hash and first 16
//! bytes). The strings are read between two reads of these fields, which must agree. A name is
//! trusted only when the object read now gives the same value; a frame whose object no longer
//! does is `[unknown]` to the caller, and is read again the next time (nothing negative is
//! cached). A cache entry is keyed by the code address and replaced when a frame arrives with
//! another check value.
//!
//! Limits: on 3.12+, CPython stops counting after 2^32 code objects (all later ones read 0).
//! Before 3.12: a code object freed and replaced, before the drain, by one at the
//! same address whose name has the same first 16 bytes and hash (not computed for a nested
//! function's qualname on 3.11), with the same first line and its file name and line table at
//! the same addresses, passes the check. (3.8–3.10 have no qualname: nested functions of code
//! `exec`'d again and again all share a name such as `inner`.)
//!
//! The hot path (a code object and an instruction offset seen before) is two hash lookups and
//! allocates nothing.

use profiler_common::{PyFrame, PY_NAME_READ};
use rustc_hash::FxHashMap;

use super::memory::ProcessMemory;
use super::offsets::PyOffsets;
use super::walk::{code_info, each_thread_state, walk_thread_state, CodeInfo, TypeAddrs, STR_HASH};

/// At most this many code objects are cached per process; beyond, the cache starts over (a
/// process that generates code endlessly must not grow spanprof without bound).
pub const MAX_CODES: usize = 1 << 16;

/// Threads whose stacks [`CodeNames::read_ahead`] reads, at most, per call.
pub const READ_AHEAD_THREADS: usize = 256;

#[derive(Debug)]
struct Slot {
    check: u64,
    /// The caller's id for the function (from its interner).
    func: u32,
    info: CodeInfo,
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

    /// The check value of the code object at `code` now, as the kernel computes it; `None`
    /// if the object looks freed. A freed object keeps its old fields, so its reference count
    /// tells: pymalloc writes its free-list pointer there, and glibc's allocator a pointer too
    /// (and its key over `ob_type`); a live object's count is below 2^32 (immortal ones included).
    /// From 3.14 the word is `uint32_t ob_refcnt; uint16_t ob_overflow; uint16_t ob_flags`:
    /// the flags (top 16 bits) are set on live objects, so they are left out.
    pub(crate) fn check_now(&self, code: u64) -> Option<u64> {
        let mut refcnt = self.mem.read_u64(code).ok()?;
        if self.offsets.version >= (3, 14) {
            refcnt &= (1 << 48) - 1;
        }
        if refcnt == 0 || refcnt >= 1 << 32 {
            return None;
        }
        let o = self.offsets;
        let first = self
            .mem
            .read_i32(code.wrapping_add(o.code_firstlineno))
            .ok()?;
        if let Some(at) = o.code_version {
            // 3.12+: co_version is new for every code object created.
            let version = self.mem.read_u32(code.wrapping_add(at)).ok()?;
            return Some(PyFrame::check_value(0, 0, first, 0, version));
        }
        // Before 3.12: the hash and the first 16 bytes of data of the name string, the
        // addresses of the file name and line table.
        let name_field = o.code_qualname.unwrap_or(o.code_name);
        let name = self.mem.read_ptr(code.wrapping_add(name_field)).ok()?;
        let mut b = [0u8; PY_NAME_READ as usize];
        self.mem.read(name.wrapping_add(STR_HASH), &mut b).ok()?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let data = usize::try_from(o.unicode_ascii_size - STR_HASH).ok()?;
        let name = PyFrame::name_part(word(0), word(data), word(data + 8));
        let filename = self.mem.read_ptr(code.wrapping_add(o.code_filename)).ok()?;
        let table = self
            .mem
            .read_ptr(code.wrapping_add(o.code_linetable))
            .ok()?;
        Some(PyFrame::check_value(name, filename, first, table, 0))
    }

    /// Names the code objects on the stacks of the process's threads now, ahead of their
    /// samples: a thread blocked until the process exits sends its off-CPU sample only then,
    /// and the interpreter frees the code objects within ms of it, before user space can read
    /// them. Each is cached with the check value it has now. From 3.12 on that is the value the
    /// kernel records for it as long as it lives; before 3.12 the value includes its name's
    /// hash, which CPython may compute later: the sample then does not match and is named as
    /// without reading ahead (or not at all, if the process is gone), never wrongly.
    ///
    /// Walks the first [`READ_AHEAD_THREADS`] threads of the main interpreter's list (CPython
    /// puts new threads at its head), oldest of them first, so that the main thread (the last,
    /// in a process of at most that many threads) is read even when `frames` (decremented per
    /// frame walked, a whole thread at a time) runs out; a thread list that cannot be read to
    /// its end gives the threads read so far. A thread walked while it runs may give garbage:
    /// each code object read is checked as a sample's is, and a thread whose walk fails is
    /// skipped. Returns how many code objects were read (not known before).
    pub fn read_ahead(
        &mut self,
        runtime_addr: u64,
        frames: &mut usize,
        mut intern: impl FnMut(&CodeInfo) -> u32,
    ) -> usize {
        let mut states = Vec::new();
        let _ = each_thread_state(&self.mem, self.offsets, runtime_addr, |tstate| {
            states.push(tstate);
            Ok(states.len() >= READ_AHEAD_THREADS)
        });
        let mut read = 0;
        for tstate in states.into_iter().rev() {
            if *frames == 0 {
                break;
            }
            let Ok(stack) = walk_thread_state(&self.mem, self.offsets, tstate) else {
                continue;
            };
            *frames = frames.saturating_sub(stack.frames.len().max(1));
            for f in &stack.frames {
                // NB: an address already cached is not checked again (three reads a frame, most
                // of the cost): a code object freed and replaced at the same address is then
                // named only from its sample, as without reading ahead.
                if self.codes.contains_key(&f.code) {
                    continue;
                }
                let Some(check) = self.check_now(f.code) else {
                    continue;
                };
                let frame = PyFrame {
                    code: f.code,
                    check,
                    instr: f.instr_offset,
                    flags: 0,
                };
                if self.resolve(&frame, &mut intern).is_some() {
                    read += 1;
                }
            }
        }
        read
    }

    /// The function id and line of a recorded frame, or `None` when the code object cannot
    /// be read or is not the one sampled any more. `intern` is called once per code object
    /// named and returns the caller's id for it.
    pub fn resolve(
        &mut self,
        frame: &PyFrame,
        intern: impl FnOnce(&CodeInfo) -> u32,
    ) -> Option<(u32, Option<u32>)> {
        let known = matches!(self.codes.get(&frame.code), Some(s) if s.check == frame.check);
        if !known {
            self.stats.reads += 1;
            let info = match code_info(&self.mem, self.offsets, self.types, frame.code) {
                Ok(info) => info,
                Err(_) => {
                    self.stats.failed += 1;
                    return None;
                }
            };
            // Compared once the strings were read: the code object holds them, so if it is still
            // the one sampled afterwards, they were its own while they were read.
            if self.check_now(frame.code) != Some(frame.check) {
                self.stats.replaced += 1;
                return None;
            }
            if self.codes.len() >= MAX_CODES {
                self.codes.clear();
            }
            let func = intern(&info);
            self.codes.insert(
                frame.code,
                Slot {
                    check: frame.check,
                    func,
                    info,
                    lines: FxHashMap::default(),
                },
            );
        }
        let slot = self.codes.get_mut(&frame.code)?;
        let info = &slot.info;
        let line = *slot
            .lines
            .entry(frame.instr)
            .or_insert_with(|| info.line(frame.instr));
        Some((slot.func, line))
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
    const OTHER_NAME: u64 = BASE + 0x700;

    fn ascii(mem: &mut FixtureMemory, o: &PyOffsets, at: u64, s: &str) {
        mem.write_u64(at + o.unicode_length, s.len() as u64);
        // kind 1 (bits 2-4), compact (bit 5), ascii (bit 6).
        let state: u32 = (1 << 2) | (1 << 5) | (1 << 6);
        mem.write(at + o.unicode_state, &state.to_le_bytes());
        mem.write(at + o.unicode_ascii_size, s.as_bytes());
    }

    /// A 3.12 code object `Worker.run` in `app.py` at line 10.
    fn fixture() -> (FixtureMemory, &'static PyOffsets) {
        let o = for_version(3, 12).expect("3.12 table");
        let mut mem = FixtureMemory::new();
        mem.insert(BASE, vec![0; 0x1000]);
        mem.write_u64(CODE, 3); // ob_refcnt
        mem.write(CODE + o.code_version.unwrap(), &5u32.to_le_bytes());
        ascii(&mut mem, o, NAME, "Worker.run");
        ascii(&mut mem, o, OTHER_NAME, "Other.run");
        ascii(&mut mem, o, FILE, "/srv/app.py");
        mem.write_u64(CODE + o.code_qualname.unwrap(), NAME);
        mem.write_u64(CODE + o.code_filename, FILE);
        mem.write(CODE + o.code_firstlineno, &10i32.to_le_bytes());
        mem.write_u64(CODE + o.code_linetable, TABLE);
        // One location entry without columns: 4 code units, line +1.
        mem.write_u64(TABLE + 16, 2);
        mem.write(TABLE + 32, &[0x80 | (13 << 3) | 3, 2]);
        (mem, o)
    }

    /// A frame of the fixture's code as the kernel saw it.
    fn frame(instr: u32) -> PyFrame {
        PyFrame {
            code: CODE,
            check: PyFrame::check_value(0, 0, 10, 0, 5),
            instr,
            flags: 0,
        }
    }

    /// Resolves and returns (function id, line, what the interner was given); id 0 and no
    /// line when the frame cannot be named.
    fn resolve(names: &mut CodeNames<FixtureMemory>, f: &PyFrame) -> (u32, Option<u32>, String) {
        let mut seen = String::new();
        let named = names.resolve(f, |info| {
            seen = format!("{} {}", info.name, info.filename);
            7
        });
        let (id, line) = named.unwrap_or((0, None));
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
        let (mem, o) = fixture();
        let mut names = CodeNames::new(mem, o, TypeAddrs::default());
        assert_eq!(resolve(&mut names, &frame(2)).0, 7);
        // Another code object now at the same address: another name, or another first line.
        names
            .mem
            .write_u64(CODE + o.code_qualname.unwrap(), OTHER_NAME);
        // (3.12+ tells objects apart by co_version, which CPython bumps for every new one.)
        names
            .mem
            .write(CODE + o.code_version.unwrap(), &6u32.to_le_bytes());
        let sampled_before = frame(2);
        let sampled_after = PyFrame {
            check: PyFrame::check_value(0, 0, 10, 0, 6),
            ..frame(2)
        };
        // A frame sampled before the change still hits the entry named then...
        assert_eq!(resolve(&mut names, &sampled_before).0, 7);
        // ...and one sampled after is read afresh and named after what it runs.
        assert_eq!(
            resolve(&mut names, &sampled_after),
            (7, Some(11), "Other.run /srv/app.py".into())
        );
        // A frame sampled when the first object was there, read once the second one is: the
        // check values differ, so it is not named at all (and nothing negative is cached).
        let mut fresh = CodeNames::new(names.mem.clone(), o, TypeAddrs::default());
        assert_eq!(
            resolve(&mut fresh, &sampled_before),
            (0, None, String::new())
        );
        assert_eq!(fresh.stats().replaced, 1);
        assert_eq!(resolve(&mut fresh, &sampled_before).0, 0);
        assert_eq!(fresh.stats().reads, 2);
        // A freed object keeps its fields, but not its reference count.
        let mut freed = CodeNames::new(names.mem.clone(), o, TypeAddrs::default());
        freed.mem.write_u64(CODE, 0x5555_0000_1230);
        assert_eq!(resolve(&mut freed, &sampled_after).0, 0);
        // Another first line changes the check too.
        fresh
            .mem
            .write(CODE + o.code_firstlineno, &20i32.to_le_bytes());
        assert_eq!(resolve(&mut fresh, &sampled_after).0, 0);
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
            assert_eq!((line, seen.as_str()), (None, ""), "code {code:#x}");
            assert_eq!(names.stats().failed, 1, "code {code:#x}");
        }
    }
}
