//! The release artifacts of `cargo xtask dist` (`target/dist`): the Debian package installs
//! with `dpkg -i` in an overlay of the Debian sid rootfs (its postinst run there), gives the
//! binary to the group `spanprof` with the profiling capabilities when `setcap` is there, and
//! `spanprof --version` runs there; the tarball holds what its INSTALL lists, and its binary runs.

use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use spanprof_tests::rootfs::rootfs;
use spanprof_tests::{dist_file, require_root, TempDir};

/// A writable view of the sid rootfs: an overlay whose changes go to a temporary directory, so
/// the shared rootfs stays as it was. Unmounted on drop.
struct Overlay {
    merged: PathBuf,
    _tmp: TempDir,
}

impl Overlay {
    fn new(lower: &Path) -> Self {
        let tmp = TempDir::new("dist-overlay");
        let (upper, work, merged) = (tmp.join("upper"), tmp.join("work"), tmp.join("merged"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).expect("overlay directories");
        }
        let c = |p: &Path| CString::new(p.to_str().expect("UTF-8")).expect("no NUL");
        let options = CString::new(format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        ))
        .expect("no NUL");
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"overlay".as_ptr(),
                c(&merged).as_ptr(),
                c"overlay".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount an overlay of {}: {}",
            lower.display(),
            std::io::Error::last_os_error()
        );
        Self { merged, _tmp: tmp }
    }

    /// `argv` run chrooted in the overlay: (status ok, stdout, stderr).
    fn run(&self, argv: &[&str]) -> (bool, String, String) {
        let out = Command::new("chroot")
            .arg(&self.merged)
            .args(argv)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("run chroot");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn path(&self, inside: &str) -> PathBuf {
        self.merged.join(inside.trim_start_matches('/'))
    }

    /// Installs the package; returns dpkg's stderr.
    fn install(&self, deb: &Path) -> String {
        std::fs::copy(deb, self.path("/tmp/spanprof.deb")).expect("copy the package in");
        let (ok, stdout, stderr) = self.run(&["dpkg", "-i", "/tmp/spanprof.deb"]);
        assert!(ok, "dpkg -i failed:\n{stdout}\n{stderr}");
        stderr
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let path = CString::new(self.merged.to_str().unwrap_or_default()).unwrap_or_default();
        // SAFETY: umount2(2) of the overlay this value mounted.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// The gid of `group` in the overlay's /etc/group.
fn gid_of(o: &Overlay, group: &str) -> Option<u32> {
    let groups = std::fs::read_to_string(o.path("/etc/group")).ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == group).then(|| f.nth(1)?.parse().ok())?
    })
}

#[test]
fn the_package_installs_in_a_fresh_sid_rootfs_and_runs_there() {
    require_root();
    let deb = dist_file(".deb");
    let o = Overlay::new(&rootfs());
    assert!(
        !o.path("/usr/sbin/setcap").exists(),
        "the sid rootfs has no setcap: this test is of the postinst without it"
    );
    let stderr = o.install(&deb);
    assert!(
        stderr.contains("setcap not found: only root can profile"),
        "the postinst says why the binary has no capabilities: {stderr}"
    );
    let (ok, version, err) = o.run(&["/usr/bin/spanprof", "--version"]);
    assert!(ok, "spanprof --version in the rootfs: {err}");
    assert!(version.starts_with("spanprof "), "{version}");
    let meta = std::fs::metadata(o.path("/usr/bin/spanprof")).expect("installed binary");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    assert_eq!(
        Some(meta.gid()),
        gid_of(&o, "spanprof"),
        "owned by group spanprof"
    );
    for file in [
        "/usr/share/man/man1/spanprof.1.gz",
        "/usr/share/man/man1/spanprof-dump.1.gz",
        "/usr/share/bash-completion/completions/spanprof",
        "/usr/share/zsh/vendor-completions/_spanprof",
        "/usr/share/fish/vendor_completions.d/spanprof.fish",
        "/usr/share/doc/spanprof/copyright",
        "/etc/spanprof/spanprof.toml",
    ] {
        assert!(o.path(file).is_file(), "{file} is not installed");
    }
    let unit = std::fs::read_to_string(o.path("/usr/lib/systemd/system/spanprof.service"))
        .expect("the unit is installed");
    assert!(
        unit.lines()
            .any(|l| l.starts_with("ExecStart=/usr/bin/spanprof daemon")),
        "the unit runs the installed binary:\n{unit}"
    );
    // The completions it installed are the binary's own.
    let (ok, bash, _) = o.run(&["/usr/bin/spanprof", "completions", "bash"]);
    assert!(ok);
    assert_eq!(
        std::fs::read_to_string(o.path("/usr/share/bash-completion/completions/spanprof"))
            .expect("read"),
        bash
    );
    let (ok, _, err) = o.run(&["dpkg", "-r", "spanprof"]);
    assert!(ok, "dpkg -r: {err}");
    assert!(!o.path("/usr/bin/spanprof").exists(), "removed");
}

