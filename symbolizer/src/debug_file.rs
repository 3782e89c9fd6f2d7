//! Separate debug files of a module a target maps, found the way GDB finds them, in the
//! target's root file system first, and used only when they belong to that very module.
//!
//! For a module file (already opened by [`crate::mapped`]) mapped at `path` in a process whose
//! root is `root` (`/proc/PID/root` for a container or chroot, none for spanprof's own), the
//! candidates are, under the target's root and then under spanprof's:
//! 1. `/usr/lib/debug/.build-id/ab/cdef….debug` (and `/lib/debug/…`), named by the module's GNU
//!    build id, used when its own build id is the same (Debian's and Fedora's `-dbg`/`-debuginfo`
//!    packages);
//! 2. the `.gnu_debuglink` name next to the module, in its `.debug/` directory and under
//!    `/usr/lib/debug/<the module's directory>/`, used when the CRC-32 of the whole candidate is
//!    the one the link records.
//!
//! A candidate that is not a regular file, or whose build id or CRC differs, is skipped: the
//! host's debug file of a container's library of the same path is another build's, and names
//! read from it would be wrong names. A path under the target's root is resolved inside that
//! root (`openat2` with `RESOLVE_IN_ROOT`): a container's symbolic link to `/etc/shadow` at a
//! debug file's path names the container's `/etc/shadow`, never the host's.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use object::{Object, ObjectSection};

/// The largest debug file whose CRC is computed (a debug link candidate is read whole, while
/// the process is looked at: a planted 2 GiB file stalled a session for 17 s).
pub const MAX_CRC_FILE: u64 = 256 << 20;

/// A module's separate debug file, open, and how to turn the module's file offsets into the
/// virtual addresses both files share.
#[derive(Debug)]
pub struct DebugFile {
    pub file: File,
    /// Found in spanprof's own root (not the target's, nor fetched from a server), owned by
    /// root and writable by no one else: its compressed sections need not be inflated to be
    /// checked ([`crate::elf_check::trusted`]).
    pub trusted: bool,
    /// blazesym may read its DWARF: it is trusted, or names no other file it would open by
    /// path ([`crate::elf_check::links_elsewhere`]).
    pub dwarf: bool,
    /// The module's `PT_LOAD`s: `(p_offset, p_vaddr, p_filesz)`.
    loads: Vec<(u64, u64, u64)>,
}

impl DebugFile {
    /// `debug`, a debug file found elsewhere (debuginfod) whose build id the caller checked,
    /// as the debug file of `module`; `None` when the module cannot be read.
    pub fn fetched(module: &File, debug: File) -> Option<DebugFile> {
        Some(DebugFile::new(debug, false, links(module)?.loads))
    }

    fn new(file: File, trusted: bool, loads: Vec<(u64, u64, u64)>) -> DebugFile {
        let dwarf = trusted || !crate::elf_check::links_elsewhere(&file);
        DebugFile {
            file,
            trusted,
            dwarf,
            loads,
        }
    }

    /// The virtual address of a file offset of the module, if a load segment maps it.
    pub fn vaddr(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|&&(off, _, size)| off <= offset && offset < off.saturating_add(size))
            .map(|&(off, vaddr, _)| vaddr.wrapping_add(offset - off))
    }

    /// A path that opens this very file (`/proc/self/fd/N`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// What a module says about its debug file.
struct Links {
    build_id: Option<Vec<u8>>,
    debug_link: Option<(String, u32)>,
    loads: Vec<(u64, u64, u64)>,
}

fn links(file: &File) -> Option<Links> {
    let cache = object::ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let loads = crate::python::detect::load_segments(elf.elf_program_headers(), endian);
    let build_id = elf
        .build_id()
        .ok()
        .flatten()
        .filter(|id| (8..=64).contains(&id.len()))
        .map(<[u8]>::to_vec);
    let debug_link = elf
        .section_by_name(".gnu_debuglink")
        .and_then(|s| s.data().ok())
        .and_then(parse_debug_link);
    Some(Links {
        build_id,
        debug_link,
        loads,
    })
}

/// `.gnu_debuglink`: a file name, NUL, padding to 4 bytes, a little-endian CRC-32.
fn parse_debug_link(data: &[u8]) -> Option<(String, u32)> {
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    // A bare file name: a link naming a directory is not followed.
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let at = (end + 4) & !3;
    let crc = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?);
    Some((name.to_string(), crc))
}

