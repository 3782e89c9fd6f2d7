//! Finding a process's CPython: the module that holds the interpreter, its exact version, and
//! the run-time address of `_PyRuntime`.
//!
//! The interpreter lives either in `libpython3.X.so` (pyenv's `--enable-shared` builds) or in
//! the executable itself (Debian's `/usr/bin/python3.11`, static builds). Either way
//! `_PyRuntime` is a dynamic symbol (it is part of the C API's data), so stripped binaries work.
//! The version comes from the `Py_Version` symbol (= `PY_VERSION_HEX`, 3.11+), else from the
//! `PY_VERSION` string (`"3.9.18"`) in `.rodata`, else from the file name (minor only).

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use blazesym::inspect::source::{Elf, Source};
use blazesym::inspect::Inspector;

use super::offsets::{self, PyOffsets};
use crate::mapped::{open_mapped, read_maps, Mapping, OpenError};

/// A CPython version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PyVersion {
    /// 3.
    pub major: u8,
    /// 8 for 3.8.x.
    pub minor: u8,
    /// The micro version, when it could be found (not from a file name).
    pub patch: Option<u8>,
}

impl std::fmt::Display for PyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.patch {
            Some(p) => write!(f, "{}.{}.{}", self.major, self.minor, p),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

/// Where [`PyVersion`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSource {
    /// The `Py_Version` symbol (3.11+).
    PyVersionSymbol,
    /// A `"3.X.Y"` string in `.rodata`, agreeing with the file name when it names a version.
    RodataString,
    /// The module's file name, e.g. `libpython3.9.so.1.0`: no patch level.
    FileName,
}

/// A CPython process, as found by [`detect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonProcess {
    /// The process.
    pub pid: u32,
    /// Interpreter version.
    pub version: PyVersion,
    /// How the version was found.
    pub version_source: VersionSource,
    /// The module holding the interpreter, as named in `/proc/PID/maps`.
    pub module: PathBuf,
    /// Run-time address minus link-time address for `module`.
    pub load_bias: u64,
    /// Run-time address of `_PyRuntime`.
    pub runtime_addr: u64,
    /// Run-time address of `PyCode_Type`, to validate code objects, when exported.
    pub code_type_addr: Option<u64>,
    /// Run-time address of `PyUnicode_Type`, to validate strings, when exported.
    pub unicode_type_addr: Option<u64>,
    /// Run-time address of `_Py_HashSecret` (exported), to hash a str that has not cached its
    /// hash yet.
    pub hash_secret_addr: Option<u64>,
    /// Run-time addresses of `_PyHamt_BitmapNode_Type`, `_PyHamt_ArrayNode_Type` and
    /// `_PyHamt_CollisionNode_Type`, when the symbol table has them (not in stripped builds).
    pub hamt_types: [Option<u64>; 3],
    /// Run-time address ranges `[start, end)` of the interpreter loop
    /// (`_PyEval_EvalFrameDefault` and its `.cold` part when the symbol table has it): a native
    /// frame there is running Python frames.
    pub eval_ranges: Vec<(u64, u64)>,
    /// A debug build (`Py_REF_DEBUG`: `_Py_RefTotal` before 3.12, `_Py_GetGlobalRefTotal`
    /// after), whose objects and frames are laid out differently.
    pub debug_build: bool,
    /// The interpreter loop keeps a frame pointer (`push %rbp; mov %rsp,%rbp` prologue), so a
    /// frame-pointer walk of the native stack gets through it. pyenv's and Debian's builds
    /// (`-O3`, 3.8–3.13) do not.
    pub frame_pointers: bool,
}

impl PythonProcess {
    /// The offsets table for this version, if it is supported.
    pub fn offsets(&self) -> Option<&'static PyOffsets> {
        offsets::for_version(self.version.major, self.version.minor)
    }
}

