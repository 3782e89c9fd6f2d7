//! Tests of [`super::PltTable`] on real libraries of this host and on libraries built here.

use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, SectionHeader, Sym};
use object::{Endianness, SymbolIndex};

use super::*;

/// `(file offset, address, size)` of each section, and the names of the `.rela.plt`
/// relocations by GOT slot (`None`: no symbol, as `IRELATIVE`), read with object's ELF API
/// from the relocations and the GOT layout, not by decoding the stubs as [`PltTable`] does.
struct Truth {
    sections: FxHashMap<String, (u64, u64, u64)>,
    slots: FxHashMap<u64, Option<String>>,
}

fn truth(path: &Path) -> Truth {
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<Endianness>::parse(&*data).unwrap();
    let endian = elf.endian();
    let sections = elf.elf_section_table();
    let mut out = Truth {
        sections: FxHashMap::default(),
        slots: FxHashMap::default(),
    };
    for section in sections.iter() {
        let name = String::from_utf8_lossy(sections.section_name(endian, section).unwrap());
        out.sections.insert(
            name.to_string(),
            (
                section.sh_offset(endian),
                section.sh_addr(endian),
                section.sh_size(endian),
            ),
        );
        if name != ".rela.plt" {
            continue;
        }
        let (relas, link) = section.rela(endian, &*data).unwrap().unwrap();
        let symbols = sections
            .symbol_table_by_index(endian, &*data, link)
            .unwrap();
        for rela in relas {
            let sym = rela.r_sym(endian, false);
            let name = (sym != 0).then(|| {
                let s = symbols.symbol(SymbolIndex(sym as usize)).unwrap();
                String::from_utf8_lossy(s.name(endian, symbols.strings()).unwrap()).into_owned()
            });
            out.slots.insert(rela.r_offset(endian), name);
        }
    }
    out
}

/// Checks every stub of `.plt` (entry k+1) and of `.plt.sec` (entry k) against the
/// relocation of the k-th GOT slot of `.rela.plt` (by address); returns the names seen. NB: the order of `.rela.plt` is not the order of the stubs (libc lists its
/// `IRELATIVE` relocations last).
fn check_against_got_plt(path: &Path) -> Vec<String> {
    let t = truth(path);
    let table = PltTable::read(&File::open(path).unwrap()).expect("a PLT table");
    let (plt, _, plt_size) = t.sections[".plt"];
    // The linker gives the stubs their GOT slots in order.
    let mut slots: Vec<u64> = t.slots.keys().copied().collect();
    slots.sort_unstable();
    // The resolver entry is no function's.
    for o in [plt, plt + 6, plt + 15] {
        assert_eq!(
            table.name(o).as_deref(),
            Some(PLT_MARKER),
            "{}",
            path.display()
        );
    }
    let mut named = Vec::new();
    assert_eq!(slots.len() as u64, plt_size / 16 - 1, "{}", path.display());
    for (k, slot) in slots.iter().enumerate() {
        let k = k as u64;
        let Some(Some(sym)) = t.slots.get(slot) else {
            continue;
        };
        let expected = format!("{sym}@plt");
        let mut at = vec![plt + 16 * (k + 1)];
        if let Some(&(sec, _, _)) = t.sections.get(".plt.sec") {
            at.push(sec + 16 * k);
        }
        for entry in at {
            for o in [entry, entry + 4, entry + 15] {
                assert_eq!(
                    table.name(o).as_deref(),
                    Some(expected.as_str()),
                    "{} +{o:#x}: GOT slot {slot:#x}",
                    path.display()
                );
            }
            named.push(expected.clone());
        }
    }
    // Outside the PLT: not a stub.
    assert_eq!(table.name(plt - 1), None);
    named
}

fn pyenv_root() -> PathBuf {
    std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"))
}

/// pyenv's libpython3.11 (`$PYENV_ROOT`, else /root/.pyenv) and Debian's: the library whose
/// stubs (`PyObject_Malloc@plt` among them) were named `_init`.
fn libpythons() -> Vec<PathBuf> {
    let root = pyenv_root();
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|v| v.path().join("lib/libpython3.11.so.1.0"))
        .collect();
    out.push("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0".into());
    out.retain(|p| p.is_file());
    out
}

#[test]
fn libpython_stubs_are_named_after_their_got_slot_relocation() {
    let libs = libpythons();
    assert!(
        !libs.is_empty(),
        "no libpython3.11.so.1.0 under pyenv or in /usr/lib/x86_64-linux-gnu"
    );
    for lib in libs {
        let named = check_against_got_plt(&lib);
        assert!(named.len() > 100, "{}: {named:?}", lib.display());
        // pyenv's builds call their own exported functions through the PLT (Debian's
        // `-fno-semantic-interposition` build does not).
        if lib.starts_with(pyenv_root()) {
            assert!(
                named.iter().any(|n| n == "PyObject_Malloc@plt"),
                "{}: {named:?}",
                lib.display()
            );
        }
    }
}

