//! User-stack unwinding from a copy of the stack (`--unwind dwarf`), with the unwind tables
//! (`.eh_frame`, `.eh_frame_hdr`, `.debug_frame`) of the modules a process maps.
//!
//! The kernel copies the sampled thread's user registers (ip, sp, bp) and up to
//! `--stack-copy` bytes of its stack from sp upwards into the sample record. [`Unwinders::unwind`]
//! turns that into return addresses with [`framehop`], during the drain, while the process is
//! alive: its modules are found in `/proc/PID/maps` (again when an address falls outside the
//! modules known, at most once per drain of the ring buffer ([`Unwinders::next_drain`]), which
//! catches libraries loaded with dlopen and those a process still in the dynamic loader had not
//! mapped yet),
//! and each module file's unwind sections are read once per session by device and inode (the
//! vDSO's from the process's memory). Code with no unwind information is unwound with the
//! frame pointer, framehop's fallback rule.
//!
//! Every unwind ends with an [`UnwindStatus`]: the root was reached (`Complete`), a limit cut it
//! (`Truncated`: the stack copy or the frame limit), or it failed, with the reason.
//!
//! The target's stack is untrusted: reads are bounded by the copy, every step must move the
//! stack pointer up (framehop checks it), and the frames are capped by the caller's buffer.

use std::ops::Not;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FrameError, FrameAddress, Unwinder};
use rustc_hash::FxHashMap;

use crate::python::memory::{LiveMemory, ProcessMemory};

mod sections;
#[cfg(test)]
mod tests;

use sections::Sections;

/// A return address at most this far past an entry point is in `_start`'s first call.
const ENTRY_CALL: u64 = 32;
/// After a failed unwind, a process's maps are read again at most once in this many drains
/// (1–2 s at the collector's tick of 50–100 ms).
const FAILED_REFRESH_DRAINS: u64 = 20;
/// A read this far above the stack copy is no stack frame (8 MiB: glibc's default stack).
const MAX_STACK_SIZE: u64 = 8 << 20;
/// The vDSO is at most this big (two or three pages on x86_64).
const MAX_VDSO: u64 = 64 << 10;

/// How the unwinding of one sample's user stack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnwindStatus {
    /// The root of the stack was reached (the unwind tables say the return address is
    /// undefined, as at `_start` and `clone3`, or the frame chain ends).
    Complete,
    /// A limit cut the stack short.
    Truncated(TruncatedBy),
    /// Unwinding stopped on an error.
    Failed(FailedBy),
    /// Not checked: the kernel's frame-pointer walk (`--unwind fp`) cannot tell.
    Unchecked,
}

/// Why a stack was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TruncatedBy {
    /// A caller's frame is above the bytes copied (`--stack-copy` is too small for it).
    StackCopy,
    /// More frames than a sample keeps.
    Depth,
}

/// Why unwinding failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailedBy {
    /// The kernel could not read the page at the stack pointer.
    StackUnreadable,
    /// A frame's address was past the top of the stack (the copy reached it), or below the
    /// stack pointer: a wrong unwind rule or a frame pointer used as something else.
    OutsideStack,
    /// A frame pointer led down the stack instead of up.
    FramePointerBackwards,
    /// A step changed neither the address nor the stack pointer.
    NoProgress,
    /// An address computation overflowed, or a return address was null.
    Overflow,
    /// The last frame is in code without unwind tables (or in no module), whose frame pointer
    /// ended the walk: nothing says it is the root.
    NoUnwindInfo,
    /// The process exited before its stack was unwound (its modules could not be read).
    ProcessGone,
    /// A return address is in no executable mapping of the process: the walk (by frame
    /// pointers, through code that keeps none) went on with what was not a frame; the stack is
    /// cut there.
    LeftMappedCode,
}

