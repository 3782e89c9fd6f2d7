//! OpenTelemetry's cooperative context of a process, for processes that publish it: the OTEP
//! 4947 thread-local `otel_thread_ctx_v1` (a pointer to the thread's current trace context
//! record) and the OTEP 4719 process context (a mapping named `OTEL_CTX` whose header points to
//! a `ProcessContext` protobuf, which holds the key map of the thread records' attributes).
//!
//! # Overview
//! [`find_thread_ctx`] looks for the TLS symbol in the `.dynsym` of every module a process
//! maps and works out how a thread's copy is reached, from the relocation the dynamic loader
//! filled in (TLSDESC, DTPMOD64/DTPOFF64, TPOFF64) or, in an executable without one, from its
//! TLS segment: either at a fixed offset from the thread pointer (static TLS) or in the
//! module's block of the thread's DTV. The BPF program then reads the record of the sampled
//! thread. [`read_process_ctx`] reads the process context's attribute key map.
//!
//! # Design constraints
//! Files are read through `/proc/PID/root`, and target memory through [`ProcessMemory`]; both
//! are untrusted: sizes are bounded and anything unexpected is "not published".

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use object::elf::{
    FileHeader64, R_X86_64_DTPMOD64, R_X86_64_TLSDESC, R_X86_64_TPOFF64, SHT_DYNSYM, STT_TLS,
};
use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::read::{ReadCache, ReadRef};

use crate::mapped::{open_mapped, read_maps};
use crate::python::detect::{load_bias, load_segments};
use crate::python::memory::ProcessMemory;

/// The thread-local symbol of OTEP 4947.
pub const THREAD_CTX_SYMBOL: &str = "otel_thread_ctx_v1";
/// Bytes of a thread context record before its attributes.
pub const RECORD_HEADER: usize = 28;
/// Largest process context payload read.
const MAX_PAYLOAD: u32 = 1 << 16;

/// How a thread's copy of a TLS variable is found from its thread pointer (x86_64 FS base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsAccess {
    /// At `fsbase + tp_offset` (static TLS: the executable, libraries loaded at start, and
    /// dlopen'd ones glibc could place in its surplus).
    Static {
        /// Offset from the thread pointer (negative on x86_64).
        tp_offset: i64,
    },
    /// At `dtv[module].block + offset`, with the DTV at `fsbase + 8` (glibc's
    /// `tcbhead_t.dtv`) and 16-byte entries.
    Dynamic {
        /// The module's TLS id.
        module: u64,
        /// Offset of the variable in the module's block.
        offset: u64,
    },
}

/// What a module's file says of the symbol ([`parse_module_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSymbol {
    /// `st_value`: offset in the module's TLS block.
    value: u64,
    /// The dynamic relocation of the symbol, `(r_type, r_offset)`, if any.
    reloc: Option<(u32, u64)>,
    /// `roundup(p_memsz, p_align)` of PT_TLS, for an executable's local-exec access.
    tls_size: Option<u64>,
    /// An executable (not a shared library).
    executable: bool,
    /// `(p_offset, p_vaddr, p_filesz)` of each PT_LOAD, for the load bias.
    loads: Vec<(u64, u64, u64)>,
}

/// Why the symbol could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtxError {
    /// A read of the process failed.
    #[error("cannot read process memory: {0}")]
    Mem(String),
    /// The symbol is there but its access could not be worked out.
    #[error("{path}: {reason}")]
    Unsupported {
        /// The module.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
}

/// The resolved thread-local of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCtxVar {
    /// The module that defines it.
    pub module: PathBuf,
    /// How a thread's copy is found.
    pub access: TlsAccess,
}

/// Module files looked at for the symbol, by device and inode: each file is parsed once per
/// session, whichever processes map it.
#[derive(Debug, Default)]
pub struct ModuleCache {
    parsed: HashMap<(u64, u64), Option<TlsSymbol>>,
}

/// Reads only what it needs of the file (the ELF header, program headers, `.dynsym` and its
/// strings, the dynamic relocations): a big libpython is not read whole.
fn parse_module(file: File) -> Option<TlsSymbol> {
    parse_elf(&ReadCache::new(file))
}

