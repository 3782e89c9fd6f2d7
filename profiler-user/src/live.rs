//! The live subcommands, `dump` and `top` (their work is in the library's `dump` and `top`), and
//! what a binary given capabilities (the Debian package's `setcap`) refuses to take from the
//! user who runs it.

use spanprof::session;
use spanprof_collect as collect;

use crate::cli::{self, Cmd, Failure, EXIT_FAILURE, EXIT_USAGE};

/// `spanprof top`: until q, Ctrl-C or the targets' exit.
pub(crate) fn top(args: cli::TopArgs) -> Result<u8, Failure> {
    if !(1..=10_000).contains(&args.frequency) {
        return Err(Failure(
            EXIT_USAGE,
            format!(
                "invalid frequency {} for --frequency: expected 1 to 10000 Hz",
                args.frequency
            ),
        ));
    }
    let opts = spanprof::top::Options {
        pids: match &args.pid {
            Some(p) => cli::parse_pids(p)?,
            None => Vec::new(),
        },
        command: args.command,
        frequency: args.frequency,
        window: humantime::parse_duration(&args.window)
            .ok()
            .filter(|w| w.as_secs() >= 1)
            .ok_or_else(|| {
                Failure(
                    EXIT_USAGE,
                    format!(
                        "invalid --window '{}': expected 1s or more, e.g. 10s, 1m",
                        args.window
                    ),
                )
            })?,
        spans: !args.no_spans,
        plain: args.plain,
        view: args.view.view(),
    };
    collect::signals::install_session_handlers();
    match spanprof::top::run(&opts).map_err(|e| Failure(EXIT_FAILURE, format!("{e:#}")))? {
        Some(status) => {
            eprintln!("spanprof top: the command exited ({status})");
            Ok(session::exit_code(status) as u8)
        }
        None => Ok(0),
    }
}

/// `spanprof dump`: text or JSON on stdout.
pub(crate) fn dump(args: cli::DumpArgs) -> Result<u8, Failure> {
    let opts = spanprof::dump::Options {
        pids: cli::parse_pids(&args.pid)?,
        children: args.children,
        spans: !args.no_spans,
        view: args.view.view(),
    };
    let dump = spanprof::dump::run(&opts).map_err(|e| Failure(EXIT_FAILURE, format!("{e:#}")))?;
    if args.json {
        println!("{}", spanprof::dump::render_json(&dump));
    } else {
        print!("{}", spanprof::dump::render_text(&dump));
    }
    Ok(0)
}

/// Whether this process was given privileges its user does not have (file capabilities, or
/// set-id): the kernel's AT_SECURE. The Debian package's postinst gives the binary capabilities
/// for the members of the group `spanprof`.
pub(crate) fn privileged_exec() -> bool {
    // SAFETY: getauxval reads the auxiliary vector; it has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Gives up every capability (effective, permitted, inheritable) for good: the subcommands that
/// only read the files they are given need none, and must not read files their user cannot.
pub(crate) fn drop_capabilities() -> Result<(), Failure> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) with a version 3 header and its two data words, both valid for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(Failure(
            EXIT_FAILURE,
            format!(
                "cannot give up the capabilities of the binary: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    Ok(())
}

/// Run with capabilities its user lacks (the package's group, [`privileged_exec`]): the
/// subcommands that read the files they are given give them up, and the daemon, root's (its
/// systemd unit), is refused. `Some` when the run must stop.
pub(crate) fn privileges(command: &Cmd) -> Option<Failure> {
    if !privileged_exec() {
        return None;
    }
    match command {
        Cmd::Report(_)
        | Cmd::Diff(_)
        | Cmd::Check(_)
        | Cmd::Replay(_)
        | Cmd::Completions { .. }
        | Cmd::Man { .. } => drop_capabilities().err(),
        Cmd::Daemon(_) => Some(Failure(
            EXIT_FAILURE,
            "spanprof daemon runs as root (its systemd unit), not with the capabilities the \
             binary gives its group"
                .into(),
        )),
        _ => None,
    }
}