impl UnwindStatus {
    /// `complete`, `truncated`, `failed` or `unchecked`.
    pub fn kind(self) -> &'static str {
        match self {
            UnwindStatus::Complete => "complete",
            UnwindStatus::Truncated(_) => "truncated",
            UnwindStatus::Failed(_) => "failed",
            UnwindStatus::Unchecked => "unchecked",
        }
    }

    /// Why it is not complete, in a few words; `None` for complete and unchecked stacks.
    pub fn reason(self) -> Option<&'static str> {
        Some(match self {
            UnwindStatus::Complete | UnwindStatus::Unchecked => return None,
            UnwindStatus::Truncated(TruncatedBy::StackCopy) => "stack copy too small",
            UnwindStatus::Truncated(TruncatedBy::Depth) => "more frames than kept",
            UnwindStatus::Failed(FailedBy::StackUnreadable) => "user stack not readable",
            UnwindStatus::Failed(FailedBy::OutsideStack) => "frame outside the stack",
            UnwindStatus::Failed(FailedBy::FramePointerBackwards) => "frame pointer went backwards",
            UnwindStatus::Failed(FailedBy::NoProgress) => "unwinding made no progress",
            UnwindStatus::Failed(FailedBy::Overflow) => "address overflow",
            UnwindStatus::Failed(FailedBy::NoUnwindInfo) => "no unwind tables for the last frame",
            UnwindStatus::Failed(FailedBy::ProcessGone) => "process exited before unwinding",
            UnwindStatus::Failed(FailedBy::LeftMappedCode) => "return address in no mapped code",
        })
    }

    /// The status a [`UnwindStatus::reason`] or [`UnwindStatus::kind`] string names (for
    /// profiles read back from a file).
    pub fn from_label(kind: &str, reason: Option<&str>) -> Option<UnwindStatus> {
        const ALL: [UnwindStatus; 12] = [
            UnwindStatus::Complete,
            UnwindStatus::Unchecked,
            UnwindStatus::Truncated(TruncatedBy::StackCopy),
            UnwindStatus::Truncated(TruncatedBy::Depth),
            UnwindStatus::Failed(FailedBy::StackUnreadable),
            UnwindStatus::Failed(FailedBy::OutsideStack),
            UnwindStatus::Failed(FailedBy::FramePointerBackwards),
            UnwindStatus::Failed(FailedBy::NoProgress),
            UnwindStatus::Failed(FailedBy::Overflow),
            UnwindStatus::Failed(FailedBy::NoUnwindInfo),
            UnwindStatus::Failed(FailedBy::ProcessGone),
            UnwindStatus::Failed(FailedBy::LeftMappedCode),
        ];
        ALL.into_iter()
            .find(|s| s.kind() == kind && s.reason() == reason)
    }
}

/// The registers and stack bytes of one sample, as the kernel copied them.
#[derive(Debug, Clone, Copy)]
pub struct StackCopy<'a> {
    /// User-mode instruction pointer.
    pub ip: u64,
    /// User-mode stack pointer: the address of `bytes[0]`.
    pub sp: u64,
    /// User-mode frame pointer register.
    pub bp: u64,
    /// The stack from `sp` upwards.
    pub bytes: &'a [u8],
    /// The copy ended at the top of the stack (an unreadable page, or a main thread's initial
    /// stack pointer), not at the size asked.
    pub reached_top: bool,
}

/// An executable mapping of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExecMapping {
    start: u64,
    end: u64,
    offset: u64,
    /// `makedev(major, minor)` of the line.
    dev: u64,
    inode: u64,
    path: String,
}

fn exec_mappings(text: &str) -> Vec<ExecMapping> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let (start, end) = it.next()?.split_once('-')?;
            let perms = it.next()?;
            if perms.as_bytes().get(2) != Some(&b'x') {
                return None;
            }
            let offset = u64::from_str_radix(it.next()?, 16).ok()?;
            let (major, minor) = it.next()?.split_once(':')?;
            let dev = libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            );
            let inode = it.next()?.parse().ok()?;
            // NB: a path may hold spaces; it is the rest of the line.
            let path = line
                .splitn(6, |c: char| c.is_ascii_whitespace())
                .nth(5)
                .map(|p| p.trim_start().to_string())
                .unwrap_or_default();
            Some(ExecMapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset,
                dev,
                inode,
                path,
            })
        })
        .collect()
}

/// One executable mapping of a process, as added to its unwinder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    end: u64,
    inode: u64,
    /// Its module has unwind tables (frames in it end with the tables' say-so).
    tables: bool,
    /// Run-time address of its module's ELF entry point, 0 for none.
    entry: u64,
}

/// One process's modules.
struct Process {
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    /// Executable mappings by start address, as last read from the maps.
    known: Vec<(u64, Known)>,
    /// The drain ([`Unwinders::next_drain`]) in which the maps were last read.
    refreshed: u64,
    /// Its maps could not be read, and none were before: it exited (or is not ours to read).
    gone: bool,
    /// [`Unwinders::sweep`] found it gone; the next sweep forgets it.
    exited: bool,
    /// The unwind sections of its modules, by mapping start: what it holds of
    /// [`Unwinders::files`].
    held: FxHashMap<u64, Arc<Sections>>,
}

