//! Output files: checked before the session, written atomically with mode 0600 after it.
//!
//! Each output is first created as a hidden temporary file (`O_EXCL`, mode 0600) next to its
//! destination, which proves early that the path is writable; the bytes go to that file and a
//! `rename` puts it in place. A failed session removes the temporary files, so no partial or
//! garbage output is ever left at the destination. A symlink at the destination is refused
//! (it could point anywhere a privileged spanprof may write); one put there during the session
//! is replaced by the rename, never followed.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use anyhow::{Context, Result};

/// An output file being prepared.
#[derive(Debug)]
pub struct PendingOutput {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    /// Slot of `tmp` in [`TEMP_PATHS`], if it got one.
    slot: Option<usize>,
}

/// Temporary files that exist now, for [`remove_temp_files`] in a signal handler: fixed slots of
/// leaked C strings, so the handler never reads freed memory and never allocates.
static TEMP_PATHS: [AtomicPtr<libc::c_char>; 32] = [const { AtomicPtr::new(ptr::null_mut()) }; 32];

fn register_temp(path: &Path) -> Option<usize> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // NB: leaked on purpose (a few bytes per output): a handler may read it at any time.
    let raw = c.into_raw();
    let slot = TEMP_PATHS.iter().position(|s| {
        s.compare_exchange(ptr::null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    if slot.is_none() {
        // SAFETY: `raw` came from CString::into_raw just above and was not shared.
        drop(unsafe { CString::from_raw(raw) });
    }
    slot
}

/// Removes every temporary output file. Async-signal-safe (atomic loads and `unlink`), for the
/// handler of a second Ctrl-C, which ends spanprof without writing the outputs.
pub fn remove_temp_files() {
    for slot in &TEMP_PATHS {
        let p = slot.load(Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: a NUL-terminated string that is never freed.
            unsafe { libc::unlink(p) };
        }
    }
}

impl PendingOutput {
    /// Creates the temporary file next to `dest`; fails if the directory is not writable.
    pub fn create(dest: &Path) -> Result<PendingOutput> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dest
            .file_name()
            .with_context(|| format!("cannot write output {}: not a file name", dest.display()))?;
        if dest.is_dir() {
            anyhow::bail!("cannot write output {}: is a directory", dest.display());
        }
        if dest
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            anyhow::bail!(
                "cannot write output {}: it is a symbolic link, and outputs are never written \
                 through one (remove it or choose another path)",
                dest.display()
            );
        }
        let tmp = dir.join(format!(
            ".{}.spanprof-{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| anyhow::anyhow!("cannot write output {}: {e}", dest.display()))?;
        if let Some((uid, gid)) = sudo_user() {
            chown(&file, uid, gid);
        }
        let slot = register_temp(&tmp);
        Ok(PendingOutput {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(file),
            slot,
        })
    }

    /// Where the output goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Writes `bytes` and moves the file into place. The error does not repeat the path.
    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        let mut file = self.file.take().expect("not committed twice");
        self.unregister();
        let res = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&self.tmp, &self.dest));
        // NB: the caller names the output; this error is only the cause.
        res.map_err(anyhow::Error::from)
    }
}

/// Under `sudo` (root, with `SUDO_UID` and `SUDO_GID` set), the user who ran sudo: outputs are
/// handed to them so `sudo spanprof … -o flame.svg` leaves a file they can open (still 0600).
fn sudo_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |var: &str| std::env::var(var).ok()?.parse::<u32>().ok();
    Some((id("SUDO_UID")?, id("SUDO_GID")?))
}

/// Best effort: a failure leaves the file spanprof's.
fn chown(file: &File, uid: u32, gid: u32) {
    use std::os::fd::AsRawFd;
    // SAFETY: fchown on an fd we own.
    unsafe { libc::fchown(file.as_raw_fd(), uid, gid) };
}

impl PendingOutput {
    fn unregister(&mut self) {
        if let Some(slot) = self.slot.take() {
            // NB: the string stays allocated (see TEMP_PATHS); only the slot is freed.
            TEMP_PATHS[slot].store(ptr::null_mut(), Ordering::SeqCst);
        }
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        self.unregister();
        // Committed files were renamed away; anything else is a leftover to remove.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_0600_atomically_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("spanprof-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("out.folded");
        // A symlink at the destination is refused.
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, &dest).unwrap();
        let err = PendingOutput::create(&dest).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        std::fs::remove_file(&dest).unwrap();
        // One put there during the session is replaced by the rename, not followed.
        let out = PendingOutput::create(&dest).unwrap();
        std::os::unix::fs::symlink(&victim, &dest).unwrap();
        out.commit(b"a;b 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "a;b 1\n");
        assert!(!dest.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let dropped = dir.join("never.svg");
        drop(PendingOutput::create(&dropped).unwrap());
        assert!(!dropped.exists());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "no temp file left"
        );

        // chown as sudo would have it (root only: elsewhere fchown fails and nothing changes).
        let owned = dir.join("owned.svg");
        let out = PendingOutput::create(&owned).unwrap();
        chown(out.file.as_ref().unwrap(), 65534, 65534);
        out.commit(b"<svg/>").unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&owned).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        }

        // What the handler of a second Ctrl-C does: every temporary file goes, none is left.
        let pending = PendingOutput::create(&dir.join("interrupted.svg")).unwrap();
        assert!(pending.tmp.exists());
        remove_temp_files();
        assert!(!pending.tmp.exists());
        drop(pending);
        std::fs::remove_dir_all(&dir).unwrap();

        let err = PendingOutput::create(Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("cannot write output /nonexistent-dir/x.svg"));
    }
}