/// Why a process's CPython could not be found.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// `/proc/PID/maps` could not be read: the process is gone or not ours to read.
    #[error("cannot read memory map of process {pid}")]
    Maps {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    /// No mapped module exports `_PyRuntime`.
    #[error("process {0} has no module exporting _PyRuntime")]
    NotPython(u32),
    /// The interpreter module is not a readable 64-bit little-endian ELF file.
    #[error("cannot parse {path}: {reason}")]
    Elf { path: PathBuf, reason: &'static str },
    /// Reading the interpreter module failed.
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A module that may be the interpreter could not be opened: permission denied.
    #[error(
        "cannot open {path} to look for the python interpreter: permission denied (spanprof \
         needs CAP_SYS_PTRACE for another user's process, and CAP_DAC_READ_SEARCH for files in \
         directories its user cannot search)"
    )]
    Denied { path: PathBuf },
    /// A CPython older than any spanprof reads (no `_PyRuntime`: 3.6 and before).
    #[error(
        "python {version} ({path}): not supported, profiled as native code only (spanprof reads \
         the Python frames of GIL builds of CPython 3.8 to 3.{newest})",
        newest = offsets::NEWEST_MINOR
    )]
    TooOld { version: PyVersion, path: PathBuf },
    /// The version could be found neither in symbols, strings nor the file name.
    #[error("cannot tell the python version of {0}")]
    UnknownVersion(PathBuf),
}

/// `(major, minor)` from a file name like `libpython3.11.so.1.0`, `python3.9` or
/// `libpython3.13t.so`.
fn version_from_file_name(path: &Path) -> Option<(u8, u8)> {
    let name = path.file_name()?.to_str()?;
    let rest = name
        .strip_prefix("lib")
        .unwrap_or(name)
        .strip_prefix("python")?;
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The few ELF facts needed: PT_LOAD segments and where `.rodata` is.
struct ElfInfo {
    /// (p_offset, p_vaddr, p_filesz) of each PT_LOAD.
    loads: Vec<(u64, u64, u64)>,
    /// (file offset, size) of `.rodata`.
    rodata: Option<(u64, u64)>,
}

fn read_at(file: &File, path: &Path, off: u64, len: usize) -> Result<Vec<u8>, DetectError> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, off)
        .map_err(|source| DetectError::Io {
            path: path.to_owned(),
            source,
        })?;
    Ok(buf)
}

fn le_u16(b: &[u8], at: usize) -> u64 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u64
}
fn le_u32(b: &[u8], at: usize) -> u64 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default()) as u64
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn parse_elf(file: &File, path: &Path) -> Result<ElfInfo, DetectError> {
    let bad = |reason| DetectError::Elf {
        path: path.to_owned(),
        reason,
    };
    let eh = read_at(file, path, 0, 64)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(bad("not a 64-bit little-endian elf file"));
    }
    let (phoff, phentsize, phnum) = (le_u64(&eh, 32), le_u16(&eh, 54), le_u16(&eh, 56));
    let (shoff, shentsize, shnum, shstrndx) = (
        le_u64(&eh, 40),
        le_u16(&eh, 58),
        le_u16(&eh, 60),
        le_u16(&eh, 62),
    );
    if phentsize < 56 || phnum > 256 || (shnum > 0 && shentsize < 64) || shnum > 4096 {
        return Err(bad("implausible elf header"));
    }
    let ph = read_at(file, path, phoff, (phentsize * phnum) as usize)?;
    let loads = (0..phnum as usize)
        .map(|i| &ph[i * phentsize as usize..])
        .filter(|p| le_u32(p, 0) == 1) // PT_LOAD
        .map(|p| (le_u64(p, 8), le_u64(p, 16), le_u64(p, 32)))
        .collect();
    let mut rodata = None;
    if shnum > 0 && shstrndx < shnum {
        let sh = read_at(file, path, shoff, (shentsize * shnum) as usize)?;
        let shdr = |i: usize| &sh[i * shentsize as usize..];
        let strtab = shdr(shstrndx as usize);
        let (str_off, str_size) = (le_u64(strtab, 24), le_u64(strtab, 32).min(1 << 20));
        let names = read_at(file, path, str_off, str_size as usize)?;
        for i in 0..shnum as usize {
            let s = shdr(i);
            let name_at = le_u32(s, 0) as usize;
            if names.get(name_at..name_at + 8) == Some(b".rodata\0") {
                rodata = Some((le_u64(s, 24), le_u64(s, 32)));
            }
        }
    }
    Ok(ElfInfo { loads, rodata })
}

