//! `cargo xtask dist`: a release tarball and a Debian package of spanprof, in `target/dist/`.
//!
//! Both hold the binary (its debug information stripped), the manual pages and the shell
//! completions it generates, the daemon's systemd unit and configuration (`dist/`), and
//! README.md:
//! - `spanprof-VERSION-x86_64-linux.tar.gz`: under `spanprof-VERSION/`, `bin/`, `share/`
//!   (`man/man1`, `bash-completion/completions`, `zsh/site-functions`,
//!   `fish/vendor_completions.d`), `etc/spanprof/spanprof.toml`,
//!   `lib/systemd/system/spanprof.service` (its `ExecStart` names `/usr/local/bin/spanprof`, where
//!   the tarball's INSTALL puts it), README.md and INSTALL;
//! - `spanprof_VERSION_amd64.deb` (`dpkg-deb`): the binary in `/usr/bin` (the unit's `ExecStart`
//!   rewritten to it), the unit in `/usr/lib/systemd/system`, the configuration a conffile, and a postinst that makes a system group
//!   `spanprof` and gives the binary to it, mode 0750, with the capabilities to profile any
//!   process (`setcap`, from libcap2-bin, which the package recommends): members of the group
//!   profile without sudo. The unit is installed, not enabled.
//!
//! `tests/tests/dist.rs` installs the package in an overlay of the sid rootfs and runs it there.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::run::{step, Cmd};

/// The capabilities the package's postinst gives the binary: every mode but allocation profiles
/// (which need CAP_SYS_ADMIN) on any process (README.md's Install section).
pub const CAPABILITIES: &str =
    "cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep";

/// The workspace's version (`[workspace.package] version` of Cargo.toml).
fn version(root: &Path) -> Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    manifest
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix("version = \"")?;
            Some(v.trim_end_matches('"').to_string())
        })
        .context("no version in Cargo.toml")
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let text = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", to.display()))
}

/// The standard output of `bin args…`.
fn output_of(bin: &Path, args: &[&str]) -> Result<String> {
    let out = Cmd::new(bin).args(args).quiet().output()?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed: {}",
            bin.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).context("the output is not UTF-8")
}

/// The newest `GLIBC_x.y` symbol version `bin` needs (for the package's dependency on libc6).
fn glibc_needed(bin: &Path) -> Result<String> {
    let out = Cmd::new("objdump").arg("-T").arg(bin).quiet().output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut best: Option<(u32, u32)> = None;
    for word in text.split_whitespace() {
        let Some(v) = word
            .trim_matches(|c| c == '(' || c == ')')
            .strip_prefix("GLIBC_")
        else {
            continue;
        };
        let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
        if let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) {
            best = best.max(Some((major, minor)));
        }
    }
    let (major, minor) = best.context("objdump -T shows no GLIBC_ symbol version")?;
    Ok(format!("{major}.{minor}"))
}

/// The files both artifacts hold, under `dir` in the tarball's layout (`bin/`, `share/`, `etc/`,
/// `lib/`), with the unit's `ExecStart` naming `bin_path`.
fn stage(root: &Path, bin: &Path, dir: &Path, bin_path: &str, man_gz: bool) -> Result<()> {
    let stripped = dir.join("bin/spanprof");
    fs::create_dir_all(stripped.parent().expect("bin/")).context("creating bin/")?;
    Cmd::new("objcopy")
        .arg("--strip-debug")
        .arg(bin)
        .arg(&stripped)
        .run()?;
    fs::set_permissions(&stripped, fs::Permissions::from_mode(0o755))?;
    let man = dir.join("share/man/man1");
    fs::create_dir_all(&man).context("creating share/man/man1")?;
    Cmd::new(&stripped)
        .args(["man", "--dir"])
        .arg(&man)
        .quiet()
        .run()?;
    if man_gz {
        for page in fs::read_dir(&man)? {
            // Debian policy: manual pages compressed with gzip -9, without a time stamp.
            Cmd::new("gzip")
                .args(["-9n"])
                .arg(page?.path())
                .quiet()
                .run()?;
        }
    }
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/spanprof"),
        ("zsh", "share/zsh/site-functions/_spanprof"),
        ("fish", "share/fish/vendor_completions.d/spanprof.fish"),
    ] {
        write(
            &dir.join(path),
            &output_of(&stripped, &["completions", shell])?,
            0o644,
        )?;
    }
    copy(
        &root.join("dist/spanprof.toml"),
        &dir.join("etc/spanprof/spanprof.toml"),
        0o644,
    )?;
    let unit = fs::read_to_string(root.join("dist/spanprof.service"))?;
    if !unit.contains("/usr/local/bin/spanprof") {
        bail!("dist/spanprof.service does not run /usr/local/bin/spanprof");
    }
    write(
        &dir.join("lib/systemd/system/spanprof.service"),
        &unit.replace("/usr/local/bin/spanprof", bin_path),
        0o644,
    )?;
    Ok(())
}

