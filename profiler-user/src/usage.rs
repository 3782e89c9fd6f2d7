//! Errors of the command line that teach: clap's error on one line, followed by what was
//! probably meant: a flag or subcommand of a similar name, a long flag written with one dash
//! (`-pid 1234`), or a command to profile given without `--` before it.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::CommandFactory;

use crate::cli::Cli;

/// The message for the command-line error `err` of the arguments `args` (without the program
/// name): clap's first line, with a hint when one applies, on one line as every error.
pub(crate) fn explain(err: &clap::Error, args: &[OsString]) -> String {
    let text = err.render().to_string();
    let first = text.lines().next().unwrap_or("error: invalid arguments");
    match hint(err, args) {
        Some(hint) => format!("{first}: {hint} (see `spanprof --help`)"),
        None => format!("{first} (see `spanprof --help`)"),
    }
}

fn hint(err: &clap::Error, args: &[OsString]) -> Option<String> {
    let args: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let subcommand = args.iter().find(|a| !a.starts_with('-')).copied();
    // A long flag with one dash: `-pid` is `-p id`, and what follows it is then left over.
    if let Some((written, long)) = one_dash_long(&args, subcommand) {
        return Some(format!(
            "`{written}` is read as short flags: did you mean `{long}`?"
        ));
    }
    for kind in [ContextKind::SuggestedArg, ContextKind::SuggestedSubcommand] {
        if let Some(suggested) = strings(err.get(kind)).into_iter().next() {
            return Some(format!("did you mean `{suggested}`?"));
        }
    }
    // A command after `profile` without `--`: `spanprof profile python3 app.py`.
    if err.kind() == ErrorKind::UnknownArgument && subcommand == Some("profile") {
        let invalid = strings(err.get(ContextKind::InvalidArg))
            .into_iter()
            .next()?;
        if !invalid.starts_with('-') && !args.contains(&"--") {
            return Some(format!(
                "to profile a command, put it after `--`: spanprof profile [OPTIONS] -- \
                 {invalid} …"
            ));
        }
    }
    None
}

/// The first argument before `--` that is a long flag of `subcommand` (or of the program)
/// written with one dash, and that flag.
fn one_dash_long(args: &[&str], subcommand: Option<&str>) -> Option<(String, String)> {
    let cli = Cli::command();
    let command = subcommand
        .and_then(|name| cli.find_subcommand(name))
        .unwrap_or(&cli);
    args.iter()
        .take_while(|a| **a != "--")
        .filter(|a| a.len() > 2 && a.starts_with('-') && !a.starts_with("--"))
        .find_map(|a| {
            let name = a[1..].split('=').next()?;
            command
                .get_arguments()
                .find(|arg| arg.get_long() == Some(name))
                .map(|_| (a.to_string(), format!("--{name}")))
        })
}

fn strings(value: Option<&ContextValue>) -> Vec<String> {
    match value {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The message for `line` (split at spaces), which must be refused.
    fn message(line: &str) -> String {
        let args: Vec<OsString> = line.split(' ').map(OsString::from).collect();
        let err =
            Cli::try_parse_from(std::iter::once(OsString::from("spanprof")).chain(args.clone()))
                .expect_err(line);
        explain(&err, &args)
    }

    #[test]
    fn hints() {
        for (line, hint) in [
            (
                "profile --freq 99 --pid 1",
                "found: did you mean `--frequency`?",
            ),
            ("profle --pid 1", "'profle': did you mean `profile`?"),
            (
                "profile -pid 28202",
                "found: `-pid` is read as short flags: did you mean `--pid`?",
            ),
            (
                "profile -F 99 python3 app.py",
                "found: to profile a command, put it after `--`: spanprof profile [OPTIONS] \
                 -- python3 …",
            ),
        ] {
            let m = message(line);
            assert!(m.contains(hint), "{line}: {m}");
            assert!(m.starts_with("error: ") && !m.contains('\n'), "{line}: {m}");
        }
        // Nothing made up when nothing applies.
        let m = message("profile --pid 1 --zzzzzz");
        assert!(
            !m.contains(": did you") && !m.contains("put it after"),
            "{m}"
        );
    }
}