/// [`parse_module`] of a module's bytes: what the file says of `otel_thread_ctx_v1`, `None`
/// when it has no such symbol or is not a 64-bit ELF file (for tests and fuzzing; the file is
/// untrusted).
pub fn parse_module_bytes(bytes: &[u8]) -> Option<TlsSymbol> {
    parse_elf(bytes)
}

fn parse_elf<'d, R: ReadRef<'d>>(data: R) -> Option<TlsSymbol> {
    // NB: the section-level API, not `ElfFile::parse`, which reads `.symtab` whole (73 ms for
    // spanprof's own binary with its debug symbols, a drain stalled that long): only `.dynsym`,
    // its strings and the RELA sections are read.
    let header = FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let dynsym = sections.symbols(endian, data, SHT_DYNSYM).ok()?;
    let (index, sym) = dynsym.iter().enumerate().find(|(_, s)| {
        s.st_type() == STT_TLS
            && s.st_size(endian) == 8
            && dynsym.symbol_name(endian, s) == Ok(THREAD_CTX_SYMBOL.as_bytes())
    })?;
    let is_mips64el = header.is_mips64el(endian);
    let reloc = sections
        .iter()
        .filter_map(|section| match section.rela(endian, data) {
            Ok(Some((relas, link))) if link == dynsym.section() => Some(relas),
            _ => None,
        })
        .flatten()
        .find_map(|r| {
            let r_type = r.r_type(endian, is_mips64el);
            (r.r_sym(endian, is_mips64el) as usize == index
                && matches!(
                    r_type,
                    R_X86_64_TLSDESC | R_X86_64_DTPMOD64 | R_X86_64_TPOFF64
                ))
            .then(|| (r_type, r.r_offset(endian)))
        });
    let headers = header.program_headers(endian, data).ok()?;
    let tls_size = headers
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_TLS)
        .map(|p| {
            let align = p.p_align(endian).max(1);
            p.p_memsz(endian).div_ceil(align).saturating_mul(align)
        });
    let executable = header.e_type(endian) == object::elf::ET_EXEC
        || headers
            .iter()
            .any(|p| p.p_type(endian) == object::elf::PT_INTERP);
    let loads = load_segments(headers, endian);
    Some(TlsSymbol {
        value: sym.st_value(endian),
        reloc,
        tls_size,
        executable,
        loads,
    })
}

impl ModuleCache {
    /// Looks for `otel_thread_ctx_v1` in the modules process `pid` maps (files parsed once per
    /// cache), and resolves its access through `mem`. `Ok(None)`: not published.
    ///
    /// `unchanged_since` is the caller's memory of the last look: when that opened every file
    /// and found nothing, and the process maps the same files at the same addresses now,
    /// nothing is opened again (a look opens every mapped file: a Python process maps dozens,
    /// and is looked at every second, which a perf profile of the daemon beside two Python
    /// processes showed as its largest cost after symbolizing).
    pub fn find_thread_ctx<M: ProcessMemory>(
        &mut self,
        pid: u32,
        mem: &M,
        unchanged_since: &mut u64,
    ) -> Result<Option<ThreadCtxVar>, CtxError> {
        let Ok(maps) = read_maps(pid) else {
            return Ok(None);
        };
        let files = files_mapped(&maps);
        if files == *unchanged_since {
            return Ok(None);
        }
        // Until this look has found nothing in every file, the next one looks again.
        *unchanged_since = 0;
        let mut all_read = true;
        let mut seen: Vec<&str> = Vec::new();
        for m in &maps {
            if seen.contains(&m.path.as_str()) {
                continue;
            }
            seen.push(&m.path);
            let Ok((file, _)) = open_mapped(pid, m) else {
                all_read = false;
                continue;
            };
            let Ok(meta) = file.metadata() else {
                all_read = false;
                continue;
            };
            let Some(sym) = self
                .parsed
                .entry((meta.dev(), meta.ino()))
                .or_insert_with(|| parse_module(file))
                .clone()
            else {
                continue;
            };
            let bad = |reason| CtxError::Unsupported {
                path: m.file_path().into(),
                reason,
            };
            let bias = load_bias(&maps, &m.path, &sym.loads)
                .ok_or_else(|| bad("no mapping matches a load segment"))?;
            let access = tls_access(&sym, bias, mem).map_err(|e| match e {
                AccessError::Mem(e) => CtxError::Mem(e),
                AccessError::Unsupported(reason) => bad(reason),
            })?;
            return Ok(Some(ThreadCtxVar {
                module: m.file_path().into(),
                access,
            }));
        }
        if all_read {
            *unchanged_since = files;
        }
        Ok(None)
    }
}

