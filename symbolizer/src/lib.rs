//! Native (ELF/DWARF) and kernel symbolization for spanprof, on top of blazesym.
//!
//! # Overview
//! Symbolization happens in two steps, because a profiled process may exit before the session
//! ends:
//! 1. [`Symbolizer::normalize`] turns a live process's virtual addresses into (module, file offset)
//!    pairs from `/proc/PID/maps`, read while the process is still there (again when an address
//!    falls outside the map kept, after an exec, or once the map is a second old). User space
//!    calls it for new addresses every time it drains the ring buffer, so only the last few
//!    milliseconds of a process that exits are at risk, and those come out as unknown frames
//!    with the reason.
//! 2. [`Symbolizer::symbolize`] resolves everything at the end, per module file, in batches:
//!    names (demangled), source files and lines from DWARF when present, and the kernel from
//!    `/proc/kallsyms` (its own text from the symbols kept for the boot: `kernel_text`).
//!
//! Before both, [`unwind::Unwinders`] turns a sample's copy of the user stack into return
//! addresses with the unwind tables of the process's modules (`--unwind dwarf`).
//!
//! An address that cannot be resolved is not an error: it is a [`Symbol`] with no function and
//! an `unknown_reason`, so outputs can still name the module and offset.
//!
//! # Design constraints
//! Addresses passed in must already be "lookup" addresses: the caller subtracts one from return
//! addresses (every frame but the leaf) so a call at the end of a function is not attributed to
//! the next one.

mod blaze;
pub mod build_id;
pub mod debug_file;
pub mod debuginfod;
pub mod elf_check;
pub mod greenlet;
mod kernel_text;
pub mod mapped;
pub mod otel_ctx;
pub mod plt;
pub mod python;
pub mod unwind;

pub use blaze::parse_cost;
use blaze::{new_blazesym, plt_symbol, to_symbol, unknown, with_debug_file};

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::Input;
use blazesym::MaybeDefault;
use rustc_hash::FxHashMap;

/// A function found by [`symbol_addresses`], to probe: its address, its size (0: not said) and
/// its first bytes of code (up to 16; fewer at the end of its section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionHead {
    pub address: u64,
    pub size: u64,
    pub code: Vec<u8>,
}

/// The functions `symbols` of the ELF file at `path` (`None` for those it lacks: aliases such as
/// glibc's `memalign` and `aligned_alloc` share one), and the end of its last executable
/// `PT_LOAD`. `None` when the file cannot be read.
pub fn symbol_addresses(path: &Path, symbols: &[&str]) -> Option<(Vec<Option<FunctionHead>>, u64)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = std::fs::read(path).ok()?;
    let elf = ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    let endian = elf.endian();
    let text_end = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| {
            ph.p_type(endian) == object::elf::PT_LOAD && ph.p_flags(endian) & object::elf::PF_X != 0
        })
        .map(|ph| ph.p_vaddr(endian) + ph.p_memsz(endian))
        .max()?;
    let mut addresses: Vec<Option<FunctionHead>> = vec![None; symbols.len()];
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        let (Ok(name), address) = (sym.name(), sym.address()) else {
            continue;
        };
        if address == 0 {
            continue;
        }
        for (i, wanted) in symbols.iter().enumerate() {
            if addresses[i].is_none() && *wanted == name {
                let code = elf
                    .sections()
                    .find(|s| {
                        s.kind() == object::SectionKind::Text
                            && s.address() <= address
                            && address < s.address() + s.size()
                    })
                    .and_then(|s| {
                        let len = (s.address() + s.size() - address).min(16);
                        s.data_range(address, len).ok().flatten()
                    })
                    .unwrap_or_default()
                    .to_vec();
                addresses[i] = Some(FunctionHead {
                    address,
                    size: sym.size(),
                    code,
                });
            }
        }
    }
    Some((addresses, text_end))
}

/// Module name used for kernel frames.
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// A resolved (or unresolvable) address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Symbol {
    /// Demangled function name, `None` when unknown.
    pub function: Option<String>,
    /// Module path (ELF file, or [`KERNEL_MODULE`]), when known.
    pub module: Option<String>,
    /// File offset within the module for user addresses, the absolute address otherwise.
    pub address: u64,
    /// Source file, from DWARF.
    pub file: Option<String>,
    /// Source line, from DWARF.
    pub line: Option<u32>,
    /// Why `function` is `None`.
    pub unknown_reason: Option<String>,
    /// The ids of the module file (GNU build id, `htlhash`), when it was read.
    pub ids: Option<std::sync::Arc<build_id::ModuleIds>>,
    /// The functions inlined at the address, outermost first (`function` called the first,
    /// which called the next, …, and the last holds the address); `file` and `line` are then
    /// those of the call in `function`. Empty without DWARF.
    pub inlined: Vec<Inlined>,
}

/// Functions inlined at one address kept at most, the outermost (deeper chains are
/// pathological: the innermost are dropped).
pub const MAX_INLINED: usize = 32;

