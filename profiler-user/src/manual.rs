//! `spanprof completions SHELL` and `spanprof man`: the command line described for shells and
//! for `man`, from clap's own definition of it (clap_complete, clap_mangen).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use clap::CommandFactory;

use crate::cli::{Cli, Failure, EXIT_FAILURE};

/// The command line as users see it: without the hidden subcommands (clap's completion
/// scripts would offer them).
fn shown_command() -> clap::Command {
    let cmd = Cli::command();
    let mut shown = clap::Command::new("spanprof").version(env!("CARGO_PKG_VERSION"));
    if let Some(about) = cmd.get_about() {
        shown = shown.about(about.clone());
    }
    shown.subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

/// `spanprof completions SHELL`: the script on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    // NB: into memory first: clap_complete panics on a failed write (a closed pipe, a full
    // disk).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut shown_command(), "spanprof", &mut script);
    written(
        std::io::stdout().lock().write_all(&script),
        "the completion script",
        None,
    )
}

/// `spanprof man`: spanprof(1) on stdout, or every page into `dir` (made if missing; the pages
/// 0644, and a directory it made 0755, whatever the umask: every user's `man` reads them).
pub(crate) fn man_pages(dir: Option<&Path>) -> Result<u8, Failure> {
    let cmd = Cli::command();
    let result = match dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock()),
        Some(dir) => {
            let made = !dir.exists();
            std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(cmd, dir))
                .and_then(|()| readable_by_all(dir, made))
        }
    };
    written(result, "the manual pages", dir)
}

/// Sets the pages written into `dir` (`spanprof.1`, `spanprof-SUB.1`) to 0644, and `dir` to 0755
/// when this call `made` it (a shared directory such as `/usr/local/share/man/man1` keeps its
/// mode, and the other packages' pages theirs).
fn readable_by_all(dir: &Path, made: bool) -> std::io::Result<()> {
    if made {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(|n| {
            n == "spanprof.1" || (n.starts_with("spanprof-") && n.ends_with(".1"))
        });
        if ours && entry.file_type()?.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// Status 0, or the failure to write `what` (into `dir`); a closed pipe (`spanprof man |
/// head`) is not one.
fn written(result: std::io::Result<()>, what: &str, dir: Option<&Path>) -> Result<u8, Failure> {
    match result {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure(
            EXIT_FAILURE,
            match dir {
                Some(dir) => format!("cannot write {what} into {}: {e}", dir.display()),
                None => format!("cannot write {what}: {e}"),
            },
        )),
    }
}
