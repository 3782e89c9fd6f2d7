//! Opening the files a process maps, and no others.
//!
//! Everything spanprof reads about a target from its files (ELF symbols, unwind tables, CPython
//! detection, the OTEP 4947 TLS symbol, the C library the allocation probes attach to) goes
//! through [`open_mapped`]: the file of one line of `/proc/PID/maps`, identified by the
//! device and inode on that line. A file of the same path elsewhere (the host's libc for a
//! container's, a newer build installed since) is a different file, and names read from it
//! would be wrong names.
//!
//! `/proc/PID/maps` names a file as the *reader* resolves it: for a process in its own mount
//! namespace (a container after `pivot_root`) the path is the container's, for a chrooted
//! process in spanprof's namespace it is the host path under the chroot. So the file is tried,
//! in order, at:
//! 1. `/proc/PID/map_files/START-END`: exactly the mapped file (needs `CAP_CHECKPOINT_RESTORE`
//!    or `CAP_SYS_ADMIN`);
//! 2. `/proc/PID/root` + the path: the process's own view (containers);
//! 3. the path in spanprof's own view (chroots, whose paths are host paths);
//!
//! and a candidate counts only when it is a regular file with the line's device and inode. The
//! path is first opened with `O_PATH`, which opens nothing, then reopened through
//! `/proc/self/fd`: the path may since name a FIFO (whose opening would block) or a device
//! (whose opening may act).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// One file-backed line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `r`, `w`, `x` and `p`/`s`, as printed.
    pub perms: [u8; 4],
    /// File offset of `start`.
    pub offset: u64,
    /// The file's device, as `makedev(major, minor)` of the line (`st_dev`).
    pub dev: u64,
    /// The file's inode.
    pub inode: u64,
    /// The path as printed, with a `" (deleted)"` suffix when the file was unlinked.
    pub path: String,
}

impl Mapping {
    /// Executable.
    pub fn is_exec(&self) -> bool {
        self.perms[2] == b'x'
    }

    /// The path without a `" (deleted)"` suffix.
    pub fn file_path(&self) -> &str {
        self.path.strip_suffix(" (deleted)").unwrap_or(&self.path)
    }
}

/// Parses one line of `/proc/PID/maps`; `None` for anonymous and special mappings (`[heap]`,
/// `[vdso]`, …) and for lines that are not of the format.
pub fn parse_line(line: &str) -> Option<Mapping> {
    // NB: the path is the rest of the line: it may hold spaces.
    let mut it = line.splitn(6, ' ');
    let (start, end) = it.next()?.split_once('-')?;
    let perms: [u8; 4] = it.next()?.as_bytes().try_into().ok()?;
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let (major, minor) = it.next()?.split_once(':')?;
    let inode: u64 = it.next()?.parse().ok()?;
    let path = it.next()?.trim_start();
    if !path.starts_with('/') || inode == 0 {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset,
        dev: libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        path: path.to_string(),
    })
}

/// The file-backed mappings of a `/proc/PID/maps` text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// `/proc/PID/maps`, parsed.
pub fn read_maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    read_maps_text(pid).map(|t| parse_maps(&t))
}

/// `/proc/PID/maps` as text.
pub fn read_maps_text(pid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
}

/// The executable mappings of a `/proc/PID/maps` text that [`parse_line`] leaves out, backed by
/// no file (JIT code, the vDSO, `[uprobes]`): an address in one is code, though no module names
/// it. Sorted by start.
pub fn anonymous_exec_ranges(text: &str) -> Vec<AnonymousRange> {
    let mut ranges: Vec<AnonymousRange> = text
        .lines()
        .filter(|line| parse_line(line).is_none())
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let (start, end) = it.next()?.split_once('-')?;
            let perms = it.next()?.as_bytes();
            (perms.get(2) == Some(&b'x')).then_some(())?;
            // Offset, device, inode, then the name of a special mapping (`[vdso]`,
            // `[anon:my jit]`: spaces kept as one).
            let name: Vec<&str> = it.skip(3).collect();
            let name = name.join(" ");
            let name = if name.starts_with('[') {
                name.as_str()
            } else {
                ANONYMOUS
            };
            Some(AnonymousRange {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                name: name.into(),
            })
        })
        .collect();
    ranges.sort_unstable_by_key(|r| r.start);
    ranges
}

