//! What a module or debug file's headers make blazesym allocate, checked before it is given the
//! file: a target's files are untrusted input.
//!
//! blazesym decompresses a compressed section (`SHF_COMPRESSED`, zlib) into a vector made with
//! the capacity its header claims, then reads the stream to its end: a header claiming 1 TiB
//! aborted spanprof (the allocation failed), and a few MB of zlib that inflate to gigabytes took
//! them. [`check`] reads the section headers of the opened file, refuses a section claiming
//! over [`MAX_SECTION`] and a file whose sections claim over [`MAX_RATIO`] times their
//! compressed bytes or [`MAX_FILE_INFLATED`] in all, and inflates each zlib stream into a small
//! reused buffer to check that it ends within its claim: what blazesym will allocate is then
//! bounded by the claims.
//!
//! NB: the file is checked as it is now; its owner can still rewrite it in place before
//! blazesym maps it (spanprof opened it, so it is the same file, not the same bytes).

use std::fs::File;
use std::io::Read;

use object::{Object, ObjectSection};

/// The largest decompressed size a section may claim.
pub const MAX_SECTION: u64 = 512 << 20;
/// The most a file's compressed sections may claim together per compressed byte, past
/// [`RATIO_SLACK`] (zlib's own limit is about 1032 to 1; the 273 debug files of this machine's
/// Debian packages claim at most 25 to 1, one section of them 83 to 1).
pub const MAX_RATIO: u64 = 64;
/// What the compressed sections of a file may claim whatever their ratio.
pub const RATIO_SLACK: u64 = 1 << 20;
/// The most all the compressed sections of one file may claim together.
pub const MAX_FILE_INFLATED: u64 = 1 << 30;
/// Compressed sections looked at in one file, at most.
const MAX_SECTIONS: usize = 4096;

/// Whether `file` (found in spanprof's own root) is one only root can have made: owned by root,
/// writable by no one else. Its streams are not inflated to be checked (about 20 ms for the C
/// library's debug file); its claims still are.
pub fn trusted(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata()
        .is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0)
}

/// Whether `file` names other files blazesym would open by path if it read its DWARF: a
/// `.gnu_debuglink` (looked for beside the file's real path, which for a container's module is
/// a host path), a `.gnu_debugaltlink` or a `.debug_sup`. Such a file's own DWARF is read only
/// when it is [`trusted`]; its symbol tables always are.
pub fn links_elsewhere(file: &File) -> bool {
    let cache = object::ReadCache::new(file);
    // A file whose headers do not parse here may still parse in blazesym: assume the worst.
    let Ok(obj) = object::File::parse(&cache) else {
        return true;
    };
    obj.sections().take(MAX_SECTIONS).any(|s| {
        matches!(
            s.name(),
            Ok(".gnu_debuglink" | ".gnu_debugaltlink" | ".debug_sup")
        )
    })
}