/// Finds `"M.m.p\0"` strings not preceded by a digit or dot, e.g. `PY_VERSION`, which the linker
/// may have merged into the tail of a longer string such as an install prefix.
fn versions_in(bytes: &[u8]) -> Vec<(u8, u8, u8)> {
    let mut found = Vec::new();
    for (i, w) in bytes.windows(2).enumerate() {
        if w[0] != b'3' || w[1] != b'.' {
            continue;
        }
        if i > 0 && (bytes[i - 1].is_ascii_digit() || bytes[i - 1] == b'.') {
            continue;
        }
        let tail = &bytes[i..bytes.len().min(i + 9)];
        let Some(end) = tail.iter().position(|&b| b == 0) else {
            continue;
        };
        let Ok(s) = std::str::from_utf8(&tail[..end]) else {
            continue;
        };
        let parts: Vec<_> = s.split('.').collect();
        if let [ma, mi, pa] = parts[..] {
            if let (Ok(ma), Ok(mi), Ok(pa)) = (ma.parse(), mi.parse(), pa.parse()) {
                found.push((ma, mi, pa));
            }
        }
    }
    found
}

struct Symbols {
    /// `_PyRuntime` (3.7+).
    runtime: Option<u64>,
    /// `Py_Initialize`: the module is a CPython, whatever its version.
    initialize: bool,
    /// A `Py_REF_DEBUG` symbol.
    debug: bool,
    py_version: Option<u64>,
    code_type: Option<u64>,
    unicode_type: Option<u64>,
    hash_secret: Option<u64>,
    hamt_types: [Option<u64>; 3],
    /// Link-time `[start, end)` of the interpreter loop's parts.
    eval: Vec<(u64, u64)>,
    /// File offset of `_PyEval_EvalFrameDefault`.
    eval_file_offset: Option<u64>,
}

/// The interpreter loop, and the part GCC splits off it when compiled with `-freorder-blocks`.
const EVAL_FUNCTIONS: [&str; 2] = ["_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault.cold"];

/// The CPython symbols of the ELF file at `path`: `Ok(None)` when it has none of them, `Err`
/// when it could not be read (not remembered as a file without CPython).
fn lookup_symbols(inspector: &Inspector, path: &Path) -> Result<Option<Symbols>, ()> {
    let mut elf = Elf::new(path);
    // NB: debug symbols exclude variables in blazesym's inspector; the wanted names are in
    // `.dynsym`, or `.symtab` (the HAMT types; absent from stripped builds).
    elf.debug_syms = false;
    let names = [
        "_PyRuntime",
        "Py_Version",
        "PyCode_Type",
        "PyUnicode_Type",
        EVAL_FUNCTIONS[0],
        EVAL_FUNCTIONS[1],
        "_PyHamt_BitmapNode_Type",
        "_PyHamt_ArrayNode_Type",
        "_PyHamt_CollisionNode_Type",
        "Py_Initialize",
        "_Py_RefTotal",
        "_Py_GetGlobalRefTotal",
        "_Py_HashSecret",
    ];
    let found = inspector
        .lookup(&Source::Elf(elf), &names)
        .map_err(|_| ())?;
    let first = |i: usize| found.get(i).and_then(|v| v.first()).map(|s| s.addr);
    let eval = (4..6)
        .filter_map(|i| found.get(i).and_then(|v| v.first()))
        .filter_map(|s| Some((s.addr, s.addr.checked_add(s.size? as u64)?)))
        .collect();
    let eval_file_offset = found
        .get(4)
        .and_then(|v| v.first())
        .and_then(|s| s.file_offset);
    let runtime = first(0);
    let initialize = first(9).is_some();
    if runtime.is_none() && !initialize {
        return Ok(None);
    }
    Ok(Some(Symbols {
        runtime,
        initialize,
        debug: first(10).is_some() || first(11).is_some(),
        py_version: found
            .get(1)
            .and_then(|v| v.first())
            .and_then(|s| s.file_offset),
        code_type: first(2),
        unicode_type: first(3),
        hash_secret: first(12),
        hamt_types: [first(6), first(7), first(8)],
        eval,
        eval_file_offset,
    }))
}