/// A library built here calling its imports, lazily (`.plt`) and with `-z ibtplt -z now`
/// (`.plt.sec`, 16-byte `.plt.got`).
#[test]
fn built_libraries_with_plt_and_plt_sec() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("calls.c");
    std::fs::write(
        &src,
        "extern int ext_a(int); extern int ext_b(int); extern int ext_c(int);\n\
         int f(int x) { return ext_a(x) + ext_b(x) * ext_c(x + 1); }\n",
    )
    .unwrap();
    for (name, flags) in [
        ("lazy.so", &[][..]),
        ("ibt.so", &["-Wl,-z,ibtplt", "-Wl,-z,now"][..]),
    ] {
        let lib = dir.path().join(name);
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src)
            .args(flags)
            .status()
            .expect("gcc runs");
        assert!(status.success());
        let mut named = check_against_got_plt(&lib);
        named.sort();
        named.dedup();
        assert_eq!(named, ["ext_a@plt", "ext_b@plt", "ext_c@plt"], "{name}");
        // `__cxa_finalize`, called through `.plt.got` (a GLOB_DAT slot), when there.
        let t = truth(&lib);
        let table = PltTable::read(&File::open(&lib).unwrap()).unwrap();
        if let Some(&(got, _, size)) = t.sections.get(".plt.got") {
            assert!(size > 0);
            assert_eq!(
                table.name(got).as_deref(),
                Some("__cxa_finalize@plt"),
                "{name}"
            );
        }
        if name == "ibt.so" {
            assert!(truth(&lib).sections.contains_key(".plt.sec"));
        }
    }
}

/// The whole path: an address of libc's PLT in this very process, normalized and symbolized,
/// is `NAME@plt`, never `_init`.
#[test]
fn symbolizer_names_a_plt_address_of_this_process() {
    let maps = crate::mapped::read_maps(std::process::id()).unwrap();
    let libc = maps
        .iter()
        .find(|m| m.is_exec() && m.file_path().ends_with("/libc.so.6"))
        .expect("libc is mapped");
    let path = PathBuf::from(libc.file_path());
    let t = truth(&path);
    let (plt, _, plt_size) = t.sections[".plt"];
    let mut slots: Vec<u64> = t.slots.keys().copied().collect();
    slots.sort_unstable();
    let (k, sym) = (0..slots.len())
        .find_map(|k| Some((k as u64, t.slots.get(&slots[k])?.clone()?)))
        .expect("a JUMP_SLOT stub");
    let at = |offset: u64| libc.start + offset - libc.offset;
    assert!(plt + plt_size <= libc.offset + (libc.end - libc.start));
    let addrs = [at(plt + 16 * (k + 1) + 4), at(plt + 2)];
    let pid = std::process::id();
    let mut s = crate::Symbolizer::new();
    s.normalize(pid, &mut addrs.to_vec());
    let (user, _) = s.symbolize(&[(pid, addrs[0]), (pid, addrs[1])], &[]);
    let expected = format!("{sym}@plt");
    assert_eq!(
        user[0].function.as_deref(),
        Some(expected.as_str()),
        "{user:?}"
    );
    assert_eq!(user[1].function.as_deref(), Some(PLT_MARKER), "{user:?}");
}