/// A function inlined into a [`Symbol`]'s, from DWARF.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Inlined {
    /// `None` when DWARF names it not.
    pub function: Option<String>,
    /// Source file and line in it: of the call of the next inlined function, or of the
    /// address for the last.
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// A module file of the profiled processes, opened while a process mapping it lived
/// ([`mapped::open_mapped`]): symbolization reads that very file, never another of the same
/// path (a container's libc is not the host's).
#[derive(Debug)]
struct Module {
    /// The (device, inode) of its maps lines.
    key: (u64, u64),
    /// The path as `/proc/PID/maps` names it, for outputs.
    path: PathBuf,
    /// The open file; `None` when it could not be opened, with the reason.
    file: Result<std::fs::File, String>,
    /// The file is in spanprof's own root and only root can have made it
    /// ([`elf_check::trusted`]).
    trusted: bool,
    /// Its GNU build id and `htlhash`, read when it was opened.
    ids: Option<std::sync::Arc<build_id::ModuleIds>>,
    /// Its separate debug file, found while the process lived ([`debug_file::lookup`]: the
    /// target's root first, only one of the same build).
    debug: Option<debug_file::DebugFile>,
    /// Debug-link candidates opened while the process lived, whose CRCs are read when the
    /// module is first parsed, not in the sampling loop.
    debug_pending: Option<debug_file::PendingLink>,
    /// Its symbols as blazesym parsed them, kept between calls of [`Symbolizer::symbolize`]
    /// within [`Symbolizer::set_cache_limit`].
    parsed: Option<Parsed>,
}

/// One module's parsed symbols: a blazesym symbolizer of its own, so that it can be dropped
/// alone.
struct Parsed {
    symbolizer: blazesym::symbolize::Symbolizer,
    /// blazesym may read the module's own DWARF: the module is trusted, or names no other
    /// file it would open by path ([`elf_check::links_elsewhere`]).
    dwarf: bool,
    /// Names of its PLT stubs ([`plt::PltTable`]), which no symbol table covers.
    plt: Option<plt::PltTable>,
    /// What keeping it costs, estimated ([`parse_cost`]).
    bytes: u64,
    /// The [`Symbolizer::symbolize`] call that used it last.
    used: u64,
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parsed")
            .field("bytes", &self.bytes)
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

/// Where a user address lives, once normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Elf {
        module: u32,
        offset: u64,
    },
    /// In an executable mapping backed by no file: its name (`[vdso]`) and the offset in it.
    Anonymous {
        name: Box<str>,
        offset: u64,
    },
    Unknown {
        reason: String,
    },
}

/// An executable file mapping of a process, as its memory map last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    module: u32,
}

/// What is kept of a process to normalize its addresses, even after it exited: its executable
/// mappings as last read (their module files open), while it lived.
#[derive(Debug, Default)]
struct Proc {
    /// Sorted by start.
    ranges: Vec<Range>,
    /// Executable mappings backed by no file (JIT code, the vDSO), sorted by start.
    anonymous: Vec<mapped::AnonymousRange>,
    /// [`Symbolizer::forget_exited`] found it gone; the next call forgets it.
    gone: bool,
    /// The drain ([`Symbolizer::next_drain`]) in which its map was last read (or tried).
    read_in: u64,
    /// The drain in which [`Symbolizer::normalize`] last read its map (or tried).
    normalized_in: u64,
    /// It exec'd since its map was last read ([`Symbolizer::exec`]).
    stale: bool,
    /// It exited ([`Symbolizer::exited`]) when this many symbolizations had begun
    /// ([`Symbolizer::start`]): its addresses are all in the next one at the latest.
    exited: Option<u64>,
}

impl Proc {
    fn range(&self, addr: u64) -> Option<&Range> {
        let i = self.ranges.partition_point(|r| r.start <= addr);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (addr < r.end).then_some(r)
    }

    /// Whether the map read last holds `addr`: in a module, or in anonymous code.
    fn holds(&self, addr: u64) -> bool {
        self.range(addr).is_some() || self.in_anonymous(addr).is_some()
    }

    fn in_anonymous(&self, addr: u64) -> Option<&mapped::AnonymousRange> {
        let i = self.anonymous.partition_point(|r| r.start <= addr);
        let r = self.anonymous.get(i.checked_sub(1)?)?;
        (addr < r.end).then_some(r)
    }
}

/// Counters for the session summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// User addresses normalized while their process was alive, or from its memory map read
    /// while it lived.
    pub normalized: u64,
    /// User addresses that could not be normalized: their process was gone before its memory
    /// map was read, or its memory map unreadable.
    pub process_gone: u64,
    /// Memory maps read (`/proc/PID/maps`).
    pub maps_read: u64,
}