/// Whether process `pid`'s executable names a `libpython*` library among the ones it needs
/// (`DT_NEEDED`): a program the dynamic loader is still starting then has its interpreter mapped
/// within ms, and is worth looking at again that soon. False when unknown (gone, unreadable,
/// static, not ELF). Every read is bounded.
pub fn needs_libpython(pid: u32) -> bool {
    let Ok(maps) = read_maps(pid) else {
        return false;
    };
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let Some(mapping) = maps.iter().find(|m| exe.as_os_str() == m.path.as_str()) else {
        return false;
    };
    let Ok((file, _)) = open_mapped(pid, mapping) else {
        return false;
    };
    needed_names(&file).is_some_and(|names| names.iter().any(|n| n.starts_with(b"libpython")))
}

/// The `DT_NEEDED` names of a 64-bit little-endian ELF file; `None` when it cannot be read.
fn needed_names(file: &File) -> Option<Vec<Vec<u8>>> {
    let path = Path::new("");
    let eh = read_at(file, path, 0, 64).ok()?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (le_u64(&eh, 32), le_u16(&eh, 54), le_u16(&eh, 56));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let ph = read_at(file, path, phoff, (phentsize * phnum) as usize).ok()?;
    let headers = (0..phnum as usize).map(|i| &ph[i * phentsize as usize..]);
    // (p_type, p_offset, p_vaddr, p_filesz)
    let headers: Vec<(u64, u64, u64, u64)> = headers
        .map(|p| (le_u32(p, 0), le_u64(p, 8), le_u64(p, 16), le_u64(p, 32)))
        .collect();
    let &(_, dyn_off, _, dyn_size) = headers.iter().find(|h| h.0 == 2)?; // PT_DYNAMIC
    let dynamic = read_at(file, path, dyn_off, dyn_size.min(64 << 10) as usize).ok()?;
    let (mut strtab, mut strsz, mut needed) = (None, None, Vec::new());
    for entry in dynamic.chunks_exact(16) {
        match (le_u64(entry, 0), le_u64(entry, 8)) {
            (0, _) => break, // DT_NULL
            (1, at) => needed.push(at),
            (5, vaddr) => strtab = Some(vaddr),
            (10, size) => strsz = Some(size),
            _ => {}
        }
    }
    // The string table's address to its file offset, through the load segment holding it.
    let (strtab, strsz) = (strtab?, strsz?.min(1 << 20));
    let &(_, p_offset, p_vaddr, _) = headers.iter().find(|&&(t, _, vaddr, size)| {
        t == 1 && vaddr <= strtab && strtab < vaddr.saturating_add(size)
    })?;
    let strings = read_at(file, path, strtab - p_vaddr + p_offset, strsz as usize).ok()?;
    Some(
        needed
            .into_iter()
            .filter_map(|at| {
                let rest = strings.get(usize::try_from(at).ok()?..)?;
                let end = rest.iter().position(|&b| b == 0)?;
                Some(rest[..end].to_vec())
            })
            .collect(),
    )
}

/// Files read and found without CPython's symbols (not those that could not be read), so that
/// a process looked at again (its loader may still be mapping libpython) does not have the same
/// files' symbol tables read again: blazesym sorts a file's whole symbol table to look names
/// up, 25 ms for spanprof's own executable, and a process that is not Python is looked at up
/// to ten times.
#[derive(Debug, Default)]
pub struct NotPython {
    files: HashSet<FileKey>,
}

