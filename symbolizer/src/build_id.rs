//! The identities of a module file that symbol servers and profiling back ends match debug
//! files by: its GNU build id and its `htlhash`.
//!
//! - The GNU build id is the `NT_GNU_BUILD_ID` note the linker wrote (`ld --build-id`, on by
//!   default in Debian's toolchain and most others); pprof's `build_id`, debuginfod,
//!   `/usr/lib/debug/.build-id/` and `PPROF_BINARY_PATH` look files up by it.
//! - `htlhash` is OpenTelemetry's id for any file, with a note or without (stripped of it, as in
//!   some container images): the first 16 bytes of the SHA-256 of the file's first 4096 bytes,
//!   its last 4096 bytes (they may overlap) and its length as a big-endian `u64`. The OTLP
//!   profiles specification recommends it on every mapping
//!   (`process.executable.build_id.htlhash`).
//!
//! Both are read once per module file, while a process maps it: two reads of a page each, the
//! ELF file and program headers and the note segments, whatever the file's size.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

/// The bytes hashed at each end of a file for its `htlhash`.
const HTL_PAGE: u64 = 4096;

/// A module file's identities, lower-case hex.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ModuleIds {
    /// The GNU build id (`NT_GNU_BUILD_ID`), when the file has one.
    pub gnu: Option<Box<str>>,
    /// OpenTelemetry's `htlhash` of the file (32 hex digits), when it could be read.
    pub htlhash: Option<Box<str>>,
}

impl ModuleIds {
    /// Reads the ids of the open module file; `None` when it has neither (unreadable).
    pub fn read(file: &File) -> Option<ModuleIds> {
        let ids = ModuleIds {
            gnu: gnu_build_id(file).map(|id| hex(&id).into()),
            htlhash: htlhash(file).map(|h| hex(&h).into()),
        };
        (ids.gnu.is_some() || ids.htlhash.is_some()).then_some(ids)
    }

    /// Whether neither is known.
    pub fn is_empty(&self) -> bool {
        self.gnu.is_none() && self.htlhash.is_none()
    }
}

/// The GNU build id of a 64-bit ELF file, 8 to 64 bytes (what linkers write: 16 for
/// md5/uuid, 20 for sha1); `None` when it has none or is not ELF. Reads the file header, the
/// program headers and the `PT_NOTE` segments only.
pub fn gnu_build_id(file: &File) -> Option<Vec<u8>> {
    use object::elf::{FileHeader64, NT_GNU_BUILD_ID, PT_NOTE};
    use object::read::elf::{FileHeader, ProgramHeader};
    let cache = object::ReadCache::new(file);
    let header = FileHeader64::<object::Endianness>::parse(&cache).ok()?;
    let endian = header.endian().ok()?;
    for ph in header.program_headers(endian, &cache).ok()? {
        if ph.p_type(endian) != PT_NOTE {
            continue;
        }
        let Ok(Some(mut notes)) = ph.notes(endian, &cache) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"GNU" && note.n_type(endian) == NT_GNU_BUILD_ID {
                let id = note.desc();
                return (8..=64).contains(&id.len()).then(|| id.to_vec());
            }
        }
    }
    None
}

/// The `htlhash` of a file: see the module's documentation.
pub fn htlhash(file: &File) -> Option<[u8; 16]> {
    let len = file.metadata().ok()?.len();
    let mut hasher = Sha256::new();
    let head = read_at(file, 0, len.min(HTL_PAGE))?;
    hasher.update(&head);
    let tail_start = len.saturating_sub(HTL_PAGE);
    let tail = read_at(file, tail_start, len - tail_start)?;
    hasher.update(&tail);
    hasher.update(len.to_be_bytes());
    let digest = hasher.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    Some(out)
}

/// Exactly `len` bytes (at most a page) at `offset`; `None` when the file is shorter now.
fn read_at(file: &File, offset: u64, len: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file(bytes: &[u8]) -> File {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("spanprof-htlhash-{}-{n}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        drop(f);
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    /// The hash input spelled out by hand, as the specification writes it.
    fn by_the_spec(bytes: &[u8]) -> String {
        let n = bytes.len();
        let mut input = bytes[..n.min(4096)].to_vec();
        input.extend_from_slice(&bytes[n.saturating_sub(4096)..]);
        input.extend_from_slice(&(n as u64).to_be_bytes());
        hex(&Sha256::digest(&input)[..16])
    }

    #[test]
    fn htlhash_hashes_both_ends_and_the_length() {
        // Short (the ends overlap), exactly a page, and long (the middle is not hashed).
        for n in [0usize, 10, 4096, 5000, 20000] {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let got = hex(&htlhash(&temp_file(&bytes)).unwrap());
            assert_eq!(got, by_the_spec(&bytes), "{n} bytes");
            assert_eq!(got.len(), 32);
        }
        // The middle of a long file does not count; its length does.
        let mut a: Vec<u8> = vec![1; 20000];
        let b = a.clone();
        a[10000] = 2;
        assert_eq!(
            htlhash(&temp_file(&a)).unwrap(),
            htlhash(&temp_file(&b)).unwrap()
        );
        assert_ne!(
            htlhash(&temp_file(&a[..19999])).unwrap(),
            htlhash(&temp_file(&b)).unwrap()
        );
    }

    #[test]
    fn the_gnu_build_id_of_this_test_binary_is_the_one_readelf_prints() {
        // NB: readelf's /proc/self/exe would be readelf.
        let path = std::env::current_exe().unwrap();
        let ids = ModuleIds::read(&File::open(&path).unwrap()).unwrap();
        let out = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("readelf (binutils) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let printed = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .map(str::to_owned);
        assert!(printed.is_some(), "readelf printed no build id:\n{text}");
        assert_eq!(ids.gnu.as_deref(), printed.as_deref(), "{text}");
        assert!(ids.htlhash.is_some());
        // Not ELF: no GNU id, still a hash.
        let ids = ModuleIds::read(&temp_file(b"not an elf file")).unwrap();
        assert_eq!(ids.gnu, None);
        assert!(ids.htlhash.is_some());
    }
}