impl Process {
    fn mapping(&self, addr: u64) -> Option<&Known> {
        let i = self.known.partition_point(|&(s, _)| s <= addr);
        let (_, k) = self.known.get(i.checked_sub(1)?)?;
        (addr < k.end).then_some(k)
    }

    /// `addr` is a return address into the first bytes of an ELF entry point (`_start`).
    fn at_entry(&self, addr: u64) -> bool {
        self.mapping(addr)
            .is_some_and(|k| k.entry != 0 && addr > k.entry && addr - k.entry <= ENTRY_CALL)
    }
}

/// Counts of what the unwinders did, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Module files whose unwind sections were read.
    pub modules_read: u64,
    /// Module files that could not be read (or were no ELF file).
    pub modules_unreadable: u64,
    /// Module files whose unwind tables were dropped: an expression in them could loop.
    pub modules_rejected: u64,
    /// Reads of `/proc/PID/maps`.
    pub maps_reads: u64,
}

/// The unwinders of every process of a session.
pub struct Unwinders {
    procs: FxHashMap<u32, Process>,
    /// Unwind sections by (device, inode) of the module file; `None`: unreadable.
    files: FxHashMap<(u64, u64), Option<Arc<Sections>>>,
    cache: Box<CacheX86_64>,
    stats: UnwindStats,
    drain: u64,
}

