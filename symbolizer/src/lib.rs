//! Native (ELF/DWARF) and kernel symbolization for spanprof, on top of blazesym.
//!
//! # Overview
//! Symbolization happens in two steps, because a profiled process may exit before the session
//! ends:
//! 1. [`Symbolizer::normalize`] turns a live process's virtual addresses into (module, file offset)
//!    pairs by reading `/proc/PID/maps`, while the process is still there. User space calls it for
//!    new addresses every time it drains the ring buffer, so only the last few milliseconds of a
//!    process that exits are at risk, and those come out as unknown frames with the reason.
//! 2. [`Symbolizer::symbolize`] resolves everything at the end, per module file, in batches:
//!    names (demangled), source files and lines from DWARF when present, and the kernel from
//!    `/proc/kallsyms`.
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

pub mod debug_file;
pub mod mapped;
pub mod otel_ctx;
pub mod python;
pub mod unwind;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use blazesym::normalize::{NormalizeOpts, Normalizer, UserMeta};
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized};
use blazesym::Pid;
use rustc_hash::FxHashMap;

/// The link-time addresses of `symbols` in the ELF file at `path` (`None` for those it lacks:
/// aliases such as glibc's `memalign` and `aligned_alloc` share one), and the end of its last
/// executable `PT_LOAD`. `None` when the file cannot be read.
pub fn symbol_addresses(path: &Path, symbols: &[&str]) -> Option<(Vec<Option<u64>>, u64)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::{Object, ObjectSymbol};
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
    let mut addresses = vec![None; symbols.len()];
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        let (Ok(name), address) = (sym.name(), sym.address()) else {
            continue;
        };
        if address == 0 {
            continue;
        }
        for (i, wanted) in symbols.iter().enumerate() {
            if addresses[i].is_none() && *wanted == name {
                addresses[i] = Some(address);
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
}

/// A module file of the profiled processes, opened while a process mapping it lived
/// ([`mapped::open_mapped`]): symbolization reads that very file, never another of the same
/// path (a container's libc is not the host's).
#[derive(Debug)]
struct Module {
    /// The path as `/proc/PID/maps` names it, for outputs.
    path: PathBuf,
    /// The open file; `None` when it could not be opened, with the reason.
    file: Result<std::fs::File, String>,
    /// Its separate debug file, found while the process lived ([`debug_file::find`]: the
    /// target's root first, only one of the same build).
    debug: Option<debug_file::DebugFile>,
}

/// Where a user address lives, once normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Elf { module: u32, offset: u64 },
    Unknown { reason: String },
}

/// Counters for the session summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// User addresses normalized while their process was alive.
    pub normalized: u64,
    /// User addresses that could not be normalized: their process was gone, or its memory map
    /// unreadable.
    pub process_gone: u64,
}

/// Normalizes user addresses during a session and symbolizes everything at its end.
#[derive(Debug)]
pub struct Symbolizer {
    normalizer: Normalizer,
    /// blazesym's symbolizer for user modules, kept so that a long-running caller (the daemon,
    /// one [`Symbolizer::symbolize`] per window) parses each module's symbols and DWARF once;
    /// made anew every [`REBUILD_EVERY`], so that the files it keeps open (one per version of
    /// each module seen) do not pile up.
    symbolizer: std::cell::RefCell<(blazesym::symbolize::Symbolizer, std::time::Instant)>,
    /// The same for kernel addresses, made anew every [`KERNEL_REBUILD_EVERY`]: blazesym keys
    /// its cache of `/proc/kallsyms` by the file's metadata, which procfs does not change when
    /// modules or BPF programs come and go, so a kept one would name new code after its
    /// neighbours for ever.
    kernel_symbolizer: std::cell::RefCell<(blazesym::symbolize::Symbolizer, std::time::Instant)>,
    modules: Vec<Module>,
    /// Modules by the (device, inode) of their maps line.
    module_ids: FxHashMap<(u64, u64), u32>,
    user: FxHashMap<(u32, u64), Location>,
    stats: Stats,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with empty caches.
    pub fn new() -> Self {
        Self {
            // Build ids are not needed to symbolize on this host; skipping them saves a read of
            // every module.
            normalizer: Normalizer::builder()
                .enable_build_ids(false)
                .enable_procmap_query(
                    blazesym::helper::is_procmap_query_supported().unwrap_or(false),
                )
                .build(),
            symbolizer: std::cell::RefCell::new((new_blazesym(), std::time::Instant::now())),
            kernel_symbolizer: std::cell::RefCell::new((new_blazesym(), std::time::Instant::now())),
            modules: Vec::new(),
            module_ids: FxHashMap::default(),
            user: FxHashMap::default(),
            stats: Stats::default(),
        }
    }

