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
//! read from it would be wrong names.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use object::{Object, ObjectSection};

/// The largest debug file whose CRC is computed (a debug link candidate is read whole).
const MAX_CRC_FILE: u64 = 2 << 30;

/// A module's separate debug file, open, and how to turn the module's file offsets into the
/// virtual addresses both files share.
#[derive(Debug)]
pub struct DebugFile {
    pub file: File,
    /// The module's `PT_LOAD`s: `(p_offset, p_vaddr, p_filesz)`.
    loads: Vec<(u64, u64, u64)>,
}

impl DebugFile {
    /// `debug`, a debug file found elsewhere (debuginfod) whose build id the caller checked,
    /// as the debug file of `module`; `None` when the module cannot be read.
    pub fn fetched(module: &File, debug: File) -> Option<DebugFile> {
        Some(DebugFile {
            file: debug,
            loads: links(module)?.loads,
        })
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

/// Opens `path` for reading if it is a regular file (through `O_PATH` first: a FIFO there would
/// block, a device would act).
pub fn open_regular(path: &Path) -> Option<File> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()?;
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

/// The separate debug file of `module` (open), mapped at `path` as the target names it, looked
/// for under `target_root` (a directory reaching the target's `/`, e.g. `/proc/PID/root`) and
/// then under spanprof's own root; `None` when there is none that belongs to it.
pub fn find(module: &File, path: &str, target_root: Option<&Path>) -> Option<DebugFile> {
    let own = links(module)?;
    let roots: Vec<PathBuf> = target_root
        .map(Path::to_path_buf)
        .into_iter()
        .chain(std::iter::once(PathBuf::from("/")))
        .collect();
    let inside = |root: &Path, p: &str| root.join(p.trim_start_matches('/'));
    if let Some(id) = &own.build_id {
        let rel = format!(
            ".build-id/{}/{}.debug",
            crate::build_id::hex(&id[..1]),
            crate::build_id::hex(&id[1..])
        );
        for root in &roots {
            for dir in ["usr/lib/debug", "lib/debug"] {
                let Some(file) = open_regular(&inside(root, &format!("{dir}/{rel}"))) else {
                    continue;
                };
                let same = links(&file).and_then(|l| l.build_id).as_ref() == Some(id);
                if same {
                    return Some(DebugFile {
                        file,
                        loads: own.loads,
                    });
                }
            }
        }
    }
    if let Some((name, crc)) = &own.debug_link {
        let dir = Path::new(path)
            .parent()
            .and_then(Path::to_str)
            .unwrap_or("/");
        for root in &roots {
            let candidates = [
                format!("{dir}/{name}"),
                format!("{dir}/.debug/{name}"),
                format!("/usr/lib/debug/{dir}/{name}"),
            ];
            for c in candidates {
                let Some(file) = open_regular(&inside(root, &c)) else {
                    continue;
                };
                // NB: the module itself can be a candidate (a link naming itself): its CRC
                // differs from the link's, so it is skipped.
                if crc32_of(&file) == Some(*crc) {
                    return Some(DebugFile {
                        file,
                        loads: own.loads,
                    });
                }
            }
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

    #[test]
    fn offsets_become_addresses_through_the_load_segments() {
        let d = DebugFile {
            file: File::open("/proc/self/exe").unwrap(),
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
