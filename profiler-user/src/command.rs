//! Running the command of `spanprof profile -- CMD`: forked, held before `exec` until its pid is
//! in the target map, then reaped like any child.
//!
//! `std::process::Command` cannot hold a child before `exec`: `spawn` returns only after the
//! child has exec'd. So this module forks by hand.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use anyhow::{bail, Context, Result};

/// The command could not be executed (`execvp` failed).
#[derive(Debug, thiserror::Error)]
#[error("cannot run {name}")]
pub struct CannotRun {
    /// The command as given.
    pub name: String,
    /// Why `exec` failed.
    pub source: std::io::Error,
}

impl CannotRun {
    /// The exit status a shell gives for this failure: 127 when the command was not found, 126
    /// when it was found but could not be executed.
    pub fn exit_code(&self) -> u8 {
        if self.source.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        }
    }
}

/// A command started by [`GatedCommand::spawn`].
#[derive(Debug)]
pub struct GatedCommand {
    pid: u32,
    name: String,
    /// Write end of the gate; `Some` until [`GatedCommand::release`].
    gate: Option<OwnedFd>,
    /// Read end of a CLOEXEC pipe on which the child reports a failed `exec` (errno).
    exec_errors: OwnedFd,
    status: Option<ExitStatus>,
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!(
            "failed to create a pipe: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads into `buf`, retrying on EINTR; returns the byte count (0 at EOF) or -1.
fn read_retrying(fd: i32, buf: &mut [u8]) -> isize {
    loop {
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return n;
        }
    }
}

impl GatedCommand {
    /// Forks `argv` and holds the child before `exec`.
    pub fn spawn(argv: &[OsString]) -> Result<GatedCommand> {
        Self::spawn_with_output(argv, None)
    }

    /// [`GatedCommand::spawn`] with the command's stdin, stdout and stderr on `output` (a file
    /// opened for reading and writing, such as /dev/null: `spanprof top`'s terminal view, and
    /// its keys, are not the command's).
    pub fn spawn_with_output(
        argv: &[OsString],
        output: Option<&std::fs::File>,
    ) -> Result<GatedCommand> {
        let output_fd = output.map_or(-1, |f| f.as_raw_fd());
        let name = argv
            .first()
            .context("no command given")?
            .to_string_lossy()
            .into_owned();
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("the command has a NUL byte in an argument")?;
        let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let (gate_r, gate_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        // SAFETY: between fork and exec/_exit the child only calls functions that are
        // async-signal-safe (close, read, dup2, signal, sigprocmask, prctl, write, _exit) or, for execvp,
        // safe in glibc (stack buffers only), on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("failed to fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: see above; the child never returns from this block.
            unsafe {
                libc::close(gate_w.as_raw_fd());
                libc::close(err_r.as_raw_fd());
                let mut go = 0u8;
                let n = loop {
                    let n = libc::read(gate_r.as_raw_fd(), (&mut go as *mut u8).cast(), 1);
                    if n >= 0 || *libc::__errno_location() != libc::EINTR {
                        break n;
                    }
                };
                if n != 1 || go != b'g' {
                    // spanprof gave up (or died): the command must not run unprofiled.
                    libc::_exit(127);
                }
                // Rust ignores SIGPIPE; the command gets the default, and an empty signal mask,
                // as from a shell. (SIGINT/SIGTERM: exec resets spanprof's handlers to the
                // default and keeps a disposition spanprof inherited as ignored.)
                if output_fd >= 0 {
                    libc::dup2(output_fd, 0);
                    libc::dup2(output_fd, 1);
                    libc::dup2(output_fd, 2);
                }
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                // Capabilities spanprof holds as ambient ones (setpriv, systemd's
                // AmbientCapabilities=) are not the command's to keep.
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                );
                libc::execvp(ptrs[0], ptrs.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
                libc::_exit(127);
            }
        }
        drop(gate_r);
        drop(err_w);
        Ok(GatedCommand {
            pid: pid as u32,
            name,
            gate: Some(gate_w),
            exec_errors: err_r,
            status: None,
        })
    }

    /// The child's pid (the command's, once it has exec'd).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exec; fails with the reason when the command cannot be run.
    pub fn release(&mut self) -> Result<()> {
        let gate = self.gate.take().expect("released once");
        // SAFETY: writes one byte from a valid buffer to an fd we own.
        let n = unsafe { libc::write(gate.as_raw_fd(), b"g".as_ptr().cast(), 1) };
        drop(gate);
        if n != 1 {
            let _ = self.wait(true);
            bail!(
                "cannot start {}: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
        let mut errno = [0u8; 4];
        if read_retrying(self.exec_errors.as_raw_fd(), &mut errno) == 4 {
            let source = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            let _ = self.wait(true);
            return Err(CannotRun {
                name: self.name.clone(),
                source,
            }
            .into());
        }
        // EOF: exec succeeded and closed the CLOEXEC pipe.
        Ok(())
    }

    /// Sends `sig` to the command.
    pub fn signal(&self, sig: i32) {
        if self.status.is_none() {
            // SAFETY: our own unreaped child, so the pid cannot have been reused.
            unsafe { libc::kill(self.pid as i32, sig) };
        }
    }

    /// Reaps the child; `None` while it runs (when `block` is false).
    pub fn wait(&mut self, block: bool) -> Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let mut status = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, flags) };
            if r == 0 {
                return Ok(None);
            }
            if r > 0 {
                self.status = Some(ExitStatus::from_raw(status));
                return Ok(self.status);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("failed to wait for the command");
            }
        }
    }
}

impl Drop for GatedCommand {
    fn drop(&mut self) {
        // Never released: the child exits by itself when the gate closes; reap it.
        if self.gate.take().is_some() {
            let _ = self.wait(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn runs_only_when_released() {
        let mut c = GatedCommand::spawn(&argv(&["sh", "-c", "exit 7"])).unwrap();
        assert_eq!(c.wait(false).unwrap(), None, "held before exec");
        c.release().unwrap();
        assert_eq!(c.wait(true).unwrap().unwrap().code(), Some(7));
    }

    #[test]
    fn unreleased_command_never_runs() {
        let dir = std::env::temp_dir().join(format!("spanprof-gate-{}", std::process::id()));
        let marker = dir.join("ran");
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!("touch {}", marker.display());
        drop(GatedCommand::spawn(&argv(&["sh", "-c", &script])).unwrap());
        assert!(
            !marker.exists(),
            "the command ran although it was never released"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn exec_failure_is_reported() {
        let mut c = GatedCommand::spawn(&argv(&["/nonexistent/spanprof-cmd"])).unwrap();
        let err = c.release().unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.starts_with("cannot run /nonexistent/spanprof-cmd: No such file"),
            "{text}"
        );
        assert_eq!(err.downcast_ref::<CannotRun>().unwrap().exit_code(), 127);
    }

    #[test]
    fn sigpipe_is_default_in_the_command() {
        // spanprof (like every Rust program) ignores SIGPIPE; the command must not inherit that,
        // or `yes | head` would spin on EPIPE instead of dying.
        let mut c = GatedCommand::spawn(&argv(&["sh", "-c", "kill -PIPE $$; exit 0"])).unwrap();
        c.release().unwrap();
        let status = c.wait(true).unwrap().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status}");
    }
}