/// Checks `file`'s compressed sections (see the module), inflating their streams unless
/// `trusted` ([`trusted`]); `Err` says why it is refused. A file without the ELF magic passes
/// (blazesym refuses it itself); one with it must be a 64-bit little-endian ELF file whose
/// headers parse here: blazesym checks little more than the magic and the class, so a file
/// the `object` crate reads otherwise (another byte order, a bad version or header size)
/// would show it other sections than the ones checked.
pub fn check(file: &File, trusted: bool) -> Result<(), String> {
    let file_len = file.metadata().map_err(|e| e.to_string())?.len();
    let cache = object::ReadCache::new(file);
    let ident = object::ReadRef::read_bytes_at(&cache, 0, 16).unwrap_or(&[]);
    if !ident.starts_with(b"\x7fELF") {
        return Ok(());
    }
    // EI_CLASS 2 (64-bit), EI_DATA 1 (little-endian), EI_VERSION 1.
    if ident[4..7] != [2, 1, 1] {
        return Err("not a 64-bit little-endian ELF file of version 1".to_string());
    }
    let header = object::ReadRef::read_bytes_at(&cache, 0, 64).unwrap_or(&[]);
    // e_shentsize: blazesym reads section headers as 64-byte records whatever this says (a
    // file without section headers may leave it 0).
    if header.len() < 64 {
        return Err("its ELF header is cut short".to_string());
    }
    let u16_at = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]);
    let has_sections = u16_at(60) != 0 || header[40..48] != [0; 8];
    if has_sections && u16_at(58) != 64 {
        return Err("its section header size is not 64".to_string());
    }
    let Ok(obj) = object::File::parse(&cache) else {
        return Err("its ELF headers do not parse".to_string());
    };
    // (name, offset, compressed size, claimed size) of the zlib sections.
    let mut zlib = Vec::new();
    let (mut claimed, mut compressed) = (0u64, 0u64);
    for (n, section) in obj.sections().enumerate() {
        if n >= MAX_SECTIONS {
            return Err(format!("more than {MAX_SECTIONS} sections"));
        }
        let Ok(range) = section.compressed_file_range() else {
            continue;
        };
        if range.format == object::CompressionFormat::None {
            continue;
        }
        let name = section.name().unwrap_or("?").to_string();
        let size = range.uncompressed_size;
        if size > MAX_SECTION {
            return Err(format!(
                "section {name} claims {size} bytes decompressed (at most {MAX_SECTION})"
            ));
        }
        if range.offset.saturating_add(range.compressed_size) > file_len {
            return Err(format!("section {name} ends past the end of the file"));
        }
        claimed += size;
        compressed += range.compressed_size;
        // blazesym is built with zlib only: it refuses the others itself.
        if range.format == object::CompressionFormat::Zlib {
            zlib.push((name, range.offset, range.compressed_size, size));
        }
    }
    if claimed > MAX_FILE_INFLATED
        || claimed
            > compressed
                .saturating_mul(MAX_RATIO)
                .saturating_add(RATIO_SLACK)
    {
        return Err(format!(
            "its compressed sections claim {claimed} bytes decompressed from {compressed} (at \
             most {MAX_RATIO} to 1, and {MAX_FILE_INFLATED} bytes)"
        ));
    }
    if trusted {
        return Ok(());
    }
    let mut buf = vec![0u8; 64 << 10];
    for (name, offset, len, size) in zlib {
        let data = object::ReadRef::read_bytes_at(&cache, offset, len)
            .map_err(|()| format!("section {name}: its compressed bytes cannot be read"))?;
        // blazesym inflates the bytes after the section's header as one zlib stream: the same
        // bytes, read to their end within the claim.
        let mut stream = flate2::read::ZlibDecoder::new(data).take(size + 1);
        let mut inflated = 0u64;
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => inflated += k as u64,
                // A stream blazesym cannot inflate either: it fails there, without allocating
                // past the claim.
                Err(_) => break,
            }
        }
        if inflated > size {
            return Err(format!(
                "section {name} inflates past the {size} bytes it claims"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// [`check`] of a file of `bytes`.
    fn run_on(bytes: Vec<u8>) -> Result<(), String> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        check(&f, false)
    }

    /// A minimal ELF64 file with one `SHF_COMPRESSED` section whose `Elf64_Chdr` claims
    /// `claim` bytes and whose data is `zlib`.
    fn elf_with_compressed(claim: u64, zlib: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&claim.to_le_bytes());
        data.extend_from_slice(&1u64.to_le_bytes()); // ch_addralign
        data.extend_from_slice(zlib);
        let shstrtab = b"\0.debug_info\0.shstrtab\0";
        let data_off = 64u64;
        let strtab_off = data_off + data.len() as u64;
        let sh_off = (strtab_off + shstrtab.len() as u64).next_multiple_of(8);
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2; // 64-bit
        out[5] = 1; // little endian
        out[6] = 1;
        out[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        out[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[40..48].copy_from_slice(&sh_off.to_le_bytes());
        out[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        out[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        out[60..62].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
        out[62..64].copy_from_slice(&2u16.to_le_bytes()); // e_shstrndx
        out.extend_from_slice(&data);
        out.extend_from_slice(shstrtab);
        out.resize(sh_off as usize, 0);
        let section = |name: u32, ty: u32, flags: u64, off: u64, size: u64| {
            let mut s = vec![0u8; 64];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4..8].copy_from_slice(&ty.to_le_bytes());
            s[8..16].copy_from_slice(&flags.to_le_bytes());
            s[24..32].copy_from_slice(&off.to_le_bytes());
            s[32..40].copy_from_slice(&size.to_le_bytes());
            s[48..56].copy_from_slice(&1u64.to_le_bytes());
            s
        };
        out.extend(vec![0u8; 64]);
        out.extend(section(1, 1, 0x800, data_off, data.len() as u64)); // SHF_COMPRESSED
        out.extend(section(13, 3, 0, strtab_off, shstrtab.len() as u64));
        out
    }

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn honest_claims_pass_and_lying_or_huge_ones_are_refused() {
        // Numbers in no order: about 2 to 1, as DWARF compresses.
        let text: Vec<u8> = (0..20_000u64)
            .flat_map(|i| format!("{} ", i * 7919 % 100_003).into_bytes())
            .collect();
        let z = zlib(&text);
        assert_eq!(run_on(elf_with_compressed(text.len() as u64, &z)), Ok(()));
        // 1 TiB claimed.
        let err = run_on(elf_with_compressed(1 << 40, &z)).unwrap_err();
        assert!(err.contains("claims 1099511627776 bytes"), "{err}");
        // Over 64 to 1 (and past the slack).
        let zeros = vec![0u8; 32 << 20];
        let bomb = zlib(&zeros);
        let err = run_on(elf_with_compressed(zeros.len() as u64, &bomb)).unwrap_err();
        assert!(err.contains("at most 64 to 1"), "{err}");
        // Under the slack, any ratio.
        let small = vec![0u8; 512 << 10];
        assert_eq!(
            run_on(elf_with_compressed(small.len() as u64, &zlib(&small))),
            Ok(())
        );
        // A stream longer than its claim.
        let err = run_on(elf_with_compressed(1000, &z)).unwrap_err();
        assert!(err.contains("inflates past the 1000 bytes"), "{err}");
        // Not ELF at all: blazesym's to refuse.
        assert_eq!(run_on(b"not an ELF file".to_vec()), Ok(()));
        // ELF that blazesym would read otherwise than the `object` crate: refused.
        let honest = elf_with_compressed(text.len() as u64, &z);
        let mut big_endian = honest.clone();
        big_endian[5] = 2;
        assert!(run_on(big_endian).unwrap_err().contains("little-endian"));
        let mut bad_version = honest.clone();
        bad_version[6] = 0;
        assert!(run_on(bad_version).is_err());
        let mut bad_entry = honest.clone();
        bad_entry[58] = 65;
        assert!(run_on(bad_entry).unwrap_err().contains("header size"));
        let mut truncated = honest;
        truncated.truncate(40);
        assert!(run_on(truncated).is_err());
    }
}