/// A fingerprint of the files a process maps and where (never 0).
fn files_mapped(maps: &[crate::mapped::Mapping]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in maps {
        (m.start, m.offset, m.dev, m.inode, &m.path).hash(&mut h);
    }
    h.finish().max(1)
}

/// Why [`tls_access`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessError {
    /// A read of the process failed.
    Mem(String),
    /// The symbol's access could not be worked out.
    Unsupported(&'static str),
}

/// How a thread's copy of the symbol `sym` describes is found, in a process that loaded its
/// module at `bias`: from what the dynamic loader wrote into the relocation's target (read
/// through `mem`), or from the TLS segment of an executable without a relocation.
pub fn tls_access<M: ProcessMemory>(
    sym: &TlsSymbol,
    bias: u64,
    mem: &M,
) -> Result<TlsAccess, AccessError> {
    let read = |addr: u64| {
        mem.read_u64(addr)
            .map_err(|e| AccessError::Mem(e.to_string()))
    };
    let access = match sym.reloc {
        Some((R_X86_64_TLSDESC, off)) => {
            // struct tlsdesc { entry; arg; }: arg is a TP offset (static) or points to
            // { module, offset, generation } (dynamic).
            // glibc x86_64: a static argument is `st_value - l_tls_offset`, below the
            // thread pointer, so negative; a dynamic one is a heap pointer.
            let arg = read(bias.wrapping_add(off).wrapping_add(8))?;
            if (arg as i64) < 0 {
                TlsAccess::Static {
                    tp_offset: arg as i64,
                }
            } else {
                TlsAccess::Dynamic {
                    module: read(arg)?,
                    offset: read(arg.wrapping_add(8))?,
                }
            }
        }
        Some((R_X86_64_DTPMOD64, off)) => TlsAccess::Dynamic {
            module: read(bias.wrapping_add(off))?,
            offset: read(bias.wrapping_add(off).wrapping_add(8))?,
        },
        Some((_, off)) => TlsAccess::Static {
            tp_offset: read(bias.wrapping_add(off))? as i64,
        },
        // Local-exec in an executable: its block ends at the thread pointer.
        None if sym.executable => {
            let size = sym
                .tls_size
                .ok_or(AccessError::Unsupported("no PT_TLS segment"))?;
            let implausible = AccessError::Unsupported("implausible TLS segment size or offset");
            let value = i64::try_from(sym.value).map_err(|_| implausible.clone())?;
            let size = i64::try_from(size).map_err(|_| implausible.clone())?;
            TlsAccess::Static {
                tp_offset: value.checked_sub(size).ok_or(implausible)?,
            }
        }
        None => {
            return Err(AccessError::Unsupported(
                "no TLS relocation for otel_thread_ctx_v1",
            ))
        }
    };
    match access {
        TlsAccess::Dynamic { module, offset }
            if module == 0 || module > 1 << 16 || offset > 1 << 20 =>
        {
            return Err(AccessError::Unsupported(
                "implausible TLS module id or offset",
            ))
        }
        // x86_64 static TLS lies below the thread pointer: 0 is a slot the dynamic loader has
        // not relocated yet (the process is still starting; looked at again later).
        TlsAccess::Static { tp_offset } if !(-(1 << 30)..0).contains(&tp_offset) => {
            return Err(AccessError::Unsupported(
                "implausible static TLS offset (not relocated yet?)",
            ))
        }
        _ => {}
    }
    Ok(access)
}

/// Mapping names of a published process context (OTEP 4719), as `/proc/PID/maps` shows them.
const PROCESS_CTX_NAMES: [&str; 3] = [
    "[anon_shmem:OTEL_CTX]",
    "[anon:OTEL_CTX]",
    "/memfd:OTEL_CTX",
];