/// A file's identity and version. The change time too: user space cannot set it, while
/// packages, `tar` and `cp -p` keep a file's modification time (an inode reused for another
/// file of the same size and time would otherwise match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    fn of(file: &File) -> Option<FileKey> {
        let m = file.metadata().ok()?;
        Some(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl NotPython {
    /// Files remembered at most; then the set starts again (a daemon sees many binaries).
    const MAX_FILES: usize = 4096;

    /// How many files are remembered.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Remembers `file` as one without CPython (for tests: a real CPython marked so is skipped).
    #[cfg(test)]
    pub(crate) fn remember(&mut self, file: &File) {
        self.insert(FileKey::of(file).expect("fstat"));
    }

    fn insert(&mut self, key: FileKey) {
        if self.files.len() >= Self::MAX_FILES {
            self.files.clear();
        }
        self.files.insert(key);
    }
}

/// Finds the CPython interpreter of process `pid`. Its files are read through
/// [`crate::mapped::open_mapped`]: the files the process maps, whatever its root.
pub fn detect(pid: u32) -> Result<PythonProcess, DetectError> {
    detect_with(pid, &mut NotPython::default())
}

/// [`detect`], skipping the files `seen` holds and adding those found without CPython.
pub fn detect_with(pid: u32, seen: &mut NotPython) -> Result<PythonProcess, DetectError> {
    let maps = read_maps(pid).map_err(|source| DetectError::Maps { pid, source })?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();

    // Candidates in order: libpython, then the executable, then anything named python*; the
    // first mapping of each file.
    let name = |m: &Mapping| {
        let p = m.file_path();
        p.rsplit('/').next().unwrap_or(p).to_owned()
    };
    let libs = maps.iter().filter(|m| name(m).starts_with("libpython"));
    let exes = maps.iter().filter(|m| {
        exe.as_deref()
            .is_some_and(|e| e.as_os_str() == m.path.as_str())
    });
    let others = maps.iter().filter(|m| name(m).starts_with("python"));
    let mut candidates: Vec<&Mapping> = Vec::new();
    for m in libs.chain(exes).chain(others) {
        if !candidates.iter().any(|c| c.path == m.path) {
            candidates.push(m);
        }
    }

    let inspector = Inspector::new();
    for mapping in candidates {
        let module = Path::new(mapping.file_path());
        let (file, _) = match open_mapped(pid, mapping) {
            Ok(opened) => opened,
            // NB: an unreadable candidate is said, not skipped: else a process spanprof may
            // not read looks like one without Python.
            Err(OpenError::Denied) => {
                return Err(DetectError::Denied {
                    path: module.to_owned(),
                })
            }
            Err(OpenError::NotFound) => continue,
        };
        let key = FileKey::of(&file);
        if key.is_some_and(|k| seen.files.contains(&k)) {
            continue;
        }
        // blazesym opens by path: the open file's, which stays this very file.
        let on_disk = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let syms = match lookup_symbols(&inspector, &on_disk) {
            Ok(Some(syms)) => syms,
            Ok(None) => {
                if let Some(k) = key {
                    seen.insert(k);
                }
                continue;
            }
            Err(()) => continue,
        };
        let elf = parse_elf(&file, module)?;
        let load_bias = load_bias(&maps, &mapping.path, &elf.loads).ok_or(DetectError::Elf {
            path: module.to_owned(),
            reason: "no mapping matches a load segment",
        })?;
        let (version, version_source) = find_version(&file, module, module, &syms, &elf)?;
        let Some(runtime) = syms.runtime else {
            // A CPython all the same (it exports Py_Initialize): said, not skipped as native.
            debug_assert!(syms.initialize);
            return Err(DetectError::TooOld {
                version,
                path: module.to_owned(),
            });
        };
        // The interpreter loop's cold part (GCC's `.cold` split, where Debian's PGO builds run
        // much of the loop): from the symbol table, else a separate debug file of the same
        // build, else the unwind tables ([`super::cold`]).
        let mut eval = syms.eval.clone();
        let mut hamt_types = syms.hamt_types;
        if eval.len() == 1 {
            let root = crate::mapped::foreign_root(pid);
            let debug = crate::debug_file::find(&file, mapping.file_path(), root.as_deref())
                .and_then(|d| lookup_symbols(&inspector, &d.path()).ok().flatten());
            match debug {
                Some(d) if d.eval.len() > 1 => {
                    eval = d.eval;
                    if hamt_types.iter().all(Option::is_none) {
                        hamt_types = d.hamt_types;
                    }
                }
                _ => {
                    let cache = object::ReadCache::new(&file);
                    if let Some(cold) = super::cold::cold_part(&cache, eval[0]) {
                        eval.push(cold);
                    }
                }
            }
        }
        let frame_pointers = syms
            .eval_file_offset
            .and_then(|off| read_at(&file, module, off, 8).ok())
            .is_some_and(|code| has_frame_pointer_prologue(&code));
        return Ok(PythonProcess {
            pid,
            version,
            version_source,
            module: module.to_owned(),
            load_bias,
            runtime_addr: runtime.wrapping_add(load_bias),
            code_type_addr: syms.code_type.map(|a| a.wrapping_add(load_bias)),
            unicode_type_addr: syms.unicode_type.map(|a| a.wrapping_add(load_bias)),
            hash_secret_addr: syms.hash_secret.map(|a| a.wrapping_add(load_bias)),
            hamt_types: hamt_types.map(|t| t.map(|a| a.wrapping_add(load_bias))),
            eval_ranges: eval
                .iter()
                .map(|&(s, e)| (s.wrapping_add(load_bias), e.wrapping_add(load_bias)))
                .collect(),
            debug_build: syms.debug,
            frame_pointers,
        });
    }
    Err(DetectError::NotPython(pid))
}

/// Whether x86_64 code starts with `[endbr64] push %rbp; mov %rsp,%rbp`.
fn has_frame_pointer_prologue(code: &[u8]) -> bool {
    let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
    code.starts_with(&[0x55, 0x48, 0x89, 0xe5])
}

/// The `(p_offset, p_vaddr, p_filesz)` of each PT_LOAD of a 64-bit ELF file's program headers,
/// as [`load_bias`] takes them.
pub(crate) fn load_segments(
    headers: &[object::elf::ProgramHeader64<object::Endianness>],
    endian: object::Endianness,
) -> Vec<(u64, u64, u64)> {
    use object::read::elf::ProgramHeader;
    headers
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian)))
        .collect()
}

