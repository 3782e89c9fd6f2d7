//! Which greenlet a thread runs, for reading green-thread locals (eventlet's and gevent's,
//! which OSProfiler's `threading.local` becomes under their monkey patching) from the kernel.
//!
//! # Overview
//! greenlet 2 and later keep each thread's state in a C++ thread-local of their extension
//! module (`greenlet/_greenlet.*.so`): `g_thread_state_global`, a pointer to a `ThreadState`
//! whose first two fields are the thread's main greenlet and its current one (the pointer is 1
//! until the thread first uses greenlets). [`find_greenlet`] finds the module among the
//! process's mappings, the variable's offset in the module's TLS block (from `.symtab`, which
//! PyPI's wheels keep) and the module's TLS id (the dynamic loader's answer to the module's
//! local-dynamic `R_X86_64_DTPMOD64` relocation, read from the process), and
//! `PyGreenlet_Type`, the type of every main greenlet, which the BPF program checks before it
//! trusts the state.
//!
//! # Design constraints
//! The file and the process are untrusted: sizes are bounded, and anything unexpected is an
//! error that says what, never a guess the BPF program cannot check. A module without
//! `.symtab` (a distribution's stripped build) is read only when its TLS segment has the
//! layout of PyPI's builds (16 bytes: the initialisation guard, then the variable); a wrong
//! guess there fails the main greenlet's type check and reads nothing.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use object::elf::{FileHeader64, PT_TLS, R_X86_64_DTPMOD64, SHT_DYNSYM, SHT_SYMTAB, STT_TLS};
use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::read::{ReadCache, ReadRef};

use crate::mapped::{open_mapped, read_maps};
use crate::otel_ctx::TlsAccess;
use crate::python::detect::{load_bias, load_segments};
use crate::python::memory::ProcessMemory;

/// greenlet's thread-local (`static thread_local ThreadStateCreator g_thread_state_global`,
/// mangled as a file-local C++ name).
const STATE_SYMBOL: &[u8] = b"_ZL21g_thread_state_global";
/// The type of greenlets, exported.
const TYPE_SYMBOL: &[u8] = b"PyGreenlet_Type";
/// Offset of the variable in a stripped module's 16-byte TLS block (after the guard).
const STRIPPED_OFFSET: u64 = 8;

/// What greenlet's module file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GreenletModule {
    /// Offset of `g_thread_state_global` in the module's TLS block.
    state_offset: u64,
    /// `st_value` of `PyGreenlet_Type`.
    type_value: u64,
    /// `r_offset` of the module's own `R_X86_64_DTPMOD64` (symbol 0: local-dynamic access).
    modid_slot: u64,
    /// `(p_offset, p_vaddr, p_filesz)` of each PT_LOAD, for the load bias.
    loads: Vec<(u64, u64, u64)>,
}

/// greenlet's thread state in one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GreenletState {
    /// How a thread's `g_thread_state_global` is found.
    pub access: TlsAccess,
    /// `&PyGreenlet_Type` in the process.
    pub greenlet_type: u64,
}

/// Why greenlet's state could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GreenletError {
    /// A read of the process failed.
    #[error("cannot read process memory: {0}")]
    Mem(String),
    /// The module is there but is not what spanprof reads.
    #[error("{path}: {reason}")]
    Unsupported {
        /// The module.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
}

/// greenlet module files looked at, by device and inode (each parsed once per session).
#[derive(Debug, Default)]
pub struct GreenletCache {
    parsed: HashMap<(u64, u64), Result<GreenletModule, &'static str>>,
}

/// Whether a mapped file is greenlet's extension module (`_greenlet.cpython-311-….so`).
fn is_greenlet_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("_greenlet.") && name.ends_with(".so")
}

/// What greenlet's module file `bytes` says (for tests and fuzzing; the file is untrusted).
pub fn parse_greenlet_bytes(bytes: &[u8]) -> Result<GreenletModule, &'static str> {
    parse_elf(bytes)
}

