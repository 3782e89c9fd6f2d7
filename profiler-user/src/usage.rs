//! Errors of the command line that teach: clap's error on one line, with what was probably
//! meant: a flag or subcommand of a similar name (or the subcommand a flag belongs to), a long
//! flag written with one dash (`-pid 1234`), a command to profile given without `--` before it,
//! the arguments missing or the values allowed.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Command, CommandFactory};

use crate::cli::Cli;

/// The message for the command-line error `err` of the arguments `args` (without the program
/// name): clap's first line, with a hint when one applies, on one line as every error.
pub(crate) fn explain(err: &clap::Error, args: &[OsString]) -> String {
    let text = err.render().to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or("error: invalid arguments")
        .trim_end_matches(':');
    let args: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let cli = Cli::command();
    // NB: the first argument: the program itself takes no option but --help and --version.
    let sub = args
        .first()
        .and_then(|a| cli.find_subcommand(a).filter(|s| !s.is_hide_set()));
    let help = match sub {
        Some(s) => format!("see `spanprof {} --help`", s.get_name()),
        None => "see `spanprof --help`".to_string(),
    };
    match hint(err, &args, &cli, sub) {
        Some(hint) => format!("{first}: {hint} ({help})"),
        None => format!("{first} ({help})"),
    }
}

fn hint(err: &clap::Error, args: &[&str], cli: &Command, sub: Option<&Command>) -> Option<String> {
    let invalid = strings(err.get(ContextKind::InvalidArg)).into_iter().next();
    // A long flag with one dash: `-pid` is `-p id`, and what follows it is then left over.
    if let Some((written, long)) = one_dash_long(args, sub.unwrap_or(cli)) {
        return Some(format!(
            "`{written}` is read as short flags: did you mean `{long}`?"
        ));
    }
    match err.kind() {
        ErrorKind::InvalidSubcommand => {
            let written = strings(err.get(ContextKind::InvalidSubcommand))
                .into_iter()
                .next()?;
            closest(
                &written,
                cli.get_subcommands()
                    .filter(|s| !s.is_hide_set())
                    .map(|s| s.get_name().to_string()),
            )
            .map(|name| format!("did you mean `{name}`?"))
        }
        ErrorKind::UnknownArgument => {
            let written = invalid?;
            if written.starts_with('-') {
                return flag_hint(&written, cli, sub);
            }
            // A command without `--`: `spanprof profile python3 app.py`.
            let takes_command = sub?.get_arguments().any(|a| a.is_last_set());
            // NB: not with --pid, which does not combine with a command.
            let pids = args
                .iter()
                .take_while(|a| **a != "--")
                .any(|a| *a == "-p" || a.starts_with("--pid"));
            (takes_command && !pids && !args.contains(&"--")).then(|| {
                format!(
                    "to run a command, put it after `--`: spanprof {} [OPTIONS] -- {written} …",
                    sub.map_or("", Command::get_name)
                )
            })
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = strings(err.get(ContextKind::InvalidArg));
            (!missing.is_empty()).then(|| missing.join(", "))
        }
        ErrorKind::InvalidValue => {
            let valid = strings(err.get(ContextKind::ValidValue));
            (!valid.is_empty()).then(|| format!("one of {}", valid.join(", ")))
        }
        _ => None,
    }
}

/// The flag `written` meant: the closest long flag of the subcommand, or else the subcommand
/// another flag of that name (long or short) belongs to.
fn flag_hint(written: &str, cli: &Command, sub: Option<&Command>) -> Option<String> {
    let name = written.split('=').next()?;
    let longs = |c: &Command| -> Vec<String> {
        c.get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    };
    if let Some(best) = sub.and_then(|s| closest(name, longs(s).into_iter())) {
        return Some(format!("did you mean `{best}`?"));
    }
    let owner = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && Some(s.get_name()) != sub.map(Command::get_name))
        .find(|s| {
            s.get_arguments().any(|a| {
                a.get_long().is_some_and(|l| format!("--{l}") == name)
                    || a.get_short().is_some_and(|c| format!("-{c}") == name)
            })
        })?;
    Some(match sub {
        Some(_) => format!("`{name}` is a flag of `spanprof {}`", owner.get_name()),
        None => format!(
            "flags go after the subcommand: `spanprof {} {written} …`",
            owner.get_name()
        ),
    })
}

/// Of `names`, the one `written` most likely meant: `written` is the start of it (`--freq`),
/// or at most 2 edits away from it (a letter added, left out, changed, or two swapped): the
/// fewest edits first; `None` when none is that close.
fn closest(written: &str, names: impl Iterator<Item = String>) -> Option<String> {
    names
        .filter_map(|n| {
            let d = if n.starts_with(written) && written.trim_start_matches('-').len() >= 3 {
                1
            } else {
                edits(written, &n)
            };
            (d <= 2 && n != written).then_some((d, n))
        })
        .min()
        .map(|(_, n)| n)
}

/// The optimal-string-alignment distance of `a` and `b` (a swap of two neighbours is one edit).
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The first argument before `--` that is a long flag of `command` written with one dash, and
/// that flag.
fn one_dash_long(args: &[&str], command: &Command) -> Option<(String, String)> {
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
            (
                "profile --frequncy 99 --pid 1",
                "found: did you mean `--frequency`?",
            ),
            ("report --tpo 5 x.pb.gz", "found: did you mean `--top`?"),
            ("profle --pid 1", "'profle': did you mean `profile`?"),
            ("repot x", "'repot': did you mean `report`?"),
            ("verfy", "'verfy': did you mean `verify`?"),
            (
                "profile -pid 28202",
                "found: `-pid` is read as short flags: did you mean `--pid`?",
            ),
            (
                "profile -F 99 python3 app.py",
                "found: to run a command, put it after `--`: spanprof profile [OPTIONS] -- \
                 python3 …",
            ),
            (
                "verify python3 app.py",
                "put it after `--`: spanprof verify [OPTIONS] -- python3 …",
            ),
            (
                "profile --pid 1 --top 5",
                "`--top` is a flag of `spanprof report`",
            ),
            (
                "--pid 1",
                "flags go after the subcommand: `spanprof profile --pid …`",
            ),
            (
                "-p 1",
                "flags go after the subcommand: `spanprof profile -p …`",
            ),
            (
                "report",
                "not provided: <PROFILE> (see `spanprof report --help`)",
            ),
            ("completions tcsh", "one of bash, "),
        ] {
            let m = message(line);
            assert!(m.contains(hint), "{line}: {m}");
            assert!(m.starts_with("error: ") && !m.contains('\n'), "{line}: {m}");
        }
        assert!(message("report").contains("(see `spanprof report --help`)"));
        assert!(message("profle -o report").contains("(see `spanprof --help`)"));
        // Nothing made up when nothing applies, and never a hidden subcommand.
        for line in [
            "profile --pid 1 --zzzzzz",
            "report a.pb.gz b.pb.gz c",
            "profile --pid 1 extra",
        ] {
            let m = message(line);
            assert!(!m.contains("did you") && !m.contains("put it after"), "{m}");
        }
        assert!(!message("__verify-workloa").contains("did you mean"));
        assert!(!message("verfy").contains("`__verify"));
    }
}
