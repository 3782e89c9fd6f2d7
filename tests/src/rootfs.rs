//! Targets in the Debian sid root file system (`SPANPROF_ROOTFS`, else `target/sid-rootfs`,
//! made by `cargo xtask rootfs`): run in a container (a mount namespace of their own after
//! `pivot_root`, as container runtimes do) or in a plain `chroot`, and profiled from outside by
//! pid. Nothing of the host is changed: the mounts are made in the child's own namespace.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{missing_prerequisite, path_from_env, py_workload_source, Background};

/// How a target is confined to the rootfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Own mount namespace, the rootfs bind-mounted, `pivot_root` into it, a fresh `/proc`,
    /// the old root unmounted: `/proc/PID/maps` shows the container's paths.
    Container,
    /// `chroot` in spanprof's mount namespace: `/proc/PID/maps` shows host paths under the
    /// rootfs.
    Chroot,
}

impl Confinement {
    pub const BOTH: [Confinement; 2] = [Confinement::Container, Confinement::Chroot];

    pub fn name(self) -> &'static str {
        match self {
            Confinement::Container => "container",
            Confinement::Chroot => "chroot",
        }
    }
}

/// The rootfs; a missing one fails the test in CI (it is a prerequisite, not an option).
pub fn rootfs() -> PathBuf {
    let dir = path_from_env("SPANPROF_ROOTFS", "target/sid-rootfs");
    if !dir.join(".spanprof-rootfs").is_file() {
        missing_prerequisite(
            &format!("the Debian sid rootfs {}", dir.display()),
            "run `cargo xtask rootfs` (as root)",
        );
    }
    dir
}

/// A directory inside the rootfs for one test's files, removed on drop.
#[derive(Debug)]
pub struct RootfsDir {
    /// Its path on the host.
    pub host: PathBuf,
    /// Its path inside the rootfs.
    pub inside: PathBuf,
}

impl RootfsDir {
    pub fn new(rootfs: &Path, label: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let inside = PathBuf::from(format!("/tmp/spanprof-{label}-{}-{n}", std::process::id()));
        let host = rootfs.join(inside.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(&host).expect("create a directory in the rootfs");
        Self { host, inside }
    }

    /// Copies the workload `script` (in `tests/workloads`) in; its path inside the rootfs.
    pub fn workload(&self, script: &str) -> PathBuf {
        std::fs::copy(py_workload_source(script), self.host.join(script))
            .expect("copy a workload into the rootfs");
        self.inside.join(script)
    }
}

impl Drop for RootfsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.host);
    }
}

/// `argv` (its program a path inside the rootfs) confined to `rootfs`, as a command to spawn.
pub fn confined_command(rootfs: &Path, how: Confinement, argv: &[&str]) -> Command {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]);
    let c = |s: &Path| CString::new(s.as_os_str().as_encoded_bytes()).expect("no NUL in paths");
    let root = c(rootfs);
    let dot = c(Path::new("."));
    let old = c(Path::new(".oldroot"));
    let slash = c(Path::new("/"));
    let old_abs = c(Path::new("/.oldroot"));
    let proc_ = c(Path::new("/proc"));
    let proc_type = c(Path::new("proc"));
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: between fork and exec the closure makes only system calls on strings made
    // before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            match how {
                Confinement::Chroot => {
                    check(libc::chroot(root.as_ptr()))?;
                    check(libc::chdir(slash.as_ptr()))?;
                }
                Confinement::Container => {
                    let none = std::ptr::null();
                    check(libc::unshare(libc::CLONE_NEWNS))?;
                    // Nothing done below propagates to the host's mounts.
                    check(libc::mount(
                        none,
                        slash.as_ptr(),
                        none,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ))?;
                    check(libc::mount(
                        root.as_ptr(),
                        root.as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    check(libc::chdir(root.as_ptr()))?;
                    check(libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), old.as_ptr()) as i32)?;
                    check(libc::chdir(slash.as_ptr()))?;
                    check(libc::mount(
                        proc_type.as_ptr(),
                        proc_.as_ptr(),
                        proc_type.as_ptr(),
                        0,
                        std::ptr::null(),
                    ))?;
                    check(libc::umount2(old_abs.as_ptr(), libc::MNT_DETACH))?;
                }
            }
            Ok(())
        });
    }
    cmd
}

/// Starts `python` (a path inside the rootfs) on the workload `script` with `args`, confined,
/// and waits for its `ready PID` line.
#[track_caller]
pub fn start_confined_py(
    rootfs: &Path,
    dir: &RootfsDir,
    how: Confinement,
    python: &str,
    script: &str,
    args: &[&str],
) -> Background {
    start_confined_py_with_env(rootfs, dir, how, python, &[], script, args)
}

/// [`start_confined_py`] with environment variables, such as `PYTHONPATH` naming a directory
/// inside the rootfs (the tracing libraries `cargo xtask rootfs` installs in
/// `/opt/span-libs/3.X`).
#[track_caller]
pub fn start_confined_py_with_env(
    rootfs: &Path,
    dir: &RootfsDir,
    how: Confinement,
    python: &str,
    env: &[(&str, &str)],
    script: &str,
    args: &[&str],
) -> Background {
    let script = dir.workload(script);
    let mut argv = vec![python, script.to_str().expect("UTF-8 path")];
    argv.extend_from_slice(args);
    let mut cmd = confined_command(rootfs, how, &argv);
    cmd.envs(env.iter().copied());
    let label = format!("{python} {} in a {}", script.display(), how.name());
    crate::start_ready(cmd, &label)
}