fn parse_elf<'d, R: ReadRef<'d>>(data: R) -> Result<GreenletModule, &'static str> {
    let header =
        FileHeader64::<object::Endianness>::parse(data).map_err(|_| "not a 64-bit ELF file")?;
    let endian = header.endian().map_err(|_| "not a 64-bit ELF file")?;
    let sections = header
        .sections(endian, data)
        .map_err(|_| "bad section headers")?;
    let headers = header
        .program_headers(endian, data)
        .map_err(|_| "bad program headers")?;
    let tls = headers
        .iter()
        .find(|p| p.p_type(endian) == PT_TLS)
        .ok_or("no TLS segment")?;
    let tls_size = tls.p_memsz(endian);
    let symtab = sections
        .symbols(endian, data, SHT_SYMTAB)
        .map_err(|_| "bad .symtab")?;
    let state = symtab.iter().find(|s| {
        s.st_type() == STT_TLS
            && s.st_size(endian) == 8
            && symtab.symbol_name(endian, s) == Ok(STATE_SYMBOL)
    });
    let state_offset =
        match state {
            Some(s) => s.st_value(endian),
            None if symtab.is_empty() && tls_size == 16 => STRIPPED_OFFSET,
            None if symtab.is_empty() => return Err(
                "stripped, and its TLS segment is not the 16 bytes of the builds spanprof knows",
            ),
            None => return Err("no g_thread_state_global in .symtab (greenlet older than 2.0?)"),
        };
    if state_offset.checked_add(8).is_none_or(|end| end > tls_size) {
        return Err("g_thread_state_global outside the TLS segment");
    }
    let dynsym = sections
        .symbols(endian, data, SHT_DYNSYM)
        .map_err(|_| "bad .dynsym")?;
    let type_value = dynsym
        .iter()
        .find(|s| s.st_value(endian) != 0 && dynsym.symbol_name(endian, s) == Ok(TYPE_SYMBOL))
        .map(|s| s.st_value(endian))
        .ok_or("no PyGreenlet_Type in .dynsym")?;
    let is_mips64el = header.is_mips64el(endian);
    let modid_slot = sections
        .iter()
        .filter_map(|section| section.rela(endian, data).ok().flatten())
        .flat_map(|(relas, _)| relas.iter())
        .find(|r| {
            r.r_type(endian, is_mips64el) == R_X86_64_DTPMOD64 && r.r_sym(endian, is_mips64el) == 0
        })
        .map(|r| r.r_offset(endian))
        .ok_or("no local-dynamic TLS relocation (a TLS access spanprof does not read)")?;
    let loads = load_segments(headers, endian);
    Ok(GreenletModule {
        state_offset,
        type_value,
        modid_slot,
        loads,
    })
}

impl GreenletCache {
    /// greenlet's thread state in process `pid`, read through `mem`: `Ok(None)` when the
    /// process has not loaded greenlet (yet).
    pub fn find<M: ProcessMemory>(
        &mut self,
        pid: u32,
        mem: &M,
    ) -> Result<Option<GreenletState>, GreenletError> {
        let maps =
            read_maps(pid).map_err(|e| GreenletError::Mem(format!("/proc/{pid}/maps: {e}")))?;
        let Some(m) = maps.iter().find(|m| is_greenlet_module(&m.path)) else {
            return Ok(None);
        };
        let bad = |reason| GreenletError::Unsupported {
            path: m.file_path().into(),
            reason,
        };
        let (file, _) = open_mapped(pid, m).map_err(|_| bad("cannot open the module"))?;
        let meta = file.metadata().map_err(|_| bad("cannot stat the module"))?;
        let module = self
            .parsed
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| parse_module(file))
            .clone()
            .map_err(bad)?;
        let bias = load_bias(&maps, &m.path, &module.loads)
            .ok_or_else(|| bad("no mapping matches a load segment"))?;
        let modid = mem
            .read_u64(bias.wrapping_add(module.modid_slot))
            .map_err(|e| GreenletError::Mem(e.to_string()))?;
        // 0: not relocated yet (the module is being loaded); looked at again later.
        if modid == 0 || modid > 1 << 16 {
            return Err(bad("implausible TLS module id (not relocated yet?)"));
        }
        Ok(Some(GreenletState {
            access: TlsAccess::Dynamic {
                module: modid,
                offset: module.state_offset,
            },
            greenlet_type: bias.wrapping_add(module.type_value),
        }))
    }
}

/// Reads only the ELF headers, the symbol tables and the relocations (a module with DWARF is
/// not read whole).
fn parse_module(file: File) -> Result<GreenletModule, &'static str> {
    parse_elf(&ReadCache::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greenlet_module_names() {
        assert!(is_greenlet_module(
            "/venv/lib/python3.11/site-packages/greenlet/_greenlet.cpython-311-x86_64-linux-gnu.so"
        ));
        assert!(!is_greenlet_module("/usr/lib/libgreenlet.so"));
        assert!(!is_greenlet_module("/x/_greenlet.py"));
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert!(parse_greenlet_bytes(b"").is_err());
        assert!(parse_greenlet_bytes(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).is_err());
        let mut junk = vec![0u8; 4096];
        junk[..4].copy_from_slice(b"\x7fELF");
        junk[4] = 2;
        junk[5] = 1;
        for i in 0..64 {
            junk[64 + i * 13 % 4000] = (i * 37) as u8;
            assert!(parse_greenlet_bytes(&junk).is_err());
        }
    }
}
