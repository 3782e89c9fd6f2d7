//! Output files: checked before the session, written atomically with mode 0600 after it.
//!
//! Each output is first created as a hidden temporary file (`O_EXCL`, mode 0600) next to its
//! destination, which proves early that the path is writable; the bytes go to that file and a
//! `rename` puts it in place. A failed session removes the temporary files, so no partial or
//! garbage output is ever left at the destination. A symlink at the destination is refused
//! (it could point anywhere a privileged spanprof may write); one put there during the session
//! is replaced by the rename, never followed.
//!
//! A character device or a FIFO at the destination (`-o /dev/null`, `-o /dev/stdout`, a named
//! pipe), directly or through a symlink (to a FIFO, a terminal or the null device only), is
//! written into instead: never replaced, never
//! truncated, no temporary file next to it. A character device is opened at once (so a
//! refusal comes before the session); a FIFO only when the bytes are ready, since opening one
//! waits for its reader: at most [`FIFO_WAIT`] for a reader to open it, and as long again for
//! one that stops reading, and never past a stop signal (`commit_until`'s `give_up`). Block
//! devices, sockets and other special files are refused.
//!
//! A node spanprof did not create is written into only if it is spanprof's own standard
//! input, output or error, or is owned by root or the invoking user (the real user id, or
//! under sudo `SUDO_UID`), and never through a symbolic link another user owns: in a shared
//! directory (`/tmp`), another user's FIFO or link to their terminal must not receive a
//! privileged spanprof's profile.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use anyhow::{Context, Result};

/// How long a FIFO output waits for a reader to open it, and for a reader that stopped
/// reading to take more.
pub const FIFO_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The pause between two looks for a FIFO's reader.
const FIFO_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// An output file being prepared.
#[derive(Debug)]
pub struct PendingOutput {
    dest: PathBuf,
    sink: Sink,
}

