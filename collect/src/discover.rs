//! Process discovery, the collector's job: new targets' interpreters looked for (so their
//! first samples have Python frames), and the C library of every process probed for
//! allocations (once per library file). The aggregator only counts what it is given.

use std::path::PathBuf;

use anyhow::Result;

use super::Collector;
use crate::bpf::{LoadError, Programs};
use crate::python::Python;

/// The allocation probes of a collection (`alloc`, `heap`).
#[derive(Debug)]
pub(crate) struct Probes {
    pub(crate) enabled: bool,
    /// `--python-allocators`: CPython's object allocator is probed too.
    pub(crate) python: bool,
    /// Interpreter modules found without pymalloc's symbols (warned about once each).
    pub(crate) unprobed: std::collections::HashSet<String>,
}

impl Probes {
    /// Probes the C library process `pid` has mapped (once per library file).
    pub(crate) fn libc_of(&mut self, programs: &mut Programs, pid: u32) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        // A process that exited meanwhile has nothing left to probe.
        let Ok(maps) = symbolizer::mapped::read_maps(pid) else {
            return Ok(());
        };
        if maps.is_empty() {
            return Ok(());
        }
        let Some(libc_map) = maps.iter().find(|m| {
            let file = m.file_path();
            let name = file.rsplit('/').next().unwrap_or(file);
            name.starts_with("libc.so") || name.starts_with("libc-2.")
        }) else {
            eprintln!(
                "spanprof: warning: pid {pid} has no C library mapped: its malloc calls are not \
                 seen (a static binary, or another allocator)"
            );
            return Ok(());
        };
        // The file the process maps (a container's own libc, or the one replaced on disk
        // since: `libc.so.6 (deleted)`), never another of its path.
        let (file, _) = match symbolizer::mapped::open_mapped(pid, libc_map) {
            Ok(opened) => opened,
            Err(e) if libc_map.path.ends_with("(deleted)") => anyhow::bail!(
                "pid {pid}'s C library was replaced on disk, and the file it maps is reached \
                 only through /proc/{pid}/map_files, which needs CAP_CHECKPOINT_RESTORE or \
                 CAP_SYS_ADMIN ({e}): its malloc calls are not seen"
            ),
            Err(e) => anyhow::bail!(
                "cannot open pid {pid}'s C library {} ({e}): its malloc calls are not seen",
                libc_map.path
            ),
        };
        use std::os::fd::AsRawFd;
        let module = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        programs.attach_allocator(&module, libc_map.file_path())?;
        Ok(())
    }

    /// Probes the C library of the CPython processes found since the last call, when it is
    /// another one than those probed already (a container's), and with `--python-allocators`
    /// their interpreter's object allocator.
    pub(crate) fn python(&mut self, programs: &mut Programs, python: &mut Python) {
        for pid in python.take_new_processes() {
            if let Err(e) = self.libc_of(programs, pid) {
                eprintln!("spanprof: warning: pid {pid}: {e:#}");
            }
            if let Err(e) = self.pymalloc_of(programs, python, pid) {
                eprintln!("spanprof: warning: pid {pid}: {e:#}");
            }
        }
    }

    /// Probes the object allocator of `pid`'s interpreter (`--python-allocators`), once per
    /// module file; says once per module when its symbol table lacks it.
    fn pymalloc_of(&mut self, programs: &mut Programs, python: &Python, pid: u32) -> Result<()> {
        if !self.python {
            return Ok(());
        }
        let Some(module) = python.interpreter_module(pid) else {
            return Ok(());
        };
        let module = module.to_string_lossy().into_owned();
        let Ok(maps) = symbolizer::mapped::read_maps(pid) else {
            return Ok(());
        };
        let Some(map) = maps.iter().find(|m| m.is_exec() && m.file_path() == module) else {
            return Ok(());
        };
        let (file, _) = symbolizer::mapped::open_mapped(pid, map).map_err(|e| {
            anyhow::anyhow!(
                "cannot open {module} ({e}): its small objects are seen through their arenas \
                 only ([pymalloc arena])"
            )
        })?;
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let minor = python
            .runtime_version(pid)
            .and_then(|v| v.split('.').nth(1)?.parse().ok())
            .unwrap_or(0);
        if !programs.attach_python_allocator(&path, &module, minor)?
            && self.unprobed.insert(module.clone())
        {
            eprintln!(
                "spanprof: warning: pid {pid}: {module} has no symbol of pymalloc \
                 (_PyObject_Malloc, its arena allocator; a stripped build): its small objects \
                 are seen through their arenas only ([pymalloc arena]), not by --python-allocators"
            );
        }
        Ok(())
    }
}

impl Collector {
    /// Adds `pid` to the kernel's target set, and to the targets whose CPU time is read.
    pub fn add_target(&mut self, pid: u32) -> Result<(), LoadError> {
        self.programs.add_target(pid)?;
        self.target_cpu.add(pid);
        Ok(())
    }

    /// Looks for the interpreter of a target at once (handed to the kernel at
    /// [`Collector::flush_discovered`]) and probes its C library for allocations.
    pub fn discover(&mut self, pid: u32) -> Result<()> {
        self.python.detect_now(pid);
        self.probes.libc_of(&mut self.programs, pid)
    }

    /// Probes the C library spanprof itself maps: the one of most programs on the host (a
    /// command that has not run its program yet; the daemon's first probe).
    pub fn probe_own_libc(&mut self) -> Result<()> {
        self.probes.libc_of(&mut self.programs, std::process::id())
    }

    /// Hands the interpreters found to the kernel's walker, and probes the C library of the
    /// CPython processes among them.
    pub fn flush_discovered(&mut self) {
        self.python.flush(&mut self.programs);
        self.probes.python(&mut self.programs, &mut self.python);
    }
}