/// What spanprof takes from a process context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessCtx {
    /// `monotonic_published_at_ns` of the header read: a new value means an update.
    pub published_at: u64,
    /// `threadlocal.attribute_key_map`: attribute names by key index.
    pub key_map: Vec<String>,
    /// `threadlocal.schema_version`.
    pub schema: Option<String>,
    /// `service.name` of the resource, if set.
    pub service_name: Option<String>,
}

/// Reads the process context of `pid`, if it publishes one. `Ok(None)`: not published (or
/// being updated: try again later).
pub fn read_process_ctx<M: ProcessMemory>(pid: u32, mem: &M) -> Option<ProcessCtx> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let start = text.lines().find_map(|line| {
        let name = line.splitn(6, ' ').nth(5)?.trim_start();
        PROCESS_CTX_NAMES
            .iter()
            .any(|n| name.starts_with(n))
            .then(|| u64::from_str_radix(line.split('-').next()?, 16).ok())?
    })?;
    read_process_ctx_at(start, mem)
}

/// Reads a process context whose header is at `start` (the `OTEL_CTX` mapping's start).
/// `None`: not a valid header, being updated, or a payload that does not decode.
pub fn read_process_ctx_at<M: ProcessMemory>(start: u64, mem: &M) -> Option<ProcessCtx> {
    let mut hdr = [0u8; 32];
    mem.read(start, &mut hdr).ok()?;
    let u32_at = |o: usize| u32::from_le_bytes(hdr[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(hdr[o..o + 8].try_into().unwrap());
    let (version, size, published, payload) = (u32_at(8), u32_at(12), u64_at(16), u64_at(24));
    if &hdr[..8] != b"OTEL_CTX" || version != 2 || published == 0 || size > MAX_PAYLOAD {
        return None;
    }
    let mut bytes = vec![0u8; size as usize];
    mem.read(payload, &mut bytes).ok()?;
    // The header again: an update in between (timestamp changed) makes the payload suspect.
    let mut again = [0u8; 32];
    mem.read(start, &mut again).ok()?;
    if again != hdr {
        return None;
    }
    let mut ctx = decode_process_ctx(&bytes)?;
    ctx.published_at = published;
    Some(ctx)
}

/// A protobuf field's value: only length-delimited ones are kept.
enum Field<'a> {
    Bytes(&'a [u8]),
    Other,
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of one protobuf message; `None` if malformed.
fn fields(mut b: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let field = match key & 7 {
            0 => {
                varint(&mut b)?;
                Field::Other
            }
            1 => {
                b = b.get(8..)?;
                Field::Other
            }
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                let (v, rest) = (b.get(..len)?, &b[len..]);
                b = rest;
                Field::Bytes(v)
            }
            5 => {
                b = b.get(4..)?;
                Field::Other
            }
            _ => return None,
        };
        out.push((key >> 3, field));
    }
    Some(out)
}

/// A KeyValue's key and its AnyValue's fields.
fn key_value(b: &[u8]) -> Option<(String, Vec<(u64, Field<'_>)>)> {
    let mut key = None;
    let mut value = Vec::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(k)) => key = Some(String::from_utf8_lossy(k).into_owned()),
            (2, Field::Bytes(v)) => value = fields(v)?,
            _ => {}
        }
    }
    Some((key?, value))
}