/// Where an output's bytes go.
#[derive(Debug)]
enum Sink {
    /// A regular file: a temporary file next to `dest`, renamed over it.
    Rename {
        tmp: PathBuf,
        file: Option<File>,
        /// Slot of `tmp` in [`TEMP_PATHS`], if it got one.
        slot: Option<usize>,
    },
    /// A character device, opened already: written into.
    Device(Option<File>),
    /// A FIFO: opened (for writing, waiting for a reader) and written into at commit.
    Fifo,
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
    /// Creates the temporary file next to `dest` (or opens the device there); fails if the
    /// directory is not writable or `dest` is a special file outputs cannot go to.
    pub fn create(dest: &Path) -> Result<PendingOutput> {
        let shown = dest.display();
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dest
            .file_name()
            .with_context(|| format!("cannot write output {shown}: not a file name"))?;
        // NB: `metadata` follows a symlink: `/dev/stdout` is one, to `/proc/self/fd/1`.
        let followed = dest.metadata().ok().map(|m| m.file_type());
        let link = dest
            .symlink_metadata()
            .ok()
            .filter(|m| m.file_type().is_symlink());
        let is_link = link.is_some();
        if let Some(link) = &link {
            use std::os::unix::fs::MetadataExt;
            if followed.is_some_and(|t| t.is_char_device() || t.is_fifo())
                && !trusted_owner(link.uid())
            {
                anyhow::bail!(
                    "cannot write output {shown}: it is a symbolic link owned by another user \
                     (uid {}), and outputs are never written through one",
                    link.uid()
                );
            }
        }
        match followed {
            Some(t) if t.is_dir() => {
                anyhow::bail!("cannot write output {shown}: is a directory")
            }
            Some(t) if t.is_char_device() => {
                // The owner is checked before the device is opened (opening one can act), and
                // again on what was opened.
                let meta = dest
                    .metadata()
                    .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?;
                let refused =
                    |e: anyhow::Error| anyhow::anyhow!("cannot write output {shown}: {e}");
                owner_allowed(&meta).map_err(refused)?;
                let file = open_device(dest)?;
                check_owner(&file).map_err(refused)?;
                // Through a symlink, only what `/dev/stdout` leads to: a terminal or the null
                // device (a planted link must not make a privileged spanprof write elsewhere).
                if is_link && !terminal_or_null(&file) {
                    anyhow::bail!(
                        "cannot write output {shown}: it is a symbolic link to a character device \
                         that is neither a terminal nor the null device"
                    );
                }
                return Ok(PendingOutput {
                    dest: dest.to_path_buf(),
                    sink: Sink::Device(Some(file)),
                });
            }
            Some(t) if t.is_fifo() => {
                // Checked now, so a refusal comes before the session, and again when opened.
                let meta = dest
                    .metadata()
                    .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?;
                owner_allowed(&meta)
                    .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?;
                return Ok(PendingOutput {
                    dest: dest.to_path_buf(),
                    sink: Sink::Fifo,
                });
            }
            Some(t) if !t.is_file() => {
                anyhow::bail!(
                    "cannot write output {shown}: it is a {}; outputs go to regular files, \
                     character devices (such as /dev/null) or FIFOs",
                    special_kind(t)
                )
            }
            _ => {}
        }
        if is_link {
            anyhow::bail!(
                "cannot write output {shown}: it is a symbolic link, and outputs are never written \
                 through one (remove it or choose another path)"
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
            .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?;
        if let Some((uid, gid)) = sudo_user() {
            chown(&file, uid, gid);
        }
        let slot = register_temp(&tmp);
        Ok(PendingOutput {
            dest: dest.to_path_buf(),
            sink: Sink::Rename {
                tmp,
                file: Some(file),
                slot,
            },
        })
    }

    /// Where the output goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Writes `bytes` and moves the file into place (or writes them into the device or FIFO).
    /// The error does not repeat the path.
    pub fn commit(self, bytes: &[u8]) -> Result<()> {
        self.commit_until(bytes, &|| false)
    }

    /// As [`PendingOutput::commit`]; a FIFO's wait for its reader ends when `give_up` says so
    /// (a stop signal came), as after [`FIFO_WAIT`].
    pub fn commit_until(mut self, bytes: &[u8], give_up: &dyn Fn() -> bool) -> Result<()> {
        // NB: the caller names the output; these errors are only the cause.
        match &mut self.sink {
            Sink::Rename { tmp, file, .. } => {
                let mut file = file.take().expect("not committed twice");
                let tmp = tmp.clone();
                self.unregister();
                file.write_all(bytes)
                    .and_then(|()| file.sync_all())
                    .and_then(|()| std::fs::rename(&tmp, &self.dest))?;
            }
            Sink::Device(file) => {
                let mut file = file.take().expect("not committed twice");
                file.write_all(bytes)?;
            }
            Sink::Fifo => {
                let file = open_fifo(&self.dest, give_up)?;
                check_owner(&file)?;
                write_fifo(&file, bytes, give_up)?;
            }
        }
        Ok(())
    }
}

/// Opens the character device at `path` for writing, without creating or truncating
/// anything, and checks that the file opened is still one (the path may have changed since it
/// was looked at).
fn open_device(path: &Path) -> Result<File> {
    let shown = path.display();
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?;
    let kind = file
        .metadata()
        .map_err(|e| anyhow::anyhow!("cannot write output {shown}: {e}"))?
        .file_type();
    if !kind.is_char_device() {
        anyhow::bail!(
            "cannot write output {shown}: it changed to a {} while spanprof opened it",
            special_kind(kind)
        );
    }
    Ok(file)
}

/// Opens the FIFO at `path` for writing once a reader has it open: looks every [`FIFO_POLL`]
/// for [`FIFO_WAIT`] at most, or until `give_up`. Non-blocking, so that [`write_fifo`] can
/// give up too.
fn open_fifo(path: &Path, give_up: &dyn Fn() -> bool) -> Result<File> {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        let opened = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path);
        match opened {
            Ok(file) => {
                if !file.metadata()?.file_type().is_fifo() {
                    anyhow::bail!("it changed to another kind of file while spanprof opened it");
                }
                return Ok(file);
            }
            // No reader yet.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                if give_up() {
                    anyhow::bail!("a stop signal came while waiting for a reader of the FIFO");
                }
                if started.elapsed() >= FIFO_WAIT {
                    anyhow::bail!("no reader opened the FIFO within {} s", FIFO_WAIT.as_secs());
                }
                if !said && started.elapsed() >= std::time::Duration::from_secs(1) {
                    said = true;
                    eprintln!(
                        "spanprof: waiting up to {} s for a reader of the FIFO {}",
                        FIFO_WAIT.as_secs(),
                        path.display()
                    );
                }
                std::thread::sleep(FIFO_POLL);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `bytes` into the FIFO `file` (non-blocking): waits while its reader takes nothing, for
/// [`FIFO_WAIT`] at most, or until `give_up`.
fn write_fifo(mut file: &File, bytes: &[u8], give_up: &dyn Fn() -> bool) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mut rest = bytes;
    let mut progress = std::time::Instant::now();
    while !rest.is_empty() {
        match file.write(rest) {
            Ok(n) => {
                rest = &rest[n..];
                progress = std::time::Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if give_up() {
                    anyhow::bail!("a stop signal came while the FIFO's reader took nothing");
                }
                if progress.elapsed() >= FIFO_WAIT {
                    anyhow::bail!(
                        "the FIFO's reader took nothing for {} s",
                        FIFO_WAIT.as_secs()
                    );
                }
                let mut fd = libc::pollfd {
                    fd: file.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a timeout in ms.
                unsafe { libc::poll(&mut fd, 1, FIFO_POLL.as_millis() as libc::c_int) };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a node owned by `uid` may receive outputs: root's, or the invoking user's (the real
/// user id; under sudo, `SUDO_UID`).
fn trusted_owner(uid: u32) -> bool {
    // SAFETY: getuid has no preconditions.
    uid == 0 || uid == unsafe { libc::getuid() } || sudo_user().is_some_and(|(u, _)| u == uid)
}

/// Whether `meta` is the file of spanprof's standard input, output or error.
fn is_own_stdio(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (0..3).any(|fd| {
        // SAFETY: a zeroed plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into that struct; a closed descriptor fails.
        let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
        ok && st.st_dev == meta.dev() && st.st_ino == meta.ino()
    })
}

/// Refuses a node owned by another user ([`trusted_owner`]) unless it is spanprof's own
/// standard stream. The error is only the cause, as [`PendingOutput::commit`]'s are.
fn owner_allowed(meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if trusted_owner(meta.uid()) || is_own_stdio(meta) {
        return Ok(());
    }
    anyhow::bail!(
        "it is a {} owned by another user (uid {}); outputs go only into nodes of root or of \
         the user running spanprof",
        special_kind(meta.file_type()),
        meta.uid()
    )
}

/// [`owner_allowed`] on an opened file.
fn check_owner(file: &File) -> Result<()> {
    owner_allowed(&file.metadata()?)
}

/// Whether `file` is a terminal or the null device (1:3).
fn terminal_or_null(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    // SAFETY: isatty on an fd we own.
    let tty = unsafe { libc::isatty(file.as_raw_fd()) } == 1;
    tty || file
        .metadata()
        .is_ok_and(|m| m.rdev() == libc::makedev(1, 3))
}

/// A file type in words, for errors.
fn special_kind(t: std::fs::FileType) -> &'static str {
    if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else {
        "special file"
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
        if let Sink::Rename { slot, .. } = &mut self.sink {
            if let Some(slot) = slot.take() {
                // NB: the string stays allocated (see TEMP_PATHS); only the slot is freed.
                TEMP_PATHS[slot].store(ptr::null_mut(), Ordering::SeqCst);
            }
        }
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        self.unregister();
        // Committed files were renamed away; anything else is a leftover to remove.
        if let Sink::Rename { tmp, .. } = &self.sink {
            let _ = std::fs::remove_file(tmp);
        }
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
        let Sink::Rename {
            file: Some(file), ..
        } = &out.sink
        else {
            panic!("a regular file is renamed into place")
        };
        chown(file, 65534, 65534);
        out.commit(b"<svg/>").unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&owned).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        }

        // What the handler of a second Ctrl-C does: every temporary file goes, none is left.
        let pending = PendingOutput::create(&dir.join("interrupted.svg")).unwrap();
        let Sink::Rename { tmp, .. } = &pending.sink else {
            panic!("a regular file is renamed into place")
        };
        assert!(tmp.exists());
        remove_temp_files();
        assert!(!tmp.exists());
        drop(pending);
        std::fs::remove_dir_all(&dir).unwrap();

        let err = PendingOutput::create(Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("cannot write output /nonexistent-dir/x.svg"));
    }

    #[test]
    fn writes_into_a_fifo_and_refuses_a_socket() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("spanprof-write-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("out.folded");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let out = PendingOutput::create(&fifo).unwrap();
        // Nothing was created next to it, and opening waits for the reader.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        out.commit(b"a;b 1\n").unwrap();
        assert_eq!(reader.join().unwrap(), b"a;b 1\n");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        // Through a symlink too (as /dev/stdout is one).
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let out = PendingOutput::create(&link).unwrap();
        let reader = std::thread::spawn(move || std::fs::read(fifo).unwrap());
        out.commit(b"x 2\n").unwrap();
        assert_eq!(reader.join().unwrap(), b"x 2\n");

        let sock = dir.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let err = PendingOutput::create(&sock).unwrap_err().to_string();
        assert!(
            err.contains("it is a socket; outputs go to regular files"),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