/// What the symbolizer holds now (the daemon's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Module files open (each mapped by a process alive, or one an address still refers to).
    pub modules: usize,
    /// Modules whose parsed symbols are kept.
    pub parsed_modules: usize,
    /// The estimated size of the parsed symbols kept ([`parse_cost`]), at most
    /// [`CacheStats::limit`] between calls of [`Symbolizer::symbolize`].
    pub parsed_bytes: u64,
    /// The bound of `parsed_bytes`.
    pub limit: u64,
    /// The most `parsed_bytes` held since the last [`Symbolizer::forget_exited`] (or the
    /// start), measured after each module's symbols were looked up: what a symbolization held
    /// at most, the symbols of processes that exited by its end included. Within `limit`, unless one module alone is
    /// larger (it is kept while it is looked up).
    pub parsed_peak: u64,
    /// Processes whose memory map is kept.
    pub processes: usize,
}

/// [`Symbol::unknown_reason`] of a user address in no executable mapping of its process, file
/// or anonymous: no code was ever there, so it is no return address (a frame-pointer walk that
/// went on through code that keeps none), and its callers are not known either.
pub const OUTSIDE_MAPPINGS: &str = "in no executable mapping of the process: not a return address";

/// [`Symbol::unknown_reason`] of a user address in an executable mapping backed by no file.
pub const ANONYMOUS_CODE: &str =
    "not in a file the process maps executable (anonymous or special memory: JIT code, the vDSO)";

/// The default bound of the parsed symbols kept between two symbolizations (64 MiB).
pub const DEFAULT_CACHE_LIMIT: u64 = 64 << 20;

/// Normalizes user addresses during a session and symbolizes everything at its end.
///
/// # Memory
/// What it keeps is bounded for a long-running caller (the daemon) whatever the number of
/// distinct programs that come and go:
/// - per process, its executable mappings (read at its first addresses, again while it lives
///   when new ones fall outside them, after an exec or every 20 drains, 1–2 s) and their module
///   files, open; [`Symbolizer::forget_exited`] drops a process one call after it found it gone
///   (its last samples may still be on their way), with its addresses, and closes the module
///   files nothing refers to any more;
/// - per module, its parsed symbols (blazesym's), made when it is first symbolized and kept
///   for the next calls while their estimated total stays within
///   [`Symbolizer::set_cache_limit`], dropping the least recently used first (during a call
///   too: at most one module above the bound is parsed at a time).
#[derive(Debug)]
pub struct Symbolizer {
    /// Kernel symbols, made anew every [`KERNEL_REBUILD_EVERY`]: blazesym keys its cache of
    /// `/proc/kallsyms` by the file's metadata, which procfs does not change when modules or
    /// BPF programs come and go, so a kept one would name new code after its neighbours for
    /// ever.
    kernel_symbolizer: (blazesym::symbolize::Symbolizer, std::time::Instant),
    /// The core kernel text's symbols kept for this boot (`None` inside: none could be), once
    /// a kernel frame was to be named.
    kernel_text: Option<Option<kernel_text::CoreText>>,
    /// Whether the kernel symbols `kernel_symbolizer` holds came from the kept file (`None`:
    /// none yet).
    kernel_from_file: Option<bool>,
    /// Slots; a freed one (`None`) is reused, so the table is as long as the most modules
    /// open at once.
    modules: Vec<Option<Module>>,
    free: Vec<u32>,
    /// Modules by the (device, inode) of their maps line.
    module_ids: FxHashMap<(u64, u64), u32>,
    procs: FxHashMap<u32, Proc>,
    user: FxHashMap<(u32, u64), Location>,
    stats: Stats,
    cache_limit: u64,
    parsed_bytes: u64,
    parsed_peak: u64,
    calls: u64,
    drains: u64,
    /// Where debug files of stripped modules are fetched from, if anywhere.
    debuginfod: Option<debuginfod::Debuginfod>,
    /// Module and debug files [`elf_check::check`] refused, with why (at most
    /// [`MAX_REFUSED_KEPT`]), and how many in all.
    refused: (Vec<(PathBuf, String)>, u64),
}

/// A lookup's debug file, or its pending debug-link candidates.
fn split_lookup(
    lookup: Option<debug_file::Lookup>,
) -> (
    Option<debug_file::DebugFile>,
    Option<debug_file::PendingLink>,
) {
    match lookup {
        Some(debug_file::Lookup::Found(d)) => (Some(d), None),
        Some(debug_file::Lookup::Pending(p)) => (None, Some(p)),
        None => (None, None),
    }
}

