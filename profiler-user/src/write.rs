//! Output files: checked before the session, written atomically with mode 0600 after it.
//!
//! Each output is first created as a hidden temporary file (`O_EXCL`, mode 0600) next to its
//! destination, which proves early that the path is writable; the bytes go to that file and a
//! `rename` puts it in place. A failed session removes the temporary files, so no partial or
//! garbage output is ever left at the destination, and a symlink at the destination is
//! replaced rather than followed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// An output file being prepared.
#[derive(Debug)]
pub struct PendingOutput {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
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
        Ok(PendingOutput {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(file),
        })
    }

    /// Where the output goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Writes `bytes` and moves the file into place. The error does not repeat the path.
    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        let mut file = self.file.take().expect("not committed twice");
        let res = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&self.tmp, &self.dest));
        // NB: the caller names the output; this error is only the cause.
        res.map_err(anyhow::Error::from)
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
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
        // A symlink at the destination is replaced, not followed.
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, &dest).unwrap();
        let out = PendingOutput::create(&dest).unwrap();
        out.commit(b"a;b 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "a;b 1\n");
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
        std::fs::remove_dir_all(&dir).unwrap();

        let err = PendingOutput::create(Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("cannot write output /nonexistent-dir/x.svg"));
    }
}
