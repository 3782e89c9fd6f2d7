//! Names of PLT stubs: `NAME@plt`, as perf names them, instead of the nearest symbol before
//! them (`_init`, in `.init` just before `.plt`, which no symbol table covers).
//!
//! A module's stubs are in `.plt` (entry 0 the lazy resolver, then one 16-byte entry per
//! `.rela.plt` relocation), `.plt.sec` (IBT or `-z ibtplt` builds: one 16-byte entry per
//! `.rela.plt` relocation, where calls go, `.plt` then holding the lazy-binding halves) and
//! `.plt.got` (8 or 16 bytes: functions whose GOT slot is in `.got`, `GLOB_DAT`). On x86_64
//! each entry is decoded: its `jmp *SLOT(%rip)` names the GOT slot, whose dynamic relocation
//! (`JUMP_SLOT`, `GLOB_DAT`) names the symbol; a lazy-binding half (`push INDEX`) names
//! relocation INDEX of `.rela.plt`. An `IRELATIVE` slot (an ifunc called inside its own
//! library) is named after the ifunc symbol at its resolver's address. A stub that maps to no
//! symbol (the resolver entry, padding, other architectures) is [`PLT_MARKER`], never a
//! neighbour's name.
//!
//! The module file is untrusted: sections are read with bounded sizes, and a file that does
//! not parse gives no table (the address is then named as any other).

use std::fs::File;

use object::elf::{
    EM_X86_64, R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT, SHF_EXECINSTR,
    SHT_PROGBITS, SHT_RELA, STT_GNU_IFUNC,
};
use object::read::elf::{ElfFile64, FileHeader, Rela, SectionHeader, Sym};
use object::{Endianness, ReadCache, SectionIndex, SymbolIndex};
use rustc_hash::FxHashMap;

/// The name of a PLT entry that cannot be tied to a symbol.
pub const PLT_MARKER: &str = "[plt]";

/// Largest PLT section read (64k entries of 16 bytes).
const MAX_PLT_SECTION: u64 = 1 << 20;
/// Largest relocation or dynamic symbol section read.
const MAX_TABLE_SECTION: u64 = 64 << 20;

/// One PLT entry, in file offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: Option<Box<str>>,
}

/// The PLT sections of one module and the names of their entries.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PltTable {
    /// `[start, end)` file offsets of the PLT sections.
    sections: Vec<(u64, u64)>,
    /// Sorted by start.
    entries: Vec<Entry>,
}

impl PltTable {
    /// Reads the table of `file`; `None` when it has no PLT section or does not parse as a
    /// 64-bit ELF file.
    pub fn read(file: &File) -> Option<Self> {
        let cache = ReadCache::new(file);
        let table = read_elf(&cache);
        table.filter(|t| !t.sections.is_empty())
    }

    /// The name of the stub at file offset `offset`: `NAME@plt`, or [`PLT_MARKER`] for a PLT
    /// entry of no known symbol; `None` when the offset is in no PLT section.
    pub fn name(&self, offset: u64) -> Option<String> {
        let in_plt = self
            .sections
            .iter()
            .any(|&(s, e)| s <= offset && offset < e);
        if !in_plt {
            return None;
        }
        let i = self.entries.partition_point(|e| e.start <= offset);
        let named = i
            .checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .filter(|e| offset < e.end)
            .and_then(|e| e.name.as_deref());
        Some(match named {
            Some(name) => format!("{name}@plt"),
            None => PLT_MARKER.to_owned(),
        })
    }

    /// How many entries have a name.
    pub fn named_entries(&self) -> usize {
        self.entries.iter().filter(|e| e.name.is_some()).count()
    }
}

/// A bounded section read.
fn section_bytes<'a>(
    cache: &'a ReadCache<&File>,
    endian: Endianness,
    section: &object::elf::SectionHeader64<Endianness>,
    max: u64,
) -> Option<&'a [u8]> {
    if section.sh_size(endian) > max {
        return None;
    }
    section.data(endian, cache).ok()
}