/// Refused files whose path and reason are kept for the summary.
const MAX_REFUSED_KEPT: usize = 16;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with empty caches.
    pub fn new() -> Self {
        Self {
            kernel_symbolizer: (new_blazesym(), std::time::Instant::now()),
            kernel_text: None,
            kernel_from_file: None,
            modules: Vec::new(),
            free: Vec::new(),
            module_ids: FxHashMap::default(),
            procs: FxHashMap::default(),
            user: FxHashMap::default(),
            stats: Stats::default(),
            cache_limit: DEFAULT_CACHE_LIMIT,
            parsed_bytes: 0,
            parsed_peak: 0,
            calls: 0,
            drains: 1,
            debuginfod: None,
            refused: (Vec::new(), 0),
        }
    }

    /// Bounds the parsed symbols kept between (and during) symbolizations, in bytes as
    /// [`parse_cost`] estimates them; 0 keeps none.
    pub fn set_cache_limit(&mut self, bytes: u64) {
        self.cache_limit = bytes;
        self.evict_parsed(None);
    }

    /// What it holds now.
    pub fn cache_stats(&self) -> CacheStats {
        let open = self.modules.iter().flatten();
        CacheStats {
            modules: open.clone().count(),
            parsed_modules: open.filter(|m| m.parsed.is_some()).count(),
            parsed_bytes: self.parsed_bytes,
            parsed_peak: self.parsed_peak.max(self.parsed_bytes),
            limit: self.cache_limit,
            processes: self.procs.len(),
        }
    }

    /// Forgets the processes that exited (a long-running caller calls it after each
    /// symbolization: the tables would grow with every process seen, and a later process with
    /// the same pid would get the old one's modules), and closes the module files nothing
    /// refers to any more.
    ///
    /// It is called once the last symbolization begun is done: a process whose exit was told
    /// ([`Symbolizer::exited`]) before that symbolization began is forgotten now (its addresses
    /// were all in it). One found gone otherwise (its exit record lost) is forgotten at the
    /// next call, not at once: samples it took before it exited may not have been drained yet,
    /// and their addresses are normalized from the memory map read while it lived.
    pub fn forget_exited(&mut self) {
        let mut forgotten: rustc_hash::FxHashSet<u32> = Default::default();
        // Addresses of a pid whose maps were never read (it was gone at once) have a `Proc`
        // too: `normalize` makes one for every pid.
        let calls = self.calls;
        self.procs.retain(|&pid, p| {
            if p.exited.is_some_and(|at| at < calls) {
                forgotten.insert(pid);
                false
            } else if p.exited.is_some() {
                true
            } else if Path::new(&format!("/proc/{pid}")).exists() {
                p.gone = false;
                true
            } else if p.gone {
                forgotten.insert(pid);
                false
            } else {
                p.gone = true;
                true
            }
        });
        if !forgotten.is_empty() {
            self.user.retain(|(pid, _), _| !forgotten.contains(pid));
        }
        let mut used = vec![false; self.modules.len()];
        for r in self.procs.values().flat_map(|p| &p.ranges) {
            used[r.module as usize] = true;
        }
        for loc in self.user.values() {
            if let Location::Elf { module, .. } = loc {
                used[*module as usize] = true;
            }
        }
        for (id, used) in used.into_iter().enumerate() {
            if used {
                continue;
            }
            if let Some(module) = self.modules[id].take() {
                if let Some(parsed) = &module.parsed {
                    self.parsed_bytes -= parsed.bytes;
                }
                self.module_ids.remove(&module.key);
                self.free.push(id as u32);
            }
        }
        self.parsed_peak = self.parsed_bytes;
    }

    /// Process `pid` exited and every address of it was normalized (its exit record came after
    /// its samples): the memory map kept of it goes now, and its addresses at the next
    /// [`Symbolizer::forget_exited`] (the caller symbolizes them before).
    pub fn exited(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.ranges = Vec::new();
            p.anonymous = Vec::new();
            p.exited = Some(self.calls);
        }
    }

    /// A drain of the ring buffer begins: [`Symbolizer::seen`] may read each process's map
    /// once more.
    pub fn next_drain(&mut self) {
        self.drains += 1;
    }

    /// A sample of process `pid` with user instruction pointer `ip` (0: none) was drained:
    /// its memory map is read (and its modules opened) now, while it most likely lives, when
    /// none was yet or the one kept does not hold `ip` (libraries the dynamic loader mapped
    /// since, dlopen) or is stale (an exec), at most once per drain. Cheap otherwise: one
    /// lookup, no allocation. Returns whether the map was read.
    pub fn seen(&mut self, pid: u32, ip: u64) -> bool {
        let drains = self.drains;
        if let Some(p) = self.procs.get(&pid) {
            // (An address in anonymous executable memory (the vDSO, JIT code) known from the
            // map read last is no reason to read it again: a loop calling clock_gettime had
            // the map read at every drain.)
            if p.read_in == drains || ip == 0 || (!p.stale && p.holds(ip)) {
                return false;
            }
        }
        let read = self.read_ranges(pid);
        let p = self.procs.entry(pid).or_default();
        p.read_in = drains;
        if let Ok((ranges, anonymous)) = read {
            p.ranges = ranges;
            p.anonymous = anonymous;
            p.gone = false;
            p.stale = false;
        }
        true
    }

    /// Process `pid` exec'd: its map is read again before its next addresses are normalized.
    pub fn exec(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.stale = true;
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Normalizes addresses of a process, from its memory map (the one kept while it is recent
    /// and holds them all, else read now), or, when it is gone, from the one read while it
    /// lived. Already known addresses are skipped; `addrs` is sorted and deduplicated in
    /// place.
    pub fn normalize(&mut self, pid: u32, addrs: &mut Vec<u64>) {
        addrs.sort_unstable();
        addrs.dedup();
        addrs.retain(|a| !self.user.contains_key(&(pid, *a)));
        if addrs.is_empty() {
            return;
        }
        // The map read last serves while it is recent and holds every address: a process maps
        // a new library at new addresses, and rarely another at the addresses of one it
        // unmapped. (Read again at every call, it was half of a session's CPU per sample.)
        let drains = self.drains;
        // (Read by this function in this drain already: not again, junk addresses of a
        // broken frame-pointer walk would make it read at every call. A read by `seen` in this
        // drain does not count: it may have been made at the process's first sample, in the
        // dynamic loader, before the libraries that the drain's later samples are in were
        // mapped; a short-lived child would then exit with them unnamed.) A library unmapped
        // and another mapped at its addresses within those 1–2 s is named after the first: see
        // ARCHITECTURE.md, Known limits.
        let known = self.procs.get(&pid).is_some_and(|p| {
            !p.stale
                && (p.normalized_in == drains
                    || (drains.saturating_sub(p.read_in) < MAP_REFRESH_DRAINS
                        && addrs.iter().all(|&a| p.holds(a))))
        });
        let read = if known {
            Ok(())
        } else {
            let read = self.read_ranges(pid).map(|(ranges, anonymous)| {
                let proc_ = self.procs.entry(pid).or_default();
                proc_.ranges = ranges;
                proc_.anonymous = anonymous;
                proc_.gone = false;
                proc_.read_in = drains;
                proc_.stale = false;
            });
            self.procs.entry(pid).or_default().normalized_in = drains;
            read
        };
        let proc_ = self.procs.entry(pid).or_default();
        for &addr in addrs.iter() {
            let loc = match (proc_.range(addr), &read) {
                (Some(r), _) => {
                    self.stats.normalized += 1;
                    Location::Elf {
                        module: r.module,
                        offset: addr - r.start + r.offset,
                    }
                }
                // Gone: a library mapped after its map was last read may hold it, so it is
                // not judged outside.
                (None, Err(reason)) => {
                    self.stats.process_gone += 1;
                    Location::Unknown {
                        reason: reason.clone(),
                    }
                }
                (None, Ok(())) => {
                    self.stats.normalized += 1;
                    match proc_.in_anonymous(addr) {
                        Some(r) => Location::Anonymous {
                            name: r.name.clone(),
                            offset: addr - r.start,
                        },
                        None => Location::Unknown {
                            reason: OUTSIDE_MAPPINGS.to_string(),
                        },
                    }
                }
            };
            self.user.insert((pid, addr), loc);
        }
    }

    /// The executable file mappings of a live process, their module files opened now, and its
    /// anonymous executable ranges; the reason it has none to give.
    fn read_ranges(
        &mut self,
        pid: u32,
    ) -> Result<(Vec<Range>, Vec<mapped::AnonymousRange>), String> {
        self.stats.maps_read += 1;
        let gone = || "process exited before symbolization".to_string();
        let text = match mapped::read_maps_text(pid) {
            // A zombie (or a kernel thread) has an empty map.
            Ok(text) if text.is_empty() => return Err(gone()),
            Ok(text) => text,
            Err(_) if !Path::new(&format!("/proc/{pid}")).exists() => return Err(gone()),
            Err(e) => return Err(format!("cannot read memory map: {e}")),
        };
        let maps = mapped::parse_maps(&text);
        if maps.is_empty() {
            return Err(gone());
        }
        let mut ranges: Vec<Range> = maps
            .iter()
            .filter(|m| m.is_exec())
            .map(|m| Range {
                start: m.start,
                end: m.end,
                offset: m.offset,
                module: self.intern_module(pid, m),
            })
            .collect();
        ranges.sort_unstable_by_key(|r| r.start);
        Ok((ranges, mapped::anonymous_exec_ranges(&text)))
    }

    /// The module of maps line `line` of process `pid`: its file, opened now, while the
    /// process lives.
    fn intern_module(&mut self, pid: u32, line: &mapped::Mapping) -> u32 {
        let key = (line.dev, line.inode);
        if let Some(&id) = self.module_ids.get(&key) {
            // A file that could not be opened is tried again for a process that maps it.
            let module = self.modules[id as usize]
                .as_mut()
                .expect("an interned module is open");
            if module.file.is_err() {
                if let Ok((file, _)) = mapped::open_mapped(pid, line) {
                    module.trusted =
                        mapped::foreign_root(pid).is_none() && elf_check::trusted(&file);
                    module.ids = build_id::ModuleIds::read(&file).map(std::sync::Arc::new);
                    (module.debug, module.debug_pending) = split_lookup(debug_file::lookup(
                        &file,
                        line.file_path(),
                        mapped::foreign_root(pid).as_deref(),
                    ));
                    module.file = Ok(file);
                }
            }
            return id;
        }
        let file = mapped::open_mapped(pid, line)
            .map(|(f, _)| f)
            .map_err(|e| format!("cannot open the file the process maps: {e}"));
        let (debug, debug_pending) = split_lookup(file.as_ref().ok().and_then(|f| {
            debug_file::lookup(f, line.file_path(), mapped::foreign_root(pid).as_deref())
        }));
        let ids = file
            .as_ref()
            .ok()
            .and_then(build_id::ModuleIds::read)
            .map(std::sync::Arc::new);
        let trusted =
            mapped::foreign_root(pid).is_none() && file.as_ref().is_ok_and(elf_check::trusted);
        let module = Module {
            key,
            path: PathBuf::from(line.file_path()),
            trusted,
            file,
            ids,
            debug,
            debug_pending,
            parsed: None,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.modules[id as usize] = Some(module);
                id
            }
            None => {
                self.modules.push(Some(module));
                (self.modules.len() - 1) as u32
            }
        };
        self.module_ids.insert(key, id);
        id
    }

    /// Counts a refused file (module `path`'s, or its debug file) and keeps why, for the first
    /// [`MAX_REFUSED_KEPT`].
    fn note_refused(refused: &mut (Vec<(PathBuf, String)>, u64), path: &Path, why: &str) {
        refused.1 += 1;
        if refused.0.len() < MAX_REFUSED_KEPT {
            refused.0.push((path.to_path_buf(), why.to_string()));
        }
    }

    /// The files refused as unsafe to parse ([`elf_check::check`]), at most the first
    /// [`MAX_REFUSED_KEPT`] with why, and how many in all.
    pub fn refused_files(&self) -> (&[(PathBuf, String)], u64) {
        (&self.refused.0, self.refused.1)
    }

    /// Drops parsed symbols, least recently used first, until what is kept is within the
    /// bound; never those of module `keep`.
    fn evict_parsed(&mut self, keep: Option<u32>) {
        while self.parsed_bytes > self.cache_limit {
            let oldest = self
                .modules
                .iter()
                .enumerate()
                .filter(|&(id, _)| Some(id as u32) != keep)
                .filter_map(|(id, m)| Some((m.as_ref()?.parsed.as_ref()?.used, id)))
                .min();
            let Some((_, id)) = oldest else {
                break;
            };
            let module = self.modules[id].as_mut().expect("a parsed module is open");
            if let Some(parsed) = module.parsed.take() {
                self.parsed_bytes -= parsed.bytes;
            }
        }
    }

    /// Fetches debug files from `client` for modules whose addresses their own symbols leave
    /// unknown ([`debuginfod`]); none are fetched without one (the default).
    pub fn set_debuginfod(&mut self, client: Option<debuginfod::Debuginfod>) {
        self.debuginfod = client;
    }

    /// The debuginfod client, to report what it did.
    pub fn debuginfod(&self) -> Option<&debuginfod::Debuginfod> {
        self.debuginfod.as_ref()
    }

    /// Resolves user addresses (`(pid, addr)` pairs normalized earlier) and kernel addresses.
    ///
    /// Returns one [`Symbol`] per input, in input order. User addresses never normalized come
    /// out unknown ("not normalized").
    pub fn symbolize(&mut self, user: &[(u32, u64)], kernel: &[u64]) -> (Vec<Symbol>, Vec<Symbol>) {
        let mut job = self.start(user, kernel.to_vec());
        while !self.step(&mut job, std::time::Duration::MAX) {}
        job.finish()
    }

    /// Begins a symbolization that [`Symbolizer::step`] carries out a part at a time, so that
    /// a caller can go on draining samples in between (the daemon: a window of many modules
    /// takes long, and processes that start and exit meanwhile must be seen while they live).
    /// Until it is done, [`Symbolizer::forget_exited`] must not be called.
    pub fn start(&mut self, user: &[(u32, u64)], kernel: Vec<u64>) -> Job {
        self.calls += 1;
        // Group file offsets per module so each module is opened and searched once.
        let mut per_module: FxHashMap<u32, Vec<(usize, u64)>> = FxHashMap::default();
        let mut user_out: Vec<Symbol> = Vec::with_capacity(user.len());
        for (i, &(pid, addr)) in user.iter().enumerate() {
            match self.user.get(&(pid, addr)) {
                Some(Location::Elf { module, offset }) => {
                    per_module.entry(*module).or_default().push((i, *offset));
                    let module = self.modules[*module as usize].as_ref();
                    let mut symbol = unknown(module.map(|m| &*m.path), *offset, "not symbolized");
                    symbol.ids = module.and_then(|m| m.ids.clone());
                    user_out.push(symbol);
                }
                Some(Location::Anonymous { name, offset }) => {
                    user_out.push(unknown(Some(Path::new(&**name)), *offset, ANONYMOUS_CODE))
                }
                Some(Location::Unknown { reason }) => user_out.push(unknown(None, addr, reason)),
                None => user_out.push(unknown(None, addr, "not normalized")),
            }
        }
        // In a stable order (the least recently used are evicted first), popped from the end.
        let mut per_module: Vec<(u32, Vec<(usize, u64)>)> = per_module.into_iter().collect();
        per_module.sort_unstable_by_key(|(m, _)| std::cmp::Reverse(*m));
        Job {
            per_module,
            user_out,
            kernel,
            kernel_out: None,
            calls: self.calls,
        }
    }

    /// Carries `job` on for about `budget` (at least one module); true once it is done.
    pub fn step(&mut self, job: &mut Job, budget: std::time::Duration) -> bool {
        let began = std::time::Instant::now();
        let user_out = &mut job.user_out;
        while let Some((id, items)) = job.per_module.pop() {
            let calls = job.calls;
            let Some(module) = self.modules[id as usize].as_mut() else {
                continue;
            };
            let Module {
                path,
                file,
                trusted,
                ids,
                debug,
                debug_pending,
                parsed,
                ..
            } = module;
            // Debug-link candidates are read for their CRCs now, out of the sampling loop.
            if let Some(pending) = debug_pending.take() {
                let (found, too_large) = pending.resolve();
                if too_large > 0 {
                    Self::note_refused(
                        &mut self.refused,
                        path,
                        &format!(
                            "{too_large} debug-link candidate(s) larger than {} MiB not read",
                            debug_file::MAX_CRC_FILE >> 20
                        ),
                    );
                }
                if debug.is_none() {
                    *debug = found;
                }
            }
            // What blazesym would allocate from their headers, checked before it parses them.
            if parsed.is_none() {
                if let Ok(f) = file {
                    if let Err(why) = elf_check::check(f, *trusted) {
                        Self::note_refused(&mut self.refused, path, &why);
                        *file = Err(format!("refused: {why}"));
                    }
                }
                if let Some(d) = debug {
                    if let Err(why) = elf_check::check(&d.file, d.trusted) {
                        Self::note_refused(
                            &mut self.refused,
                            path,
                            &format!("its debug file: {why}"),
                        );
                        *debug = None;
                    }
                }
            }
            let file = match file {
                Ok(file) => file,
                Err(reason) => {
                    for (i, offset) in &items {
                        user_out[*i] = unknown(Some(path), *offset, reason);
                    }
                    continue;
                }
            };
            let parsed = parsed.get_or_insert_with(|| {
                let bytes = parse_cost(file, debug.as_ref());
                self.parsed_bytes += bytes;
                Parsed {
                    symbolizer: new_blazesym(),
                    dwarf: *trusted || !elf_check::links_elsewhere(file),
                    plt: plt::PltTable::read(file),
                    bytes,
                    used: calls,
                }
            });
            parsed.used = calls;
            let symbolizer = &parsed.symbolizer;
            let offsets: Vec<u64> = items.iter().map(|&(_, o)| o).collect();
            // The open file, by a path that stays this file (blazesym opens by path; its
            // cache checks device and inode, so a reused descriptor number is not mistaken).
            let mut result = Err(None);
            if let Some(debug) = debug {
                if let Some(found) = with_debug_file(symbolizer, debug, &offsets) {
                    result = found.map_err(Some);
                }
            }
            if result.is_err() && parsed.dwarf {
                let src = Source::Elf(Elf::new(format!("/proc/self/fd/{}", file.as_raw_fd())));
                result = symbolizer
                    .symbolize(&src, Input::FileOffset(&offsets))
                    .map_err(Some);
            }
            if result.is_err() {
                // A module whose DWARF is not read (it links to files blazesym would look for
                // by path: see `Parsed::dwarf`), or a separate debug file that blazesym found by
                // itself but cannot use (a trusted module's debug link whose checksum does not
                // match): the module's own symbol tables still name its functions.
                let mut elf = Elf::new(format!("/proc/self/fd/{}", file.as_raw_fd()));
                elf.debug_syms = false;
                result = symbolizer
                    .symbolize(&Source::Elf(elf), Input::FileOffset(&offsets))
                    .map_err(Some);
            }
            match result.map_err(|e| e.expect("a symbolization was tried")) {
                Ok(results) => {
                    for ((i, offset), result) in items.iter().zip(results) {
                        user_out[*i] = to_symbol(result, Some(path), *offset);
                    }
                }
                Err(err) => {
                    let reason = format!("cannot read {}: {err}", path.display());
                    for (i, offset) in &items {
                        user_out[*i] = unknown(Some(path), *offset, &reason);
                    }
                }
            }
            // A PLT stub is named after the function it jumps to, not after the symbol
            // before it (`_init`).
            if let Some(table) = &parsed.plt {
                for (i, offset) in &items {
                    if let Some(name) = table.name(*offset) {
                        user_out[*i] = plt_symbol(name, path, *offset);
                    }
                }
            }
            // Addresses its own symbols left unknown: a debug file from debuginfod, asked
            // once per module file, may name them.
            let gnu = ids.as_ref().and_then(|i| i.gnu.as_deref());
            if let (None, Some(client), Some(gnu)) = (&debug, self.debuginfod.as_mut(), gnu) {
                let unknown: Vec<(usize, u64)> = items
                    .iter()
                    .filter(|(i, _)| user_out[*i].function.is_none())
                    .copied()
                    .collect();
                if !unknown.is_empty() {
                    *debug = client
                        .fetch(gnu)
                        .and_then(|fetched| debug_file::DebugFile::fetched(file, fetched));
                    // A server's file is untrusted input too.
                    if let Some(Err(why)) = debug.as_ref().map(|d| elf_check::check(&d.file, false))
                    {
                        Self::note_refused(
                            &mut self.refused,
                            path,
                            &format!("its debug file from debuginfod: {why}"),
                        );
                        *debug = None;
                    }
                }
                if let (Some(found), false) = (debug.as_ref(), unknown.is_empty()) {
                    let offsets: Vec<u64> = unknown.iter().map(|&(_, o)| o).collect();
                    if let Some(Ok(results)) = with_debug_file(symbolizer, found, &offsets) {
                        for ((i, offset), result) in unknown.iter().zip(results) {
                            let symbol = to_symbol(result, Some(path), *offset);
                            if symbol.function.is_some() {
                                user_out[*i] = symbol;
                            }
                        }
                    }
                }
            }
            for (i, _) in &items {
                user_out[*i].ids.clone_from(ids);
            }
            self.evict_parsed(Some(id));
            self.parsed_peak = self.parsed_peak.max(self.parsed_bytes);
            if began.elapsed() >= budget {
                return false;
            }
        }
        self.evict_parsed(None);
        if job.kernel_out.is_some() {
            return true;
        }
        let kernel = &job.kernel;
        let kernel_out = if kernel.is_empty() {
            Vec::new()
        } else {
            let text = self.kernel_text.get_or_insert_with(|| {
                kernel_text::default_dir().and_then(|d| kernel_text::core_text(&d))
            });
            // Frames all in the core kernel's text: from the symbols kept for the boot, not
            // from /proc/kallsyms, which costs a session about 60 ms to read.
            let kept_file = text
                .as_ref()
                .filter(|t| t.holds(kernel))
                .map(|t| t.path.clone());
            let kept = &mut self.kernel_symbolizer;
            // One source's symbols held at a time (about 7 MiB each): a change of source
            // starts afresh.
            if kept.1.elapsed() >= KERNEL_REBUILD_EVERY
                || self
                    .kernel_from_file
                    .is_some_and(|f| f != kept_file.is_some())
            {
                *kept = (new_blazesym(), std::time::Instant::now());
            }
            self.kernel_from_file = Some(kept_file.is_some());
            let symbolizer = &kept.0;
            let src = match kept_file {
                Some(path) => Source::Kernel(Kernel {
                    kallsyms: MaybeDefault::Some(path),
                    vmlinux: MaybeDefault::None,
                    ..Kernel::default()
                }),
                None => Source::Kernel(Kernel::default()),
            };
            let kernel_path = Path::new(KERNEL_MODULE);
            match symbolizer.symbolize(&src, Input::AbsAddr(kernel)) {
                Ok(results) => results
                    .into_iter()
                    .zip(kernel)
                    .map(|(r, &a)| to_symbol(r, Some(kernel_path), a))
                    .collect(),
                Err(err) => {
                    let reason = format!("cannot read kernel symbols: {err}");
                    kernel
                        .iter()
                        .map(|&a| unknown(Some(kernel_path), a, &reason))
                        .collect()
                }
            }
        };
        job.kernel_out = Some(kernel_out);
        true
    }
}

