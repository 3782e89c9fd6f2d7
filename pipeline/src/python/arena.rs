//! CPython's small-object arenas among a process's allocations.
//!
//! pymalloc (objects of 512 bytes or less) maps its memory in arenas with an anonymous `mmap`
//! of a fixed size: 256 KiB up to 3.9, 1 MiB from 3.10 (`ARENA_BITS` 20 with
//! `USE_LARGE_ARENAS` on 64-bit builds). The mmap probe sends its caller's return address, so
//! an arena is an anonymous mapping of that size called from the interpreter's module. The code
//! that needs a new arena is rarely the code whose objects fill it: the assembly gives an arena
//! the leaf frame `[pymalloc arena]` rather than charge it to its caller. Free-threaded builds
//! (mimalloc) are not read as Python and have no such arenas.

use std::path::Path;

/// Where one Python process maps its arenas from, and their size.
#[derive(Debug, Clone, Default)]
pub(super) struct Arenas {
    /// Run-time ranges of the interpreter module's code.
    callers: Vec<(u64, u64)>,
    size: u64,
    /// The interpreter's module, as `/proc/PID/maps` names it.
    module: std::path::PathBuf,
}

impl Arenas {
    /// The arenas of `pid`, whose interpreter (3.`minor`) is `module` as `/proc/PID/maps` names
    /// it (no range when the maps cannot be read: nothing is then taken for an arena).
    pub(super) fn new(pid: u32, module: &Path, minor: u8) -> Self {
        let module = module.to_string_lossy();
        let callers = symbolizer::mapped::read_maps(pid)
            .unwrap_or_default()
            .iter()
            .filter(|m| m.is_exec() && m.file_path() == module)
            .map(|m| (m.start, m.end))
            .collect();
        Arenas {
            callers,
            size: if minor <= 9 { 256 << 10 } else { 1 << 20 },
            module: std::path::PathBuf::from(module.as_ref()),
        }
    }

    pub(super) fn module(&self) -> &Path {
        &self.module
    }

    /// Whether an allocation of `size` bytes whose caller returns to `caller` is an arena.
    pub(super) fn holds(&self, caller: u64, size: u64) -> bool {
        caller != 0
            && size == self.size
            && self.callers.iter().any(|&(s, e)| (s..e).contains(&caller))
    }
}

/// The same for a process whose interpreter is not known yet (its first samples, those of a
/// command still starting): either arena size, called from a module named `python*` or
/// `libpython*` (the maps read at once; such mappings are a few per second at most).
pub(super) fn before_detection(pid: u32, caller: u64, size: u64) -> bool {
    if caller == 0 || (size != 256 << 10 && size != 1 << 20) {
        return false;
    }
    let Ok(maps) = symbolizer::mapped::read_maps(pid) else {
        return false;
    };
    maps.iter()
        .find(|m| m.is_exec() && (m.start..m.end).contains(&caller))
        .is_some_and(|m| {
            let name = Path::new(m.file_path())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with("python") || name.starts_with("libpython")
        })
}
