//! Running commands with the command line echoed and failures named.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{bail, Context, Result};

/// Prints one progress line.
pub fn step(message: &str) {
    eprintln!("xtask: {message}");
}

/// `cargo` as the one that runs us (cargo sets `CARGO`), in `root`.
pub fn cargo(root: &Path) -> Cmd {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Cmd::new(cargo).current_dir(root)
}

/// A thin wrapper over [`Command`] that echoes itself and turns a non-zero
/// exit status into an error naming the command.
#[derive(Debug)]
pub struct Cmd {
    inner: Command,
    quiet: bool,
}

impl Cmd {
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Self {
            inner: Command::new(program),
            quiet: false,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.inner.arg(arg);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.inner.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(key, value);
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.inner.current_dir(dir);
        self
    }

    /// Do not echo the command line (for probes such as `dpkg -s`).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    fn describe(&self) -> String {
        let mut line = self.inner.get_program().to_string_lossy().into_owned();
        for arg in self.inner.get_args() {
            line.push(' ');
            let arg = arg.to_string_lossy();
            if arg.is_empty() || arg.contains(char::is_whitespace) {
                line.push_str(&format!("'{arg}'"));
            } else {
                line.push_str(&arg);
            }
        }
        line
    }

    /// Runs with inherited stdio; fails unless the exit status is 0.
    pub fn run(mut self) -> Result<()> {
        let line = self.describe();
        if !self.quiet {
            eprintln!("xtask: $ {line}");
        }
        let status = self
            .inner
            .status()
            .with_context(|| format!("failed to start `{line}`"))?;
        if !status.success() {
            bail!("`{line}` failed with {status}");
        }
        Ok(())
    }

    /// Runs with output captured; returns it whatever the exit status.
    pub fn output(mut self) -> Result<Output> {
        let line = self.describe();
        if !self.quiet {
            eprintln!("xtask: $ {line}");
        }
        self.inner
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("failed to start `{line}`"))
    }

    /// Runs with output captured; true when the exit status is 0.
    pub fn succeeds(self) -> bool {
        self.quiet().output().is_ok_and(|out| out.status.success())
    }
}

/// True when running as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