/// What an address in an anonymous executable mapping is shown in: the mapping's name when the
/// kernel gives one (`[vdso]`), else this.
pub const ANONYMOUS: &str = "[anonymous]";

/// An executable mapping backed by no file ([`anonymous_exec_ranges`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonymousRange {
    /// First address.
    pub start: u64,
    /// Address past the end.
    pub end: u64,
    /// `[vdso]` or another special mapping's name, else [`ANONYMOUS`].
    pub name: Box<str>,
}

/// How [`open_mapped`] reached a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `/proc/PID/map_files/START-END`.
    MapFiles,
    /// `/proc/PID/root` + the path.
    TargetRoot,
    /// The path in spanprof's own mount namespace (a chrooted target's host path).
    OwnRoot,
}

/// Why no candidate of [`open_mapped`] was the mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// A candidate was refused for want of permission (and none was the file).
    Denied,
    /// No candidate exists with the mapping's device and inode (replaced, deleted, or the
    /// process is gone).
    NotFound,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpenError::Denied => "permission denied",
            OpenError::NotFound => "the mapped file is not there any more",
        })
    }
}

/// Opens the file of mapping `m` of process `pid` for reading (see the module doc for where it
/// looks), and says how it was reached.
pub fn open_mapped(pid: u32, m: &Mapping) -> Result<(File, Via), OpenError> {
    let mut denied = false;
    let map_files = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let file = m.file_path();
    let in_root = PathBuf::from(format!("/proc/{pid}/root")).join(file.trim_start_matches('/'));
    let candidates = [
        (map_files, Via::MapFiles),
        (in_root, Via::TargetRoot),
        (PathBuf::from(file), Via::OwnRoot),
    ];
    for (path, via) in &candidates {
        match open_checked(path, Some((m.dev, m.inode))) {
            Ok(Some(f)) => return Ok((f, *via)),
            Ok(None) => {}
            Err(e) => denied |= is_denied(&e),
        }
    }
    // btrfs subvolumes, and overlayfs before Linux 6.8, show another device in the maps than
    // `stat` gives: the same inode is taken when its bytes are the mapped memory's.
    for (path, via) in &candidates {
        if let Ok(Some(f)) = open_checked(path, Some((u64::MAX, m.inode))) {
            if same_bytes(pid, m, &f) {
                return Ok((f, *via));
            }
        }
    }
    Err(if denied {
        OpenError::Denied
    } else {
        OpenError::NotFound
    })
}

/// Opens a path a process names as it sees it (`/usr/lib/debug/…`), through `/proc/PID/root`,
/// if it is a regular file.
pub fn open_in_root(pid: u32, path: &Path) -> Option<File> {
    let in_root =
        PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    open_checked(&in_root, None).ok().flatten()
}

/// `/proc/PID/root` when the process's root directory is not spanprof's (a container's or a
/// chroot's), for looking up files it names as it sees them.
pub fn foreign_root(pid: u32) -> Option<PathBuf> {
    let own = std::fs::metadata("/").ok()?;
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let theirs = std::fs::metadata(&root).ok()?;
    ((own.dev(), own.ino()) != (theirs.dev(), theirs.ino())).then_some(root)
}