/// A symbolization under way ([`Symbolizer::start`]).
#[derive(Debug)]
pub struct Job {
    /// Modules still to do, the next last.
    per_module: Vec<(u32, Vec<(usize, u64)>)>,
    user_out: Vec<Symbol>,
    kernel: Vec<u64>,
    kernel_out: Option<Vec<Symbol>>,
    calls: u64,
}

impl Job {
    /// The symbols of the user and the kernel addresses, in their order
    /// ([`Symbolizer::symbolize`]); those not done yet are unknown.
    pub fn finish(self) -> (Vec<Symbol>, Vec<Symbol>) {
        let kernel_out = self.kernel_out.unwrap_or_else(|| {
            self.kernel
                .iter()
                .map(|&a| unknown(Some(Path::new(KERNEL_MODULE)), a, "not symbolized"))
                .collect()
        });
        (self.user_out, kernel_out)
    }
}

/// How many drains the memory map read last names the addresses of a process that maps
/// nothing new (at the collector's tick of 50 ms, 100 ms once quiet: 1–2 s).
const MAP_REFRESH_DRAINS: u64 = 20;

/// How long kernel symbols are kept: code loaded since (modules, BPF programs) may be named
/// after a neighbour for at most this long.
const KERNEL_REBUILD_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(test)]
mod test_child;

#[cfg(test)]
mod tests;
