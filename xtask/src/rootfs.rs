//! The Debian sid root file system of the container and chroot tests (`target/sid-rootfs`):
//! sid's own stripped builds of CPython 3.13, 3.14 and 3.15, as most container images carry
//! them, with the headers of 3.14 and 3.15 (the offset tables are checked against them), a
//! debug build of 3.14, and binutils (the tests read the rootfs's symbol tables with its `nm`).
//!
//! Made once with `debootstrap --variant=minbase sid` (Debian package `debootstrap`) and
//! `apt-get install` run inside it by `chroot`; a few minutes on a fresh machine, then a stamp
//! file says it is ready and a second run does nothing. It is built in `target/sid-rootfs.new`
//! and renamed when whole, so an interrupted build is never taken for a ready one.
//!
//! Nothing on the host is written: debootstrap makes the device nodes of the rootfs inside its
//! own directory, and the `chroot` steps mount nothing.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cache;
use crate::run::{is_root, step, Cmd};

/// Debian's archive, as the machine's own apt sources name it.
const MIRROR: &str = "http://deb.debian.org/debian";

/// Packages installed into the rootfs after debootstrap, and why.
const PACKAGES: &[(&str, &str)] = &[
    ("python3.13", "a 3.13 distro build (stripped, no libpython)"),
    ("python3.14", "CPython 3.14"),
    ("python3.15", "CPython 3.15"),
    (
        "libpython3.14-dev",
        "3.14's headers, for the offset-table check",
    ),
    (
        "libpython3.15-dev",
        "3.15's headers, for the offset-table check",
    ),
    (
        "python3.14-dbg",
        "a debug build, which spanprof names in a warning and does not misread",
    ),
    (
        "libc6-dbg",
        "the C library's debug file: found in the target's root by build id, never the host's",
    ),
    (
        "binutils",
        "nm, which the tests read the rootfs's symbol tables with",
    ),
];

/// The tracing libraries of the span tests, for 3.14 and 3.15, in the rootfs's
/// `/opt/span-libs/3.X` (the same releases as pyenv's 3.13 gets, `deps.rs`).
const SPAN_LIBS: &[&str] = &["opentelemetry-sdk==1.45.2", "osprofiler==4.4.0"];
/// Minor versions that get them.
const SPAN_LIB_MINORS: [u8; 2] = [14, 15];

/// What the rootfs was made from: a change here rebuilds it.
fn recipe() -> String {
    let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    format!(
        "debootstrap --variant=minbase sid {MIRROR}; apt-get install {}\n\
         pip install --target /opt/span-libs/3.X {}\n",
        names.join(" "),
        SPAN_LIBS.join(" ")
    )
}

/// The ready rootfs, made when missing or made from another recipe. `pip_python` (the
/// tests' venv, `deps.rs`) installs the tracing libraries: the rootfs has no pip, and the
/// machine's proxy certificate is the host's.
pub fn ensure(root: &Path, pip_python: &Path) -> Result<PathBuf> {
    let dir = root.join("target/sid-rootfs");
    let stamp = dir.join(".spanprof-rootfs");
    let want = recipe();
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        step(&format!("Debian sid rootfs ready: {}", dir.display()));
        return Ok(dir);
    }
    if is_root() && cache::restore("sid-rootfs", &dir, ".spanprof-rootfs", &want) {
        match works(&dir) {
            Ok(()) => {
                step(&format!("Debian sid rootfs ready: {}", dir.display()));
                return Ok(dir);
            }
            Err(err) => eprintln!("xtask: warning: the cached rootfs: {err:#}; making it again"),
        }
    }
    if !is_root() {
        bail!(
            "the Debian sid rootfs of the container tests ({}) is missing; making it needs root \
             (debootstrap and chroot)",
            dir.display()
        );
    }
    if !Cmd::new("debootstrap").arg("--version").succeeds() {
        step("installing debootstrap (makes the sid rootfs of the container tests)");
        Cmd::new("apt-get")
            .args(["install", "-y", "debootstrap"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .run()?;
    }
    let new = root.join("target/sid-rootfs.new");
    remove(&new)?;
    step(&format!(
        "making the Debian sid rootfs of the container tests in {} (a few minutes)",
        new.display()
    ));
    Cmd::new("debootstrap")
        .args(["--variant=minbase", "sid"])
        .arg(&new)
        .arg(MIRROR)
        .run()
        .context("debootstrap of Debian sid failed")?;
    let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    for (package, why) in PACKAGES {
        step(&format!("  into the rootfs: {package} ({why})"));
    }
    // NB: sid's Release file here is older than the machine's clock: apt refuses it as
    // expired unless told not to check (debootstrap does not check it).
    Cmd::new("chroot")
        .arg(&new)
        .args([
            "apt-get",
            "-o",
            "Acquire::Check-Valid-Until=false",
            "install",
            "-y",
            "--no-install-recommends",
        ])
        .args(&names)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .run()
        .context("apt-get install inside the sid rootfs failed")?;
    Cmd::new("chroot")
        .arg(&new)
        .args(["apt-get", "clean"])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .run()?;
    for minor in [13, 14, 15] {
        let python = format!("/usr/bin/python3.{minor}");
        if !Cmd::new("chroot")
            .arg(&new)
            .args([python.as_str(), "-c", "import threading"])
            .succeeds()
        {
            bail!("{python} does not run in the sid rootfs {}", new.display());
        }
    }
    // Wheels for the rootfs's interpreters, by the host's pip (pure Python, or built for
    // CPython 3.X on manylinux x86_64).
    for minor in SPAN_LIB_MINORS {
        let dir = new.join(format!("opt/span-libs/3.{minor}"));
        Cmd::new(pip_python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--only-binary=:all:",
                "--implementation",
                "cp",
            ])
            .arg("--python-version")
            .arg(format!("3.{minor}"))
            .arg("--abi")
            .arg(format!("cp3{minor}"))
            .args([
                "--abi",
                "abi3",
                "--abi",
                "none",
                "--platform",
                "manylinux_2_17_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "any",
            ])
            .arg("--target")
            .arg(&dir)
            .args(SPAN_LIBS)
            .run()
            .with_context(|| format!("installing the tracing libraries for 3.{minor}"))?;
    }
    works(&new)?;
    // The directory the container tests pivot_root away from.
    std::fs::create_dir_all(new.join(".oldroot"))?;
    std::fs::write(new.join(".spanprof-rootfs"), &want)?;
    remove(&dir)?;
    std::fs::rename(&new, &dir)
        .with_context(|| format!("renaming {} to {}", new.display(), dir.display()))?;
    cache::store("sid-rootfs", &dir);
    step(&format!("Debian sid rootfs ready: {}", dir.display()));
    Ok(dir)
}

/// Checks a rootfs as if just made: each interpreter with the tracing libraries runs in it.
fn works(dir: &Path) -> Result<()> {
    for minor in SPAN_LIB_MINORS {
        let probe = Cmd::new("chroot")
            .arg(dir)
            .args(["env", &format!("PYTHONPATH=/opt/span-libs/3.{minor}")])
            .arg(format!("/usr/bin/python3.{minor}"))
            .args(["-c", "import opentelemetry.sdk.trace, osprofiler.profiler"]);
        if !probe.succeeds() {
            bail!("python3.{minor} in the rootfs cannot import the tracing libraries");
        }
    }
    Ok(())
}

fn remove(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("removing {}", dir.display())),
    }
}
