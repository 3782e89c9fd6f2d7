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