/// The files `pid` maps for execution, as host paths (the rootfs prefix added to a
/// container's paths), read from `/proc/PID/maps` while it lives.
pub fn exec_mapped_files(pid: u32, rootfs: &Path, how: Confinement) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read the maps");
    let mut files: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.splitn(6, ' ').collect();
        let (Some(perms), Some(path)) = (fields.get(1), fields.get(5)) else {
            continue;
        };
        let path = path.trim_start();
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let host = match how {
            Confinement::Container => rootfs.join(path.trim_start_matches('/')),
            Confinement::Chroot => PathBuf::from(path),
        };
        if !files.contains(&host) {
            files.push(host);
        }
    }
    files
}

/// The GNU build id `readelf -n` (binutils, not spanprof) prints for `file`, if any.
pub fn readelf_build_id(file: &Path) -> Option<String> {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(file)
        .output()
        .expect("run readelf (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .map(|id| id.trim().to_string())
}

/// The separate debug files of `files` in the rootfs: `usr/lib/debug/.build-id/ab/cdef.debug`
/// named by each file's build id as `readelf -n` (binutils, not spanprof) prints it, and the
/// rootfs's `dwz` files (`usr/lib/debug/.dwz/`).
pub fn rootfs_debug_files(rootfs: &Path, files: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for file in files {
        let Some(id) = readelf_build_id(file) else {
            continue;
        };
        if id.len() < 4 {
            continue;
        }
        let debug = rootfs.join(format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &id[..2],
            &id[2..]
        ));
        if debug.is_file() {
            found.push(debug);
        }
    }
    // The supplementary files `dwz` made of a package's debug files (`.gnu_debugaltlink`),
    // which hold the DWARF its debug files share.
    let mut dwz = vec![rootfs.join("usr/lib/debug/.dwz")];
    while let Some(dir) = dwz.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dwz.push(path);
            } else if path.is_file() {
                found.push(path);
            }
        }
    }
    found
}

/// Every string (`strings -a`, binutils) of `files`, their DWARF sections decompressed first
/// (`objcopy --decompress-debug-sections`): the names a debug file's DWARF gives (inlined and
/// static functions, `k_mul` of `k_mul.constprop.0`), which no symbol table lists.
pub fn file_strings(files: &[PathBuf]) -> std::collections::HashSet<String> {
    let mut names = std::collections::HashSet::new();
    let tmp = crate::TempDir::new("dwarf-strings");
    for (i, file) in files.iter().enumerate() {
        let plain = tmp.join(&format!("{i}.debug"));
        let status = Command::new("objcopy")
            .arg("--decompress-debug-sections")
            .arg(file)
            .arg(&plain)
            .status()
            .expect("run objcopy (binutils)");
        let read = if status.success() { &plain } else { file };
        let out = Command::new("strings")
            .args(["-a", "-n", "3"])
            .arg(read)
            .output()
            .expect("run strings (binutils)");
        names.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string),
        );
    }
    names
}

/// Every symbol name `nm -D` and `nm` (binutils, not spanprof) find in `files`.
pub fn nm_symbols(files: &[PathBuf]) -> std::collections::HashSet<String> {
    let mut names = std::collections::HashSet::new();
    for file in files {
        for dynamic in [true, false] {
            let mut cmd = Command::new("nm");
            if dynamic {
                cmd.arg("-D");
            }
            let out = cmd.arg(file).output().expect("run nm (binutils)");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // "ADDR T name" or "                 U name", with `@VERSION` on dynamic ones.
                if let Some(name) = line.split_whitespace().last() {
                    let name = name.split('@').next().unwrap_or(name);
                    names.insert(name.to_string());
                    // GCC's clones keep their function's name before a suffix
                    // (`l_mod.lto_priv.0`, `k_mul.constprop.0`, `x_add.cold`), which
                    // symbolizers leave out.
                    if let Some((base, _)) = name.split_once('.').filter(|(b, _)| !b.is_empty()) {
                        names.insert(base.to_string());
                    }
                }
            }
        }
    }
    names
}

/// The symbols of an ELF file with their sizes (`nm -S --defined-only`, binutils), as
/// `(start, end, name)` by start, GCC's clone suffixes left out of the names.
pub fn nm_ranges(file: &Path, dynamic: bool) -> Vec<(u64, u64, String)> {
    let mut cmd = Command::new("nm");
    cmd.args(["-S", "--defined-only"]);
    if dynamic {
        cmd.arg("-D");
    }
    let out = cmd.arg(file).output().expect("run nm (binutils)");
    let mut ranges: Vec<(u64, u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [addr, size, kind, name] = f[..] else {
                return None;
            };
            if !matches!(kind, "T" | "t" | "W" | "w" | "i") {
                return None;
            }
            let start = u64::from_str_radix(addr, 16).ok()?;
            let size = u64::from_str_radix(size, 16).ok()?;
            let name = name.split('@').next()?;
            let base = name.split_once('.').map_or(name, |(b, _)| b);
            Some((start, start + size, base.to_string()))
        })
        .collect();
    ranges.sort();
    ranges
}

/// The `PT_LOAD`s of an ELF file (`readelf -lW`, binutils): `(offset, vaddr, filesz)`.
pub fn load_segments(file: &Path) -> Vec<(u64, u64, u64)> {
    let out = Command::new("readelf")
        .args(["-lW"])
        .arg(file)
        .output()
        .expect("run readelf (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.first() != Some(&"LOAD") {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            Some((hex(f[1])?, hex(f[2])?, hex(f[4])?))
        })
        .collect()
}