/// Run-time minus link-time addresses of `module`, from its lowest mapping and its PT_LOADs
/// `(p_offset, p_vaddr, p_filesz)`.
pub(crate) fn load_bias(maps: &[Mapping], module: &str, loads: &[(u64, u64, u64)]) -> Option<u64> {
    let first = maps
        .iter()
        .filter(|m| m.path == module)
        .min_by_key(|m| m.offset)?;
    let page = |x: u64| x & !0xfff;
    let &(p_offset, p_vaddr, _) = loads.iter().find(|&&(off, _, size)| {
        page(off) <= first.offset && first.offset < off.saturating_add(size.max(1))
    })?;
    let vaddr = page(p_vaddr).wrapping_add(first.offset - page(p_offset));
    Some(first.start.wrapping_sub(vaddr))
}

fn find_version(
    file: &File,
    path: &Path,
    module: &Path,
    syms: &Symbols,
    elf: &ElfInfo,
) -> Result<(PyVersion, VersionSource), DetectError> {
    if let Some(off) = syms.py_version {
        let b = read_at(file, path, off, 4)?;
        let hex = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let version = PyVersion {
            major: (hex >> 24) as u8,
            minor: (hex >> 16) as u8,
            patch: Some((hex >> 8) as u8),
        };
        return Ok((version, VersionSource::PyVersionSymbol));
    }
    let from_name = version_from_file_name(module);
    if let Some((off, size)) = elf.rodata {
        // `.rodata` of libpython is ~1 MiB; refuse absurd sizes from a corrupted header.
        if size <= 64 << 20 {
            let bytes = read_at(file, path, off, size as usize)?;
            let found = versions_in(&bytes);
            let pick = found.iter().find(|&&(ma, mi, _)| match from_name {
                Some(n) => n == (ma, mi),
                None => ma == 3 && (6..=30).contains(&mi),
            });
            if let Some(&(major, minor, patch)) = pick {
                let version = PyVersion {
                    major,
                    minor,
                    patch: Some(patch),
                };
                return Ok((version, VersionSource::RodataString));
            }
        }
    }
    match from_name {
        Some((major, minor)) => Ok((
            PyVersion {
                major,
                minor,
                patch: None,
            },
            VersionSource::FileName,
        )),
        None => Err(DetectError::UnknownVersion(module.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn needed_names_are_read_from_the_dynamic_section() {
        // This test binary needs the C library, and no libpython.
        let me = std::fs::File::open("/proc/self/exe").unwrap();
        let names = super::needed_names(&me).expect("a dynamic ELF");
        assert!(
            names.iter().any(|n| n.starts_with(b"libc.so")),
            "{:?}",
            names
                .iter()
                .map(|n| String::from_utf8_lossy(n))
                .collect::<Vec<_>>()
        );
        assert!(!names.iter().any(|n| n.starts_with(b"libpython")));
        // Not ELF, or cut short: unknown, not a panic.
        let dir = std::env::temp_dir().join(format!("spanprof-needed-{}", std::process::id()));
        std::fs::write(&dir, b"\x7fELF\x02\x01").unwrap();
        assert!(super::needed_names(&std::fs::File::open(&dir).unwrap()).is_none());
        let _ = std::fs::remove_file(&dir);
        assert!(!super::needs_libpython(u32::MAX));
    }

    use super::*;
    use crate::mapped::parse_maps;

    #[test]
    fn file_names_give_minor_versions() {
        assert_eq!(
            version_from_file_name(Path::new("/x/libpython3.10.so.1.0")),
            Some((3, 10))
        );
        assert_eq!(
            version_from_file_name(Path::new("/usr/bin/python3.11")),
            Some((3, 11))
        );
        assert_eq!(
            version_from_file_name(Path::new("libpython3.13t.so")),
            Some((3, 13))
        );
        assert_eq!(version_from_file_name(Path::new("/usr/bin/python3")), None);
    }

    #[test]
    fn rodata_versions_include_tail_merged_strings() {
        let data = b"x\0/root/.pyenv/versions/3.8.18\0lib\x003.9.1x\0v13.8.2\0";
        assert_eq!(versions_in(data), vec![(3, 8, 18)]);
    }

    #[test]
    fn frame_pointer_prologues() {
        assert!(has_frame_pointer_prologue(&[0x55, 0x48, 0x89, 0xe5, 0x41]));
        assert!(has_frame_pointer_prologue(&[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5
        ]));
        // pyenv's -O3 build: push %r15; push %r14.
        assert!(!has_frame_pointer_prologue(&[0x41, 0x57, 0x41, 0x56]));
        assert!(!has_frame_pointer_prologue(&[0x55, 0x53]));
    }

    #[test]
    fn bias_of_pie_and_non_pie() {
        let maps = parse_maps("7f0000000000-7f0000001000 r--p 00000000 fe:01 1 /l.so\n");
        assert_eq!(
            load_bias(&maps, "/l.so", &[(0, 0, 0x1000)]),
            Some(0x7f00_0000_0000)
        );
        let maps = parse_maps("400000-401000 r--p 00000000 fe:01 1 /exe\n");
        assert_eq!(load_bias(&maps, "/exe", &[(0, 0x400000, 0x1000)]), Some(0));
    }
}
