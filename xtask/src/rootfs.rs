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
        "binutils",
        "nm, which the tests read the rootfs's symbol tables with",
    ),
];

/// What the rootfs was made from: a change here rebuilds it.
fn recipe() -> String {
    let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    format!(
        "debootstrap --variant=minbase sid {MIRROR}; apt-get install {}\n",
        names.join(" ")
    )
}

/// The ready rootfs, made when missing or made from another recipe.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/sid-rootfs");
    let stamp = dir.join(".spanprof-rootfs");
    let want = recipe();
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        step(&format!("Debian sid rootfs ready: {}", dir.display()));
        return Ok(dir);
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
    // The directory the container tests pivot_root away from.
    std::fs::create_dir_all(new.join(".oldroot"))?;
    std::fs::write(new.join(".spanprof-rootfs"), &want)?;
    remove(&dir)?;
    std::fs::rename(&new, &dir)
        .with_context(|| format!("renaming {} to {}", new.display(), dir.display()))?;
    step(&format!("Debian sid rootfs ready: {}", dir.display()));
    Ok(dir)
}

fn remove(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("removing {}", dir.display())),
    }
}