/// Whether an I/O error is a refusal for want of permission.
pub fn is_denied(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

/// Whether the first bytes (up to a page) of mapping `m` of process `pid` are those of `file`
/// at the mapping's offset: a readable mapping of file content that is not written to (code,
/// read-only data) holds the file's bytes.
fn same_bytes(pid: u32, m: &Mapping, file: &File) -> bool {
    use crate::python::memory::{LiveMemory, ProcessMemory};
    use std::os::unix::fs::FileExt;
    if m.perms[0] != b'r' || m.perms[1] == b'w' {
        return false;
    }
    let len = (m.end.saturating_sub(m.start)).min(4096) as usize;
    if len < 64 {
        return false;
    }
    let (mut mem, mut disk) = (vec![0u8; len], vec![0u8; len]);
    LiveMemory::new(pid).read(m.start, &mut mem).is_ok()
        && file.read_exact_at(&mut disk, m.offset).is_ok()
        && mem == disk
}

/// Opens `path` for reading if it is a regular file (and, with `identity`, that very file: a
/// device of `u64::MAX` matches any device); `Ok(None)` when it is another file or none.
fn open_checked(path: &Path, identity: Option<(u64, u64)>) -> std::io::Result<Option<File>> {
    let handle = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
    {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = handle.metadata()?;
    let other =
        |(dev, ino): (u64, u64)| meta.ino() != ino || (dev != u64::MAX && meta.dev() != dev);
    if !meta.is_file() || identity.is_some_and(other) {
        return Ok(None);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_executable_ranges_are_the_unbacked_ones() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234 /usr/bin/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234 /usr/bin/my app
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000010000 rwxp 00000000 00:00 0 
7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]
7fff00003000-7fff00004000 r-xp 00000000 00:00 0 [anon:my jit]
7fff00004000-7fff00005000 r-xp 00000000 00:0f 99 /memfd:jit (deleted)
garbage line
";
        let ranges = anonymous_exec_ranges(text);
        let ranges: Vec<(u64, u64, &str)> =
            ranges.iter().map(|r| (r.start, r.end, &*r.name)).collect();
        assert_eq!(
            ranges,
            [
                (0x7f00_0000_0000, 0x7f00_0001_0000, ANONYMOUS),
                (0x7fff_0000_0000, 0x7fff_0000_2000, "[vdso]"),
                (0x7fff_0000_3000, 0x7fff_0000_4000, "[anon:my jit]"),
            ]
        );
        // The file-backed executable mappings (a memfd's too) are modules, not among them.
        assert_eq!(parse_maps(text).iter().filter(|m| m.is_exec()).count(), 2);
    }

    #[test]
    fn lines_parse_with_device_inode_and_spaces() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 123 /usr/bin/python3.11
7f00-8f00 rw-p 00000000 00:00 0 
7ffd-7ffe rw-p 00000000 00:00 0                          [stack]
7f0000001000-7f0000002000 r-xp 00001000 103:0a 456       /opt/my dir/libpython3.9.so.1.0 (deleted)
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].dev, libc::makedev(0xfe, 1));
        assert!(!maps[0].is_exec());
        assert_eq!(maps[1].path, "/opt/my dir/libpython3.9.so.1.0 (deleted)");
        assert_eq!(maps[1].file_path(), "/opt/my dir/libpython3.9.so.1.0");
        assert_eq!(maps[1].dev, libc::makedev(0x103, 0x0a));
        assert_eq!((maps[1].inode, maps[1].offset), (456, 0x1000));
        assert!(maps[1].is_exec());
        assert!(parse_line("garbage").is_none());
        assert!(parse_line("1-2 r-xp zz 00:00 1 /x").is_none());
    }

    #[test]
    fn own_executable_is_opened_and_another_inode_is_not() {
        let pid = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = read_maps(pid).unwrap();
        let m = maps
            .iter()
            .find(|m| Path::new(m.file_path()) == exe)
            .expect("own executable mapped");
        let (file, _) = open_mapped(pid, m).unwrap();
        let meta = file.metadata().unwrap();
        assert_eq!((meta.dev(), meta.ino()), (m.dev, m.inode));
        // Another device, the same inode and bytes (btrfs subvolumes, older overlayfs): opened.
        let mut moved = m.clone();
        moved.dev ^= 1;
        let (file, _) = open_mapped(pid, &moved).unwrap();
        assert_eq!(file.metadata().unwrap().ino(), m.inode);
        // The same path with another identity (a file replaced since) is not opened.
        let mut other = m.clone();
        other.inode ^= 1;
        other.start = 1;
        other.end = 2;
        assert_eq!(open_mapped(pid, &other).unwrap_err(), OpenError::NotFound);
    }

    #[test]
    fn a_fifo_at_the_path_is_not_opened() {
        let dir = std::env::temp_dir().join(format!("spanprof-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Would block for ever if opened for reading.
        assert!(open_checked(&fifo, None).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