/// Garbage and cut files give no table or a table, never a panic.
#[test]
fn garbage_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::read(
        libpythons()
            .first()
            .cloned()
            .unwrap_or_else(|| "/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
    )
    .unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let path = dir.path().join("f");
    for round in 0..60 {
        let mut bytes = real[..(real.len() * round / 60).max(64)].to_vec();
        if round % 2 == 1 {
            for _ in 0..64 {
                let i = (rand() as usize) % bytes.len();
                bytes[i] = rand() as u8;
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        if let Some(table) = PltTable::read(&File::open(&path).unwrap()) {
            for o in 0..64 {
                let _ = table.name(rand() % bytes.len() as u64 + o);
            }
        }
    }
    let table = PltTable::read(&File::open(&path).unwrap());
    let _ = table.map(|t| t.named_entries());
}

/// The entry size: `sh_entsize` (8 or 16), else the default, kept only when it divides the
/// section; else 16; else none.
#[test]
fn entry_sizes_must_divide_the_section() {
    assert_eq!(entry_size(16, 16, 0x30), Some(16));
    assert_eq!(entry_size(8, 8, 0x18), Some(8));
    assert_eq!(entry_size(0, 8, 0x18), Some(8));
    assert_eq!(entry_size(0, 16, 0x40), Some(16));
    assert_eq!(entry_size(3, 16, 0x40), Some(16));
    // A declared 16 that does not divide; neither does 16.
    assert_eq!(entry_size(16, 8, 0x18), None);
    // A declared 8 that does not divide (nor 16).
    assert_eq!(entry_size(8, 8, 0x1c), None);
    assert_eq!(entry_size(0, 16, 0x24), None);
    assert_eq!(entry_size(0, 16, 0), Some(16));
}

/// A lazy-binding half names a `.rela.plt` index only in `.plt` and only when it is
/// `[endbr64] push IMM; jmp` from the entry's start; a `6a xx` byte reached from the middle
/// of an instruction (an entry cut at the wrong size) names nothing.
#[test]
fn push_index_only_from_an_entry_start_in_plt() {
    let ip = 0x1000;
    // push 5; jmp rel32; nop (a lazy `.plt` entry's second half, from its start).
    let lazy = [0x6a, 0x05, 0xe9, 0, 0, 0, 0, 0x90];
    assert_eq!(decode_x86_64(&lazy, ip, true), Some(Stub::Index(5)));
    assert_eq!(decode_x86_64(&lazy, ip, false), None);
    // endbr64; push 3; bnd jmp rel32; nop (`.plt` of an IBT build).
    let ibt = [
        0xf3, 0x0f, 0x1e, 0xfa, 0x6a, 0x03, 0xf2, 0xe9, 0, 0, 0, 0, 0x0f, 0x1f, 0x44, 0x00,
    ];
    assert_eq!(decode_x86_64(&ibt, ip, true), Some(Stub::Index(3)));
    // A push not followed by a jmp, after a no-op, or cut before its jmp.
    assert_eq!(decode_x86_64(&[0x6a, 0x05, 0x90, 0x90], ip, true), None);
    assert_eq!(
        decode_x86_64(&[0x90, 0x6a, 0x05, 0xe9, 0, 0, 0, 0], ip, true),
        None
    );
    assert_eq!(decode_x86_64(&[0x6a, 0x05], ip, true), None);
    // The second half of a 16-byte IBT `.plt.got` stub read as an 8-byte entry whose GOT
    // displacement ends in 0x6a: `6a 00` then garbage.
    let stub = [
        0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x6a, 0x00, 0x00, 0x00, 0x0f, 0x1f, 0x44, 0x00,
        0x00,
    ];
    for piece in stub.chunks(8) {
        assert!(
            !matches!(decode_x86_64(piece, ip, true), Some(Stub::Index(_))),
            "{piece:02x?}"
        );
    }
    assert_eq!(
        decode_x86_64(&stub, ip, false),
        Some(Stub::Slot(ip + 11 + 0x6a))
    );
}

/// Sets `sh_size` and `sh_entsize` of section `name` in the 64-bit little-endian ELF `data`.
fn patch_section(data: &mut [u8], name: &str, size: u64, entsize: u64) {
    let (shoff, index) = {
        let elf = ElfFile64::<Endianness>::parse(&*data).unwrap();
        let endian = elf.endian();
        let sections = elf.elf_section_table();
        let index = sections
            .iter()
            .position(|s| sections.section_name(endian, s).unwrap() == name.as_bytes())
            .unwrap();
        (elf.elf_header().e_shoff(endian), index)
    };
    let at = shoff as usize + index * 64;
    data[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
    data[at + 56..at + 64].copy_from_slice(&entsize.to_le_bytes());
}

/// A PLT section whose size no entry size divides gives no entries: its addresses are
/// `[plt]`, never a neighbour's name; the module's other PLT sections keep theirs.
#[test]
fn section_size_not_divided_by_its_entry_size_is_unnamed() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("calls.c");
    std::fs::write(
        &src,
        "extern int ext_a(int); extern int ext_b(int); extern int ext_c(int);\n\
         int f(int x) { return ext_a(x) + ext_b(x) * ext_c(x + 1); }\n",
    )
    .unwrap();
    let lib = dir.path().join("ibt.so");
    let status = std::process::Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .args(["-Wl,-z,ibtplt", "-Wl,-z,now"])
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let t = truth(&lib);
    let (sec, _, sec_size) = t.sections[".plt.sec"];
    let (plt, _, _) = t.sections[".plt"];
    let (got, _, got_size) = t.sections[".plt.got"];
    assert_eq!(sec_size, 0x30);
    assert_eq!(got_size, 0x10);
    let mut data = std::fs::read(&lib).unwrap();
    // `.plt.sec` 0x2c bytes of 16-byte entries (neither 16 nor the fallback divides), and
    // `.plt.got` declared with 16-byte entries but 0x18 bytes long.
    patch_section(&mut data, ".plt.sec", sec_size - 4, 16);
    patch_section(&mut data, ".plt.got", got_size + 8, 16);
    let patched = dir.path().join("patched.so");
    std::fs::write(&patched, &data).unwrap();
    let table = PltTable::read(&File::open(&patched).unwrap()).expect("a PLT table");
    for o in (sec..sec + sec_size - 4).chain(got..got + got_size + 8) {
        assert_eq!(table.name(o).as_deref(), Some(PLT_MARKER), "+{o:#x}");
    }
    // `.plt` still names its lazy-binding halves.
    assert!(
        table
            .name(plt + 16)
            .is_some_and(|n| n.starts_with("ext_") && n.ends_with("@plt")),
        "{:?}",
        table.name(plt + 16)
    );
}