    /// Forgets the normalized addresses of processes that exited (a long-running caller calls
    /// it now and then: the table would grow with every process seen, and a later process
    /// with the same pid would get the old one's modules).
    pub fn forget_exited(&mut self) {
        let mut alive: FxHashMap<u32, bool> = FxHashMap::default();
        self.user.retain(|&(pid, _), _| {
            *alive
                .entry(pid)
                .or_insert_with(|| Path::new(&format!("/proc/{pid}")).exists())
        });
        // Module files no address refers to any more are closed (opened again when a
        // process maps them), so a long-running caller does not keep every file it saw.
        let mut used = vec![false; self.modules.len()];
        for loc in self.user.values() {
            if let Location::Elf { module, .. } = loc {
                used[*module as usize] = true;
            }
        }
        for (module, used) in self.modules.iter_mut().zip(used) {
            if !used && module.file.is_ok() {
                module.file = Err("module file closed: no process maps it".to_string());
                module.debug = None;
            }
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Normalizes addresses of a live process. Already known addresses are skipped; `addrs` is
    /// sorted and deduplicated in place.
    pub fn normalize(&mut self, pid: u32, addrs: &mut Vec<u64>) {
        addrs.sort_unstable();
        addrs.dedup();
        addrs.retain(|a| !self.user.contains_key(&(pid, *a)));
        if addrs.is_empty() {
            return;
        }
        let opts = NormalizeOpts {
            sorted_addrs: true,
            ..Default::default()
        };
        match self
            .normalizer
            .normalize_user_addrs_opts(Pid::from(pid), addrs, &opts)
        {
            Ok(out) => {
                // Own what is needed so `out` (which borrows the normalizer) can be dropped
                // before modules are interned.
                let metas: Vec<Result<PathBuf, String>> = out
                    .meta
                    .iter()
                    .map(|m| match m {
                        UserMeta::Elf(elf) => Ok(elf.path.clone()),
                        UserMeta::Unknown(u) => Err(u.reason.to_string()),
                        UserMeta::Sym(s) => Err(format!("unsupported mapping ({})", s.name)),
                        _ => Err("unsupported mapping".to_string()),
                    })
                    .collect();
                let outputs = out.outputs;
                let mut maps: Option<Vec<mapped::Mapping>> = None;
                for (&addr, (value, meta_idx)) in addrs.iter().zip(outputs) {
                    let loc = match metas.get(meta_idx) {
                        Some(Ok(path)) => {
                            let maps = maps
                                .get_or_insert_with(|| mapped::read_maps(pid).unwrap_or_default());
                            // The maps line of this very address: two files of one path (one
                            // deleted since) are two modules.
                            let line = maps.iter().find(|m| {
                                m.start <= addr
                                    && addr < m.end
                                    && (Path::new(&m.path) == path
                                        || Path::new(m.file_path()) == path)
                            });
                            match line {
                                Some(line) => Location::Elf {
                                    module: self.intern_module(pid, path, line),
                                    offset: value,
                                },
                                None => Location::Unknown {
                                    reason: "the process's memory map changed before its \
                                             module was opened"
                                        .to_string(),
                                },
                            }
                        }
                        Some(Err(reason)) => Location::Unknown {
                            reason: reason.clone(),
                        },
                        None => Location::Unknown {
                            reason: "normalizer returned no metadata".to_string(),
                        },
                    };
                    self.user.insert((pid, addr), loc);
                    self.stats.normalized += 1;
                }
            }
            Err(err) => {
                let reason = if Path::new(&format!("/proc/{pid}")).exists() {
                    format!("cannot read memory map: {err}")
                } else {
                    "process exited before symbolization".to_string()
                };
                for &addr in addrs.iter() {
                    self.user.insert(
                        (pid, addr),
                        Location::Unknown {
                            reason: reason.clone(),
                        },
                    );
                    self.stats.process_gone += 1;
                }
            }
        }
    }

    /// The module of `path` in process `pid`: the file of its maps line `line`, opened now,
    /// while the process lives.
    fn intern_module(&mut self, pid: u32, path: &Path, line: &mapped::Mapping) -> u32 {
        let key = (line.dev, line.inode);
        if let Some(&id) = self.module_ids.get(&key) {
            // A file closed by `forget_exited` is opened again for a process that maps it.
            let module = &mut self.modules[id as usize];
            if module.file.is_err() {
                if let Ok((file, _)) = mapped::open_mapped(pid, line) {
                    module.debug = debug_file::find(
                        &file,
                        line.file_path(),
                        mapped::foreign_root(pid).as_deref(),
                    );
                    module.file = Ok(file);
                    module.path = path.to_path_buf();
                }
            }
            return id;
        }
        let file = mapped::open_mapped(pid, line)
            .map(|(f, _)| f)
            .map_err(|e| format!("cannot open the file the process maps: {e}"));
        let debug = file.as_ref().ok().and_then(|f| {
            debug_file::find(f, line.file_path(), mapped::foreign_root(pid).as_deref())
        });
        let id = self.modules.len() as u32;
        self.modules.push(Module {
            path: path.to_path_buf(),
            file,
            debug,
        });
        self.module_ids.insert(key, id);
        id
    }

    /// Resolves user addresses (`(pid, addr)` pairs normalized earlier) and kernel addresses.
    ///
    /// Returns one [`Symbol`] per input, in input order. User addresses never normalized come
    /// out unknown ("not normalized").
    pub fn symbolize(&self, user: &[(u32, u64)], kernel: &[u64]) -> (Vec<Symbol>, Vec<Symbol>) {
        let mut kept = self.symbolizer.borrow_mut();
        if kept.1.elapsed() >= REBUILD_EVERY {
            *kept = (new_blazesym(), std::time::Instant::now());
        }
        let symbolizer = &kept.0;

        // Group file offsets per module so each module is opened and searched once.
        let mut per_module: FxHashMap<u32, Vec<(usize, u64)>> = FxHashMap::default();
        let mut user_out: Vec<Symbol> = Vec::with_capacity(user.len());
        for (i, &(pid, addr)) in user.iter().enumerate() {
            match self.user.get(&(pid, addr)) {
                Some(Location::Elf { module, offset }) => {
                    per_module.entry(*module).or_default().push((i, *offset));
                    user_out.push(unknown(
                        Some(&self.modules[*module as usize].path),
                        *offset,
                        "not symbolized",
                    ));
                }
                Some(Location::Unknown { reason }) => user_out.push(unknown(None, addr, reason)),
                None => user_out.push(unknown(None, addr, "not normalized")),
            }
        }
        for (module, items) in per_module {
            let Module { path, file, debug } = &self.modules[module as usize];
            let file = match file {
                Ok(file) => file,
                Err(reason) => {
                    for (i, offset) in &items {
                        user_out[*i] = unknown(Some(path), *offset, reason);
                    }
                    continue;
                }
            };
            let offsets: Vec<u64> = items.iter().map(|&(_, o)| o).collect();
            // The open file, by a path that stays this file (blazesym opens by path; its
            // cache checks device and inode, so a reused descriptor number is not mistaken).
            let mut result = Err(None);
            if let Some(debug) = debug {
                // Its debug file shares its virtual addresses, not its file offsets.
                // An offset no load segment maps (none in a sane file) is left to the module.
                let vaddrs: Option<Vec<u64>> = offsets.iter().map(|&o| debug.vaddr(o)).collect();
                if let Some(vaddrs) = vaddrs {
                    let src = Source::Elf(Elf::new(debug.path()));
                    result = symbolizer
                        .symbolize(&src, Input::VirtOffset(&vaddrs))
                        .map_err(Some);
                }
            }
            if result.is_err() {
                let src = Source::Elf(Elf::new(format!("/proc/self/fd/{}", file.as_raw_fd())));
                result = symbolizer
                    .symbolize(&src, Input::FileOffset(&offsets))
                    .map_err(Some);
            }
            if result.is_err() {
                // A separate debug file that blazesym found by itself but cannot use (a debug
                // link next to the module whose checksum does not match): the module's own
                // symbol tables still name its functions.
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
        }

        let kernel_out = if kernel.is_empty() {
            Vec::new()
        } else {
            let mut kept = self.kernel_symbolizer.borrow_mut();
            if kept.1.elapsed() >= KERNEL_REBUILD_EVERY {
                *kept = (new_blazesym(), std::time::Instant::now());
            }
            let symbolizer = &kept.0;
            let src = Source::Kernel(Kernel::default());
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
        (user_out, kernel_out)
    }
}

/// How long a kept blazesym symbolizer is used before it is made anew.
const REBUILD_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// How long kernel symbols are kept: code loaded since (modules, BPF programs) may be named
/// after a neighbour for at most this long.
const KERNEL_REBUILD_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

fn new_blazesym() -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        // NB: no debug directories of its own: separate debug files are found by
        // `debug_file::find`, in the target's root and checked against the module; blazesym
        // would look for them by the module's path and build id in the host's directories.
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .enable_code_info(true)
        // NB: with inlined functions on, `code_info` is the location in the outer (named)
        // function, not in the innermost inlined callee: name, file and line agree.
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build()
}

fn unknown(module: Option<&Path>, address: u64, reason: &str) -> Symbol {
    Symbol {
        function: None,
        module: module.map(|m| m.display().to_string()),
        address,
        file: None,
        line: None,
        unknown_reason: Some(reason.to_string()),
    }
}

fn to_symbol(result: Symbolized<'_>, module: Option<&Path>, address: u64) -> Symbol {
    match result {
        Symbolized::Sym(sym) => {
            let (file, line) = match &sym.code_info {
                Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
                None => (None, None),
            };
            Symbol {
                function: Some(sym.name.into_owned()),
                module: module.map(|m| m.display().to_string()),
                address,
                file,
                line,
                unknown_reason: None,
            }
        }
        Symbolized::Unknown(reason) => unknown(module, address, &reason.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_own_function_with_source_line() {
        let addr = marker_function_for_symbolizer_test as *const () as u64;
        let pid = std::process::id();
        let mut s = Symbolizer::new();
        let mut addrs = vec![addr, addr];
        s.normalize(pid, &mut addrs);
        assert_eq!(addrs.len(), 1, "deduplicated");
        assert!(s.user.contains_key(&(pid, addr)));
        let (user, kernel) = s.symbolize(&[(pid, addr)], &[]);
        assert!(kernel.is_empty());
        let sym = &user[0];
        assert!(
            sym.function
                .as_deref()
                .unwrap_or_default()
                .ends_with("marker_function_for_symbolizer_test"),
            "{sym:?}"
        );
        assert!(
            sym.module
                .as_deref()
                .unwrap_or_default()
                .contains("symbolizer"),
            "{sym:?}"
        );
        assert!(
            sym.file.as_deref().unwrap_or_default().ends_with("lib.rs"),
            "{sym:?}"
        );
        assert!(sym.line.is_some(), "{sym:?}");
    }

    #[test]
    fn gone_process_gives_unknown_with_reason() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mut s = Symbolizer::new();
        s.normalize(pid, &mut vec![0x401000]);
        let (user, _) = s.symbolize(&[(pid, 0x401000), (pid, 0x5000)], &[]);
        assert_eq!(
            user[0].unknown_reason.as_deref(),
            Some("process exited before symbolization")
        );
        assert_eq!(user[1].unknown_reason.as_deref(), Some("not normalized"));
        assert_eq!(s.stats().process_gone, 1);
    }

    #[test]
    fn unmapped_address_is_unknown_not_error() {
        let pid = std::process::id();
        let mut s = Symbolizer::new();
        s.normalize(pid, &mut vec![0x10]);
        let (user, _) = s.symbolize(&[(pid, 0x10)], &[]);
        assert!(user[0].function.is_none());
        assert!(user[0].unknown_reason.is_some());
    }
}