impl std::fmt::Debug for Unwinders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwinders")
            .field("processes", &self.procs.len())
            .field("files", &self.files.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Default for Unwinders {
    fn default() -> Self {
        Self::new()
    }
}

impl Unwinders {
    /// No process known yet.
    pub fn new() -> Self {
        Unwinders {
            procs: FxHashMap::default(),
            files: FxHashMap::default(),
            cache: Box::new(CacheX86_64::new()),
            stats: UnwindStats::default(),
            drain: 1,
        }
    }

    /// A new drain of the ring buffer begins: each process's maps may be read once more.
    pub fn next_drain(&mut self) {
        self.drain += 1;
    }

    /// What was read so far.
    pub fn stats(&self) -> UnwindStats {
        self.stats
    }

    /// Forgets a process (it exec'd or exited): its address space is not the one known. The
    /// unwind sections no other process uses go with it.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            if !p.held.is_empty() {
                drop(p);
                self.drop_unused_files();
            }
        }
    }

    /// Drops the unwind sections of the module files no process known maps.
    fn drop_unused_files(&mut self) {
        // NB: `files` holds one reference; each process mapping the file one more.
        self.files
            .retain(|_, s| s.as_ref().is_some_and(|s| Arc::strong_count(s) > 1));
    }

    /// Forgets the processes that exited (no `/proc/PID`), so a reused pid starts afresh and
    /// memory does not grow with short-lived processes, and drops the unwind sections of the
    /// module files no process known maps any more.
    ///
    /// A process found gone is forgotten at the next sweep, not at once: samples it took
    /// before it exited may still be in the ring buffer, and are unwound with the modules read
    /// while it lived.
    pub fn sweep(&mut self) {
        self.procs.retain(|pid, p| {
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                p.exited = false;
                true
            } else {
                std::mem::replace(&mut p.exited, true).not()
            }
        });
        self.drop_unused_files();
    }

    /// Bytes of unwind sections held (of module files that processes known map).
    pub fn table_bytes(&self) -> u64 {
        self.files.values().flatten().map(|s| s.bytes()).sum()
    }

    /// Module files whose unwind sections are held.
    pub fn table_files(&self) -> usize {
        self.files.values().flatten().count()
    }

    /// Unwinds one sample of process `pid` into `out` (the leaf first: the instruction pointer,
    /// then return addresses). Returns the frames written and how the unwinding ended.
    pub fn unwind(
        &mut self,
        pid: u32,
        copy: &StackCopy<'_>,
        out: &mut [u64],
    ) -> (usize, UnwindStatus) {
        if !self.procs.contains_key(&pid) {
            self.refresh(pid);
        }
        let (n, status, unknown) = self.unwind_once(pid, copy, out);
        // An address outside every module known (a library loaded since: dlopen, or the dynamic
        // loader at start-up; or code that is no module's: JIT), or a failure (a library
        // replaced by another at the same place): read the maps again, once per drain at most:
        // they then hold what was mapped before every sample drained.
        // (After a failure, at most once in FAILED_REFRESH_DRAINS drains, 1–2 s: code that fails every time, JIT or without
        // tables, would make every drain read the maps.)
        if unknown || matches!(status, UnwindStatus::Failed(_)) {
            let due = self.procs.get(&pid).is_none_or(|p| {
                p.refreshed != self.drain
                    && (unknown || self.drain.saturating_sub(p.refreshed) >= FAILED_REFRESH_DRAINS)
            });
            if due && self.refresh(pid) {
                let (n, status, _) = self.unwind_once(pid, copy, out);
                return (n, status);
            }
        }
        (n, status)
    }

    fn unwind_once(
        &mut self,
        pid: u32,
        copy: &StackCopy<'_>,
        out: &mut [u64],
    ) -> (usize, UnwindStatus, bool) {
        let Some(proc_) = self.procs.get(&pid) else {
            return (0, UnwindStatus::Failed(FailedBy::ProcessGone), false);
        };
        if proc_.gone {
            return (0, UnwindStatus::Failed(FailedBy::ProcessGone), false);
        }
        let sp = copy.sp;
        let top = sp.saturating_add(copy.bytes.len() as u64);
        let mut read = |addr: u64| -> Result<u64, ()> {
            if addr < sp || addr.checked_add(8).is_none_or(|end| end > top) {
                return Err(());
            }
            let off = (addr - sp) as usize;
            let b = copy.bytes.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
        let mut frames = proc_
            .unwinder
            .iter_frames(copy.ip, regs, &mut self.cache, &mut read);
        let mut n = 0;
        let mut unknown = false;
        // The end of the stack, by the unwind tables (an undefined return address), or by a
        // frame pointer or return address of 0: trusted only in a module with unwind tables,
        // since code without them may keep anything in rbp.
        let ended = |n: usize, out: &[u64]| {
            let last = out[..n].last().copied();
            if last.is_some_and(|a| proc_.mapping(a).is_some_and(|k| k.tables) || proc_.at_entry(a))
            {
                UnwindStatus::Complete
            } else {
                UnwindStatus::Failed(FailedBy::NoUnwindInfo)
            }
        };
        let status = loop {
            let err = match frames.next() {
                Ok(Some(frame)) => {
                    let addr = match frame {
                        FrameAddress::InstructionPointer(a) => a,
                        FrameAddress::ReturnAddress(a) => a.get(),
                    };
                    if n == out.len() {
                        break UnwindStatus::Truncated(TruncatedBy::Depth);
                    }
                    if proc_.mapping(addr).is_none() {
                        unknown = true;
                    }
                    out[n] = addr;
                    n += 1;
                    continue;
                }
                Ok(None) | Err(FrameError::ReturnAddressIsNull) => break ended(n, out),
                Err(e) => e,
            };
            // A frame in the first bytes of an ELF entry point (`_start`, which calls the first C
            // function at once) is the root, whatever came after it (the dynamic loader's
            // `_start` has no end-of-stack rule).
            if n > 0 && proc_.at_entry(out[n - 1]) {
                break UnwindStatus::Complete;
            }
            break match err {
                // Above the copy, but not past the stack's top, nor wildly far (a garbage frame
                // pointer): a bigger copy would have held it.
                FrameError::CouldNotReadStack(addr)
                    if addr >= top && !copy.reached_top && addr - top < MAX_STACK_SIZE =>
                {
                    UnwindStatus::Truncated(TruncatedBy::StackCopy)
                }
                FrameError::CouldNotReadStack(_) => UnwindStatus::Failed(FailedBy::OutsideStack),
                FrameError::FramepointerUnwindingMovedBackwards => {
                    UnwindStatus::Failed(FailedBy::FramePointerBackwards)
                }
                FrameError::DidNotAdvance => UnwindStatus::Failed(FailedBy::NoProgress),
                FrameError::IntegerOverflow | FrameError::ReturnAddressIsNull => {
                    UnwindStatus::Failed(FailedBy::Overflow)
                }
            };
        };
        (n, status, unknown)
    }

    /// Reads `/proc/PID/maps` and brings the unwinder up to date: mappings gone or replaced are
    /// dropped, new ones added. Returns whether anything changed.
    fn refresh(&mut self, pid: u32) -> bool {
        let proc_ = self.procs.entry(pid).or_insert_with(|| Process {
            unwinder: UnwinderX86_64::new(),
            known: Vec::new(),
            refreshed: 0,
            gone: false,
            exited: false,
            held: FxHashMap::default(),
        });
        proc_.refreshed = self.drain;
        self.stats.maps_reads += 1;
        // NB: a process that exited (a zombie's map is empty) keeps the modules read while it
        // lived, for its samples still on their way.
        let text = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            Ok(text) if !text.is_empty() => text,
            _ => {
                proc_.gone = proc_.known.is_empty();
                return false;
            }
        };
        let maps = exec_mappings(&text);
        let mut changed = false;
        let mut known: Vec<(u64, Known)> = Vec::with_capacity(maps.len());
        let old: FxHashMap<u64, Known> = proc_.known.drain(..).collect();
        for m in &maps {
            if let Some(k) = old
                .get(&m.start)
                .filter(|k| k.end == m.end && k.inode == m.inode)
            {
                known.push((m.start, *k));
                continue;
            }
            if old.contains_key(&m.start) {
                // Replaced (munmap, then another mapping at the same place).
                proc_.unwinder.remove_module(m.start);
                proc_.held.remove(&m.start);
            }
            let module = if m.path == "[vdso]" {
                vdso_sections(pid, m).map(|s| (s, m.start))
            } else if m.path.starts_with('/') {
                let sections = file_sections(pid, m, &mut self.files, &mut self.stats);
                sections.and_then(|s| s.bias(m.start, m.offset).map(|b| (s, b)))
            } else {
                None
            };
            // Mapped code without unwind tables (anonymous, JIT) is still "known", so it does
            // not make every sample read the maps again; framehop unwinds it by frame pointer.
            let mut k = Known {
                end: m.end,
                inode: m.inode,
                tables: false,
                entry: 0,
            };
            if let Some((sections, bias)) = module {
                k.tables = sections.has_tables();
                if sections.entry != 0 {
                    k.entry = sections.entry.wrapping_add(bias);
                }
                proc_
                    .unwinder
                    .add_module(sections.module(m.path.clone(), m.start..m.end, bias));
                proc_.held.insert(m.start, sections);
            }
            known.push((m.start, k));
            changed = true;
        }
        for start in old.keys() {
            if !known.iter().any(|(s, _)| s == start) {
                proc_.unwinder.remove_module(*start);
                proc_.held.remove(start);
                changed = true;
            }
        }
        known.sort_unstable_by_key(|&(s, _)| s);
        proc_.known = known;
        proc_.gone = false;
        changed
    }
}