/// Opens `path` (absolute, as the target sees it) under `root` for reading if it is a regular
/// file, resolving it inside `root`: absolute symbolic links and `..` stay in it
/// (`RESOLVE_IN_ROOT`), and no `/proc` magic link is followed (`RESOLVE_NO_MAGICLINKS`).
/// Through `O_PATH` first, as [`open_regular`].
pub fn open_regular_in(root: &Path, path: &str) -> Option<File> {
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)
        .ok()?;
    let rel = std::ffi::CString::new(path.trim_start_matches('/')).ok()?;
    // SAFETY: a zeroed plain C struct (the kernel's `struct open_how`).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a valid directory descriptor, a NUL-terminated path and a
    // struct of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor openat2 just returned, owned by nothing else.
    let handle = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    reopen_regular(&handle)
}

/// Opens `path` for reading if it is a regular file (through `O_PATH` first: a FIFO there would
/// block, a device would act).
pub fn open_regular(path: &Path) -> Option<File> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()?;
    reopen_regular(&handle)
}

/// The file of the `O_PATH` descriptor `handle`, opened for reading if it is a regular file.
fn reopen_regular(handle: &File) -> Option<File> {
    if !handle.metadata().ok()?.is_file() {
        return None;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .ok()
}

fn crc32_of(file: &File) -> Option<u32> {
    if file.metadata().ok()?.len() > MAX_CRC_FILE {
        return None;
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hasher.finalize())
}

/// Debug-link candidates of a module, opened while its process lived; whether one belongs to
/// it (its CRC-32 is the link's) is found later ([`PendingLink::resolve`]): reading a candidate
/// whole is no work for the sampling loop.
#[derive(Debug)]
pub struct PendingLink {
    /// The candidates in the order they are tried, each with whether it is trusted (see
    /// [`DebugFile::trusted`]).
    candidates: Vec<(File, bool)>,
    crc: u32,
    loads: Vec<(u64, u64, u64)>,
}

impl PendingLink {
    /// The first candidate whose CRC is the link's, and how many were larger than
    /// [`MAX_CRC_FILE`] (not read).
    pub fn resolve(self) -> (Option<DebugFile>, usize) {
        let mut too_large = 0;
        for (file, trusted) in self.candidates {
            if file.metadata().is_ok_and(|m| m.len() > MAX_CRC_FILE) {
                too_large += 1;
                continue;
            }
            // NB: the module itself can be a candidate (a link naming itself): its CRC
            // differs from the link's, so it is skipped.
            if crc32_of(&file) == Some(self.crc) {
                return (Some(DebugFile::new(file, trusted, self.loads)), too_large);
            }
        }
        (None, too_large)
    }
}

/// A module's debug file as found while its process lived.
#[derive(Debug)]
pub enum Lookup {
    /// Found by its build id.
    Found(DebugFile),
    /// Debug-link candidates, to be checked by their CRC.
    Pending(PendingLink),
}

/// The separate debug file of `module` (open), mapped at `path` as the target names it, looked
/// for under `target_root` (a directory reaching the target's `/`, e.g. `/proc/PID/root`) and
/// then under spanprof's own root; `None` when there is none that belongs to it. Reads
/// debug-link candidates whole (at most [`MAX_CRC_FILE`] each): see [`lookup`].
pub fn find(module: &File, path: &str, target_root: Option<&Path>) -> Option<DebugFile> {
    match lookup(module, path, target_root)? {
        Lookup::Found(d) => Some(d),
        Lookup::Pending(p) => p.resolve().0,
    }
}

/// As [`find`], except that debug-link candidates are only opened: their CRCs are left to
/// [`PendingLink::resolve`].
pub fn lookup(module: &File, path: &str, target_root: Option<&Path>) -> Option<Lookup> {
    let own = links(module)?;
    // The target's root (resolved inside it), then spanprof's.
    let roots: Vec<Option<&Path>> = target_root
        .map(Some)
        .into_iter()
        .chain(std::iter::once(None))
        .collect();
    let open = |root: Option<&Path>, p: &str| match root {
        Some(root) => open_regular_in(root, p),
        None => open_regular(Path::new(p)),
    };
    let found = |file: File, root: Option<&Path>, loads| {
        let trusted = root.is_none() && crate::elf_check::trusted(&file);
        DebugFile::new(file, trusted, loads)
    };
    if let Some(id) = &own.build_id {
        let rel = format!(
            ".build-id/{}/{}.debug",
            crate::build_id::hex(&id[..1]),
            crate::build_id::hex(&id[1..])
        );
        for &root in &roots {
            for dir in ["/usr/lib/debug", "/lib/debug"] {
                let Some(file) = open(root, &format!("{dir}/{rel}")) else {
                    continue;
                };
                let same = links(&file).and_then(|l| l.build_id).as_ref() == Some(id);
                if same {
                    return Some(Lookup::Found(found(file, root, own.loads)));
                }
            }
        }
    }
    if let Some((name, crc)) = &own.debug_link {
        let dir = Path::new(path)
            .parent()
            .and_then(Path::to_str)
            .unwrap_or("/");
        let mut candidates = Vec::new();
        for &root in &roots {
            for c in [
                format!("{dir}/{name}"),
                format!("{dir}/.debug/{name}"),
                format!("/usr/lib/debug/{dir}/{name}"),
            ] {
                if let Some(file) = open(root, &c) {
                    let trusted = root.is_none() && crate::elf_check::trusted(&file);
                    candidates.push((file, trusted));
                }
            }
        }
        if !candidates.is_empty() {
            return Some(Lookup::Pending(PendingLink {
                candidates,
                crc: *crc,
                loads: own.loads,
            }));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_links_parse_and_refuse_paths() {
        let mut d = b"libc.so.6.debug\0".to_vec();
        d.extend_from_slice(&0x1234_5678u32.to_le_bytes());
        assert_eq!(
            parse_debug_link(&d),
            Some(("libc.so.6.debug".into(), 0x1234_5678))
        );
        let mut d = b"x\0\0\0".to_vec();
        d.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(parse_debug_link(&d), Some(("x".into(), 7)));
        assert_eq!(parse_debug_link(b"../etc/passwd\0\0\0\0\0\0\0"), None);
        assert_eq!(parse_debug_link(b"abc"), None);
        assert_eq!(parse_debug_link(b"a\0\0"), None);
    }

    /// A root's absolute and `..` links resolve inside it: a link to a file outside opens the
    /// root's own file of that path, or nothing.
    #[test]
    fn paths_under_a_root_stay_in_it() {
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "host's").unwrap();
        let root = host.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib/debug")).unwrap();
        std::fs::write(root.join("own"), "root's").unwrap();
        let read = |f: Option<File>| {
            f.map(|mut f| {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                s
            })
        };
        std::os::unix::fs::symlink(&secret, root.join("usr/lib/debug/abs")).unwrap();
        std::os::unix::fs::symlink("../../../../secret", root.join("usr/lib/debug/up")).unwrap();
        std::os::unix::fs::symlink("/own", root.join("usr/lib/debug/inside")).unwrap();
        assert_eq!(read(open_regular_in(&root, "/usr/lib/debug/abs")), None);
        assert_eq!(read(open_regular_in(&root, "/usr/lib/debug/up")), None);
        assert_eq!(
            read(open_regular_in(&root, "/usr/lib/debug/inside")).as_deref(),
            Some("root's")
        );
        // Outside a root, the same link leads out, as a path of spanprof's own does.
        assert_eq!(
            read(open_regular(&root.join("usr/lib/debug/abs"))).as_deref(),
            Some("host's")
        );
    }

    #[test]
    fn offsets_become_addresses_through_the_load_segments() {
        let d = DebugFile {
            file: File::open("/proc/self/exe").unwrap(),
            trusted: false,
            dwarf: true,
            loads: vec![(0, 0x400000, 0x1000), (0x1000, 0x401000, 0x2000)],
        };
        assert_eq!(d.vaddr(0x10), Some(0x400010));
        assert_eq!(d.vaddr(0x1800), Some(0x401800));
        assert_eq!(d.vaddr(0x3000), None);
    }

    /// This test binary is not stripped: if it has a build id, no debug file is found for it
    /// (none is installed), and nothing fails.
    #[test]
    fn a_module_without_a_debug_file_has_none() {
        let exe = File::open("/proc/self/exe").unwrap();
        assert!(find(&exe, "/nonexistent/dir/exe", None).is_none());
    }
}