fn read_elf(cache: &ReadCache<&File>) -> Option<PltTable> {
    let elf = ElfFile64::<Endianness, _>::parse(cache).ok()?;
    let endian = elf.endian();
    let header = elf.elf_header();
    let sections = elf.elf_section_table();
    let x86_64 = header.e_machine(endian) == EM_X86_64;

    // The dynamic symbols' names, by index, read once per symbol table.
    let mut symtabs: FxHashMap<SectionIndex, Option<object::read::elf::SymbolTable<_, _>>> =
        FxHashMap::default();
    let mut symbol_name = |link: SectionIndex, index: u32| -> Option<Box<str>> {
        let table = symtabs.entry(link).or_insert_with(|| {
            let section = sections.section(link).ok()?;
            if section.sh_size(endian) > MAX_TABLE_SECTION {
                return None;
            }
            sections.symbol_table_by_index(endian, cache, link).ok()
        });
        let table = table.as_ref()?;
        let sym = table.symbol(SymbolIndex(index as usize)).ok()?;
        let name = sym.name(endian, table.strings()).ok()?;
        (!name.is_empty()).then(|| String::from_utf8_lossy(name).into())
    };

    // GOT slot → symbol name, and `.rela.plt` in order (slot addresses).
    let mut slots: FxHashMap<u64, Option<Box<str>>> = FxHashMap::default();
    let mut rela_plt: Vec<u64> = Vec::new();
    let mut ifunc_slots: Vec<(u64, u64)> = Vec::new();
    for section in sections.iter() {
        if section.sh_type(endian) != SHT_RELA || section.sh_size(endian) > MAX_TABLE_SECTION {
            continue;
        }
        let Ok(Some((relas, link))) = section.rela(endian, cache) else {
            continue;
        };
        let is_plt = sections.section_name(endian, section).ok() == Some(b".rela.plt");
        for rela in relas {
            let slot = rela.r_offset(endian);
            if is_plt {
                rela_plt.push(slot);
            }
            if !x86_64 {
                continue;
            }
            match rela.r_type(endian, false) {
                R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT => {
                    let name = symbol_name(link, rela.r_sym(endian, false));
                    slots.entry(slot).or_insert(name);
                }
                R_X86_64_IRELATIVE => {
                    ifunc_slots.push((slot, rela.r_addend(endian) as u64));
                }
                _ => {}
            }
        }
    }
    if !ifunc_slots.is_empty() {
        let ifuncs = ifunc_names(sections, endian, cache);
        for (slot, resolver) in ifunc_slots {
            slots
                .entry(slot)
                .or_insert_with(|| ifuncs.get(&resolver).cloned());
        }
    }

    let mut table = PltTable::default();
    for section in sections.iter() {
        let Ok(name) = sections.section_name(endian, section) else {
            continue;
        };
        let default_size = match name {
            b".plt" | b".plt.sec" => 16,
            b".plt.got" => 8,
            _ => continue,
        };
        if section.sh_type(endian) != SHT_PROGBITS
            || section.sh_flags(endian) & u64::from(SHF_EXECINSTR) == 0
        {
            continue;
        }
        let (offset, addr, size) = (
            section.sh_offset(endian),
            section.sh_addr(endian),
            section.sh_size(endian),
        );
        let Some(end) = offset.checked_add(size) else {
            continue;
        };
        table.sections.push((offset, end));
        if !x86_64 {
            continue;
        }
        let Some(bytes) = section_bytes(cache, endian, section, MAX_PLT_SECTION) else {
            continue;
        };
        let Some(entry_size) = entry_size(section.sh_entsize(endian), default_size, size) else {
            // No entry size cuts the section into whole entries: its stubs stay `[plt]`
            // rather than be read from the middle of an instruction.
            continue;
        };
        // Only `.plt` has lazy-binding halves (`push INDEX`).
        let push_index = name == b".plt";
        for (k, code) in bytes.chunks(entry_size as usize).enumerate() {
            let at = k as u64 * entry_size;
            let name = match decode_x86_64(code, addr.wrapping_add(at), push_index) {
                Some(Stub::Slot(slot)) => slots.get(&slot).cloned().flatten(),
                Some(Stub::Index(i)) => usize::try_from(i)
                    .ok()
                    .and_then(|i| rela_plt.get(i))
                    .and_then(|slot| slots.get(slot).cloned().flatten()),
                None => None,
            };
            table.entries.push(Entry {
                start: offset + at,
                end: offset + at + code.len() as u64,
                name,
            });
        }
    }
    table.entries.sort_unstable_by_key(|e| e.start);
    Some(table)
}