/// A module file's unwind sections, read once per (device, inode).
fn file_sections(
    pid: u32,
    m: &ExecMapping,
    files: &mut FxHashMap<(u64, u64), Option<Arc<Sections>>>,
    stats: &mut UnwindStats,
) -> Option<Arc<Sections>> {
    let mapping = crate::mapped::Mapping {
        start: m.start,
        end: m.end,
        perms: *b"r-xp",
        offset: m.offset,
        dev: m.dev,
        inode: m.inode,
        path: m.path.clone(),
    };
    let Ok((file, _)) = crate::mapped::open_mapped(pid, &mapping) else {
        stats.modules_unreadable += 1;
        return None;
    };
    let meta = file.metadata().ok()?;
    files
        .entry((meta.dev(), meta.ino()))
        .or_insert_with(|| {
            let cache = object::ReadCache::new(file);
            let parsed = object::File::parse(&cache)
                .ok()
                .map(|obj| Arc::new(Sections::from_object(&obj)));
            match &parsed {
                Some(s) if s.rejected => stats.modules_rejected += 1,
                Some(_) => stats.modules_read += 1,
                None => stats.modules_unreadable += 1,
            }
            parsed
        })
        .clone()
}

/// The vDSO's unwind sections, from the process's memory (it is no file).
fn vdso_sections(pid: u32, m: &ExecMapping) -> Option<Arc<Sections>> {
    let len = (m.end - m.start).min(MAX_VDSO) as usize;
    let mut image = vec![0u8; len];
    LiveMemory::new(pid).read(m.start, &mut image).ok()?;
    let obj = object::File::parse(&*image).ok()?;
    // The vDSO is linked at 0: its bias is where it is mapped, which the caller passes.
    Some(Arc::new(Sections::from_object(&obj)))
}
