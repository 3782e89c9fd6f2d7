//! The glue to blazesym: the symbolizer it is built with, what a module's parsed symbols are
//! estimated to cost, and its answers turned into [`Symbol`]s.

use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized};

use crate::{debug_file, Inlined, Symbol, MAX_INLINED};

/// What keeping a module's parsed symbols costs, estimated from the sections blazesym reads:
/// the symbol and string tables and the DWARF sections, of the module and of its separate
/// debug file, three times over: it maps the file (their pages become resident as it reads
/// them) and builds its own tables from them on the heap, about twice their size (measured:
/// 4.6 MB resident, 3.0 MB of it on the heap, after naming 200 addresses spread over a
/// module with 1.6 MB of such sections). A fixed part stands for the rest (blazesym's own
/// structures, the file's headers).
pub fn parse_cost(module: &std::fs::File, debug: Option<&debug_file::DebugFile>) -> u64 {
    const FIXED: u64 = 16 << 10;
    const PER_BYTE: u64 = 3;
    let sections = |file: &std::fs::File| -> u64 {
        use object::{Object, ObjectSection};
        let cache = object::ReadCache::new(file);
        let Ok(obj) = object::File::parse(&cache) else {
            return 0;
        };
        obj.sections()
            .filter(|s| {
                let name = s.name().unwrap_or("");
                matches!(
                    name,
                    ".symtab" | ".strtab" | ".dynsym" | ".dynstr" | ".gnu_debugdata"
                ) || name.starts_with(".debug_")
                    || name.starts_with(".zdebug_")
            })
            .map(|s| s.size())
            .sum()
    };
    FIXED + PER_BYTE * (sections(module) + debug.map_or(0, |d| sections(&d.file)))
}

pub(crate) fn new_blazesym() -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        // NB: no debug directories of its own: separate debug files are found by
        // `debug_file::find`, in the target's root and checked against the module; blazesym
        // would look for them by the module's path and build id in the host's directories.
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .enable_code_info(true)
        // NB: with inlined functions on, `code_info` is the location in the outer (named)
        // function, not in the innermost inlined callee: name, file and line agree.
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build()
}

/// Symbolizes a module's file `offsets` with its separate debug file, which shares its
/// virtual addresses, not its file offsets; `None` when an offset is in no load segment (none
/// in a sane file: the module's own symbols are used then).
pub(crate) fn with_debug_file<'a>(
    symbolizer: &'a blazesym::symbolize::Symbolizer,
    debug: &debug_file::DebugFile,
    offsets: &[u64],
) -> Option<Result<Vec<Symbolized<'a>>, blazesym::Error>> {
    let vaddrs: Vec<u64> = offsets
        .iter()
        .map(|&o| debug.vaddr(o))
        .collect::<Option<_>>()?;
    let mut elf = Elf::new(debug.path());
    elf.debug_syms = debug.dwarf;
    Some(symbolizer.symbolize(&Source::Elf(elf), Input::VirtOffset(&vaddrs)))
}

pub(crate) fn unknown(module: Option<&Path>, address: u64, reason: &str) -> Symbol {
    Symbol {
        function: None,
        module: module.map(|m| m.display().to_string()),
        address,
        file: None,
        line: None,
        unknown_reason: Some(reason.to_string()),
        ids: None,
        inlined: Vec::new(),
    }
}

pub(crate) fn plt_symbol(name: String, module: &Path, address: u64) -> Symbol {
    Symbol {
        function: Some(name),
        module: Some(module.display().to_string()),
        address,
        file: None,
        line: None,
        unknown_reason: None,
        ids: None,
        inlined: Vec::new(),
    }
}

pub(crate) fn to_symbol(result: Symbolized<'_>, module: Option<&Path>, address: u64) -> Symbol {
    match result {
        Symbolized::Sym(sym) => {
            let (file, line) = match &sym.code_info {
                Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
                None => (None, None),
            };
            Symbol {
                function: Some(sym.name.into_owned()),
                module: module.map(|m| m.display().to_string()),
                address,
                file,
                line,
                unknown_reason: None,
                ids: None,
                inlined: sym
                    .inlined
                    .iter()
                    .take(MAX_INLINED)
                    .map(|f| Inlined {
                        // NB: blazesym names an inlined function without a DWARF name "".
                        function: (!f.name.is_empty()).then(|| f.name.to_string()),
                        file: f
                            .code_info
                            .as_ref()
                            .map(|ci| ci.to_path().display().to_string()),
                        line: f.code_info.as_ref().and_then(|ci| ci.line),
                    })
                    .collect(),
            }
        }
        Symbolized::Unknown(reason) => unknown(module, address, &reason.to_string()),
    }
}