/// The size of a PLT section's entries: its `sh_entsize` (when 8 or 16), else the section's
/// default, kept only when it divides the section's `size`; else 16 when that divides it;
/// else `None` (no entry starts can be trusted).
fn entry_size(sh_entsize: u64, default_size: u64, size: u64) -> Option<u64> {
    let declared = match sh_entsize {
        8 | 16 => sh_entsize,
        _ => default_size,
    };
    [declared, 16].into_iter().find(|&n| size.is_multiple_of(n))
}

/// Resolver address → name of the ifunc symbols (`STT_GNU_IFUNC`) of the dynamic symbol
/// table, the shortest name (then the first in order) where several share a resolver.
fn ifunc_names<'a, R: object::ReadRef<'a>>(
    sections: &object::read::elf::SectionTable<'a, object::elf::FileHeader64<Endianness>, R>,
    endian: Endianness,
    cache: R,
) -> FxHashMap<u64, Box<str>> {
    let mut out: FxHashMap<u64, Box<str>> = FxHashMap::default();
    for (index, section) in sections.enumerate() {
        if section.sh_type(endian) != object::elf::SHT_DYNSYM
            || section.sh_size(endian) > MAX_TABLE_SECTION
        {
            continue;
        }
        let Ok(table) = sections.symbol_table_by_index(endian, cache, index) else {
            continue;
        };
        for sym in table.iter() {
            if sym.st_type() != STT_GNU_IFUNC {
                continue;
            }
            let Ok(name) = sym.name(endian, table.strings()) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let name: Box<str> = String::from_utf8_lossy(name).into();
            let keep = out
                .entry(sym.st_value(endian))
                .or_insert_with(|| name.clone());
            if name.len() < keep.len() {
                *keep = name;
            }
        }
    }
    out
}

/// What an x86_64 PLT entry does first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stub {
    /// `jmp *SLOT(%rip)`: the GOT slot's address.
    Slot(u64),
    /// `push INDEX` (a lazy-binding stub): the `.rela.plt` index.
    Index(u64),
}

/// Decodes the first instructions of the PLT entry `code` at address `ip`: `jmp *SLOT(%rip)`
/// past `endbr64` and no-ops; with `push_index` (`.plt` only), a lazy-binding half, which
/// must be `[endbr64] push IMM` from the entry's start, then a `jmp`. `None` for anything
/// else (the resolver entry pushes a GOT word), so that a stray `6a xx` byte inside another
/// instruction never reads as a `.rela.plt` index.
fn decode_x86_64(code: &[u8], ip: u64, push_index: bool) -> Option<Stub> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut next = || {
        if !decoder.can_decode() {
            return None;
        }
        let ins = decoder.decode();
        (!ins.is_invalid()).then_some(ins)
    };
    // Whether every instruction so far was `endbr64` (at most one).
    let mut from_start = true;
    for k in 0..3 {
        let ins = next()?;
        match ins.mnemonic() {
            Mnemonic::Endbr64 => from_start &= k == 0,
            Mnemonic::Nop => from_start = false,
            Mnemonic::Jmp if ins.op0_kind() == OpKind::Memory && ins.is_ip_rel_memory_operand() => {
                return Some(Stub::Slot(ins.ip_rel_memory_address()));
            }
            Mnemonic::Push
                if push_index
                    && from_start
                    && matches!(
                        ins.op0_kind(),
                        OpKind::Immediate32to64 | OpKind::Immediate8to64
                    ) =>
            {
                let index = ins.immediate(0);
                return (next()?.mnemonic() == Mnemonic::Jmp).then_some(Stub::Index(index));
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
#[path = "plt_tests.rs"]
mod tests;