fn any_string(value: &[(u64, Field<'_>)]) -> Option<String> {
    value.iter().find_map(|(n, f)| match (n, f) {
        (1, Field::Bytes(s)) => Some(String::from_utf8_lossy(s).into_owned()),
        _ => None,
    })
}

/// Decodes `ProcessContext { Resource resource = 1; repeated KeyValue attributes = 2; }`.
pub fn decode_process_ctx(payload: &[u8]) -> Option<ProcessCtx> {
    let mut ctx = ProcessCtx::default();
    for (n, f) in fields(payload)? {
        let Field::Bytes(b) = f else { continue };
        match n {
            1 => {
                for (rn, rf) in fields(b)? {
                    if let (1, Field::Bytes(kv)) = (rn, rf) {
                        let (k, v) = key_value(kv)?;
                        if k == "service.name" {
                            ctx.service_name = any_string(&v);
                        }
                    }
                }
            }
            2 => {
                let (k, v) = key_value(b)?;
                match k.as_str() {
                    "threadlocal.schema_version" => ctx.schema = any_string(&v),
                    "threadlocal.attribute_key_map" => {
                        // AnyValue.array_value (5) = ArrayValue { repeated AnyValue values = 1 }
                        for (an, af) in &v {
                            if let (5, Field::Bytes(arr)) = (an, af) {
                                for (_, item) in fields(arr)? {
                                    if let Field::Bytes(item) = item {
                                        ctx.key_map.push(any_string(&fields(item)?)?);
                                    }
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Some(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::FixtureMemory;

    #[test]
    fn tls_access_of_garbage_is_an_error_not_an_overflow() {
        let exe = |value: u64, tls_size: Option<u64>| TlsSymbol {
            value,
            reloc: None,
            tls_size,
            executable: true,
            loads: Vec::new(),
        };
        let mem = FixtureMemory::new();
        // Local-exec: the block ends at the thread pointer.
        assert_eq!(
            tls_access(&exe(8, Some(16)), 0, &mem),
            Ok(TlsAccess::Static { tp_offset: -8 })
        );
        for sym in [
            exe(u64::MAX, Some(16)),
            exe(0, Some(u64::MAX)),
            exe(i64::MIN as u64, Some(1)),
        ] {
            assert!(
                matches!(tls_access(&sym, 0, &mem), Err(AccessError::Unsupported(_))),
                "{sym:?}"
            );
        }
        assert!(matches!(
            tls_access(&exe(0, None), 0, &mem),
            Err(AccessError::Unsupported("no PT_TLS segment"))
        ));
        // A relocation whose target cannot be read.
        let shared = TlsSymbol {
            reloc: Some((R_X86_64_TLSDESC, u64::MAX - 4)),
            executable: false,
            ..exe(0, Some(8))
        };
        assert!(matches!(
            tls_access(&shared, 0x1000, &mem),
            Err(AccessError::Mem(_))
        ));
        // Not an ELF file at all.
        assert_eq!(parse_module_bytes(b"\x7fELF garbage"), None);
    }

    fn tag(n: u64, wire: u64) -> u8 {
        (n << 3 | wire) as u8
    }

    fn bytes_field(n: u64, v: &[u8]) -> Vec<u8> {
        let mut out = vec![tag(n, 2), v.len() as u8];
        out.extend_from_slice(v);
        out
    }

    fn string_kv(k: &str, v: &str) -> Vec<u8> {
        let mut kv = bytes_field(1, k.as_bytes());
        kv.extend(bytes_field(2, &bytes_field(1, v.as_bytes())));
        kv
    }

    #[test]
    fn decodes_key_map_schema_and_service() {
        let mut payload = bytes_field(1, &bytes_field(1, &string_kv("service.name", "nova-api")));
        payload.extend(bytes_field(
            2,
            &string_kv("threadlocal.schema_version", "tlsdesc_v1_dev"),
        ));
        let mut array = Vec::new();
        for k in ["osprofiler.base_id", "osprofiler.trace_id"] {
            array.extend(bytes_field(1, &bytes_field(1, k.as_bytes())));
        }
        let mut kv = bytes_field(1, b"threadlocal.attribute_key_map");
        kv.extend(bytes_field(2, &bytes_field(5, &array)));
        payload.extend(bytes_field(2, &kv));
        let ctx = decode_process_ctx(&payload).unwrap();
        assert_eq!(ctx.service_name.as_deref(), Some("nova-api"));
        assert_eq!(ctx.schema.as_deref(), Some("tlsdesc_v1_dev"));
        assert_eq!(ctx.key_map, ["osprofiler.base_id", "osprofiler.trace_id"]);
    }

    #[test]
    fn malformed_payloads_are_refused() {
        assert!(decode_process_ctx(&[0x0a, 0x05, 0x01]).is_none()); // length past the end
        assert!(decode_process_ctx(&[0x0f]).is_none()); // wire type 7
        assert!(decode_process_ctx(&[0x80; 11]).is_none()); // varint too long
        assert_eq!(decode_process_ctx(&[]), Some(ProcessCtx::default()));
    }
}