#[test]
fn with_setcap_the_postinst_gives_the_binary_its_capabilities() {
    require_root();
    let deb = dist_file(".deb");
    let o = Overlay::new(&rootfs());
    // libcap2-bin's setcap and its library, from the host (Debian 12 builds run on sid).
    for (host, inside) in [
        ("/usr/sbin/setcap", "/usr/sbin/setcap"),
        (
            "/lib/x86_64-linux-gnu/libcap.so.2",
            "/usr/lib/x86_64-linux-gnu/libcap.so.2",
        ),
    ] {
        if !Path::new(host).exists() {
            spanprof_tests::missing_prerequisite(host, "apt-get install libcap2-bin");
        }
        // The rootfs's own, where it has one.
        if !o.path(inside).exists() {
            std::fs::copy(host, o.path(inside)).expect("copy setcap in");
        }
    }
    let stderr = o.install(&deb);
    assert!(!stderr.contains("setcap"), "no complaint: {stderr}");
    let out = Command::new("getcap")
        .arg(o.path("/usr/bin/spanprof"))
        .output()
        .expect("getcap");
    let caps = String::from_utf8_lossy(&out.stdout);
    for cap in [
        "cap_bpf",
        "cap_perfmon",
        "cap_sys_ptrace",
        "cap_dac_read_search",
        "cap_syslog",
    ] {
        assert!(caps.contains(cap), "{cap} not set: {caps:?}");
    }
    assert!(
        caps.trim_end().ends_with("=ep"),
        "effective and permitted: {caps:?}"
    );

    // A member of the group (nobody, with the group spanprof) runs it with those capabilities;
    // the subcommands that read the files they are given give them up, and the daemon is
    // refused.
    let gid = gid_of(&o, "spanprof").expect("the group spanprof");
    let user = format!("--userspec=65534:{gid}");
    let as_member = |args: &[&str]| {
        let out = Command::new("/usr/sbin/chroot")
            .arg(&user)
            .arg(&o.merged)
            .arg("/usr/bin/spanprof")
            .args(args)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("run chroot");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = as_member(&["--version"]);
    assert_eq!(code, Some(0), "the group may run it: {err}");
    let (code, err) = as_member(&["report", "/etc/shadow"]);
    assert_ne!(code, Some(0));
    assert!(
        err.to_lowercase().contains("permission denied"),
        "report reads /etc/shadow as its user, without CAP_DAC_READ_SEARCH: {err}"
    );
    let (code, err) = as_member(&["daemon"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("spanprof daemon runs as root"), "{err}");
}

#[test]
fn the_tarball_holds_the_binary_manual_completions_and_daemon_files() {
    let tarball = dist_file("-x86_64-linux.tar.gz");
    let out = Command::new("tar")
        .arg("-tzf")
        .arg(&tarball)
        .output()
        .expect("tar");
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    let name = tarball
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix("-x86_64-linux.tar.gz"))
        .expect("spanprof-VERSION");
    for file in [
        "bin/spanprof",
        "share/man/man1/spanprof.1",
        "share/man/man1/spanprof-profile.1",
        "share/bash-completion/completions/spanprof",
        "share/zsh/site-functions/_spanprof",
        "share/fish/vendor_completions.d/spanprof.fish",
        "etc/spanprof/spanprof.toml",
        "lib/systemd/system/spanprof.service",
        "README.md",
        "INSTALL",
    ] {
        let entry = format!("{name}/{file}");
        assert!(
            listing.lines().any(|l| l == entry),
            "{entry} not in the tarball:\n{listing}"
        );
    }
    let tmp = TempDir::new("dist-tarball");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(tmp.join(""))
        .status()
        .expect("tar -x");
    assert!(status.success());
    let bin = tmp.join(&format!("{name}/bin/spanprof"));
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .expect("run it");
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        version.trim(),
        name.replacen('-', " ", 1),
        "its version is the tarball's"
    );
}