/// How to install the tarball (its INSTALL file).
const INSTALL: &str = "\
spanprof: a low-overhead eBPF sampling profiler with trace correlation (x86_64 Linux 5.17 or
later with BTF; `dump` needs 6.8). As root, from this directory:

  install -m 0755 bin/spanprof /usr/local/bin/spanprof
  install -d /usr/local/share/man/man1 && install -m 0644 share/man/man1/* /usr/local/share/man/man1/
  install -m 0644 share/bash-completion/completions/spanprof /etc/bash_completion.d/spanprof
  # the daemon (optional): docs/daemon.md
  install -d /etc/spanprof && install -m 0644 etc/spanprof/spanprof.toml /etc/spanprof/
  install -m 0644 lib/systemd/system/spanprof.service /etc/systemd/system/

spanprof runs as root, or with capabilities on the binary:

  setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep /usr/local/bin/spanprof

which lets whoever can run it profile any process: restrict who can (a group, mode 0750).
See README.md, and `spanprof help`.
";

/// The Debian package's postinst.
fn postinst() -> String {
    format!(
        "#!/bin/sh
# spanprof: a system group whose members may run spanprof, which gets the capabilities to
# profile any process (README.md, Install). Without setcap (libcap2-bin), root only.
set -e
if [ \"$1\" = configure ]; then
    if ! getent group spanprof >/dev/null; then
        groupadd --system spanprof
    fi
    # An owner and mode the administrator set (dpkg-statoverride) stay as they are.
    if ! dpkg-statoverride --list /usr/bin/spanprof >/dev/null 2>&1; then
        chown root:spanprof /usr/bin/spanprof
        chmod 0750 /usr/bin/spanprof
    fi
    if command -v setcap >/dev/null 2>&1; then
        if ! setcap {CAPABILITIES} /usr/bin/spanprof; then
            echo \"spanprof: setcap failed (a file system without capabilities?): only root can profile\" >&2
        fi
    else
        echo \"spanprof: setcap not found: only root can profile; install libcap2-bin, then dpkg-reconfigure spanprof\" >&2
    fi
fi
exit 0
"
    )
}

/// Makes the tarball and the package of the release binary `bin`; returns their directory.
pub fn build(root: &Path, bin: &Path) -> Result<PathBuf> {
    let version = version(root)?;
    let out = root.join("target/dist");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(&out)?;

    step("dist: the tarball");
    let name = format!("spanprof-{version}");
    let tree = out.join("tar").join(&name);
    stage(root, bin, &tree, "/usr/local/bin/spanprof", false)?;
    copy(&root.join("README.md"), &tree.join("README.md"), 0o644)?;
    write(&tree.join("INSTALL"), INSTALL, 0o644)?;
    let tarball = out.join(format!("{name}-x86_64-linux.tar.gz"));
    Cmd::new("tar")
        .args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--sort=name",
            "-czf",
        ])
        .arg(&tarball)
        .arg("-C")
        .arg(out.join("tar"))
        .arg(&name)
        .run()?;

    step("dist: the Debian package");
    let pkg = out.join("deb");
    let usr = pkg.join("usr");
    stage(root, bin, &usr, "/usr/bin/spanprof", true)?;
    // The tarball's layout, moved where Debian puts each part.
    fs::rename(usr.join("etc"), pkg.join("etc"))?;
    fs::rename(
        usr.join("share/zsh/site-functions"),
        usr.join("share/zsh/vendor-completions"),
    )?;
    let doc = usr.join("share/doc/spanprof");
    copy(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    write(
        &doc.join("copyright"),
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: spanprof\n\nFiles: *\nCopyright: the spanprof developers\n\
         License: MIT OR Apache-2.0\n",
        0o644,
    )?;
    let size_kib = du_kib(&pkg)?;
    let control = format!(
        "Package: spanprof\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: spanprof developers <spanprof@example.invalid>\n\
         Installed-Size: {size_kib}\n\
         Depends: libc6 (>= {glibc}), libgcc-s1\n\
         Recommends: libcap2-bin\n\
         Section: devel\n\
         Priority: optional\n\
         Homepage: https://example.invalid/spanprof\n\
         Description: low-overhead eBPF sampling profiler with trace correlation\n \
         spanprof samples on-CPU and off-CPU stacks and allocations of Python and native\n \
         processes with eBPF, tags every sample with the OpenTelemetry span or OSProfiler\n \
         trace point its thread was in, and writes flame graphs, pprof, speedscope and OTLP\n \
         profiles. Members of the group spanprof may run it (with the capabilities to\n \
         profile any process) when libcap2-bin is installed; otherwise root.\n",
        glibc = glibc_needed(bin)?,
    );
    write(&pkg.join("DEBIAN/control"), &control, 0o644)?;
    write(
        &pkg.join("DEBIAN/conffiles"),
        "/etc/spanprof/spanprof.toml\n",
        0o644,
    )?;
    write(&pkg.join("DEBIAN/postinst"), &postinst(), 0o755)?;
    let deb = out.join(format!("spanprof_{version}_amd64.deb"));
    Cmd::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&pkg)
        .arg(&deb)
        .run()?;
    for staging in [out.join("tar"), pkg] {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    let mut line = std::io::stderr();
    let _ = writeln!(
        line,
        "xtask: dist: {} and {}",
        tarball.display(),
        deb.display()
    );
    Ok(out)
}

/// The size of the files under `dir` in KiB (the package's Installed-Size), DEBIAN/ aside.
fn du_kib(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                if e.file_name() != "DEBIAN" {
                    stack.push(e.path());
                }
            } else {
                total += meta.len().div_ceil(1024);
            }
        }
    }
    Ok(total)
}
