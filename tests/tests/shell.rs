//! The shell completions (`spanprof completions bash|zsh|fish`) and the manual pages (`spanprof
//! man`), each loaded by the program that reads it: bash, fish and zsh complete `spanprof`'s
//! subcommands and flags from the scripts, `man -l` renders the pages.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use spanprof_tests::{run_spanprof, TempDir};

/// The script `spanprof completions SHELL` writes, into `dir`.
fn completions(shell: &str, dir: &Path) -> std::path::PathBuf {
    let out = run_spanprof(["completions", shell]);
    out.assert_success();
    assert!(!out.stdout.is_empty(), "no {shell} script");
    let path = dir.join(format!("spanprof.{shell}"));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// `program args…`'s standard output; it must succeed (a shell missing is named).
fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            spanprof_tests::missing_prerequisite(
                &format!("{program} ({e})"),
                "`cargo xtask deps` (installs zsh, fish and man-db)",
            )
        });
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bash_completes_subcommands_and_flags() {
    let tmp = TempDir::new("bash-completions");
    let script = completions("bash", tmp.path());
    // What bash's completion would offer for the words typed so far (the last is completed).
    // (bash calls the function with the command, the word completed and the one before.)
    let complete = |line: &str| {
        let words: Vec<String> = line.split(' ').map(|w| format!("'{w}'")).collect();
        let cword = words.len() - 1;
        output(
            "bash",
            &[
                "-c",
                &format!(
                    "source {}; COMP_WORDS=({}); COMP_CWORD={cword}; COMP_LINE='{line}'; \
                     COMP_POINT=${{#COMP_LINE}}; _spanprof spanprof {} {}; \
                     printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                    script.display(),
                    words.join(" "),
                    words[cword],
                    words[cword - 1]
                ),
            ],
        )
    };
    let subcommands = complete("spanprof pro");
    assert_eq!(subcommands.trim(), "profile", "{subcommands}");
    let flags = complete("spanprof profile --freq");
    assert_eq!(flags.trim(), "--frequency", "{flags}");
    let all = complete("spanprof ");
    for sub in [
        "profile",
        "report",
        "diff",
        "check",
        "daemon",
        "completions",
        "man",
    ] {
        assert!(all.lines().any(|l| l == sub), "{sub} not offered:\n{all}");
    }
    assert!(
        !all.contains("__verify-workload"),
        "a hidden subcommand offered:\n{all}"
    );
}

#[test]
fn fish_completes_subcommands_and_flags() {
    let tmp = TempDir::new("fish-completions");
    let script = completions("fish", tmp.path());
    let complete = |line: &str| {
        output(
            "fish",
            &[
                "--no-config",
                "-c",
                &format!("source {}; complete -C '{line}'", script.display()),
            ],
        )
    };
    let subcommands = complete("spanprof pro");
    assert!(
        subcommands.lines().any(|l| l.starts_with("profile\t")),
        "{subcommands}"
    );
    let flags = complete("spanprof profile --freq");
    assert!(
        flags.lines().any(|l| l.starts_with("--frequency")),
        "{flags}"
    );
    let all = complete("spanprof ");
    assert!(all.lines().any(|l| l.starts_with("daemon\t")), "{all}");
    assert!(
        !all.contains("__verify-workload"),
        "a hidden subcommand offered:\n{all}"
    );
}

#[test]
fn zsh_loads_its_completion_function() {
    let tmp = TempDir::new("zsh-completions");
    let script = completions("zsh", tmp.path());
    // The file is a completion function for compinit (`#compdef spanprof`): defined, and the
    // subcommands it lists, once autoloaded from a directory of the function path.
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.starts_with("#compdef spanprof"), "{text:.200}");
    assert!(
        !text.contains("__verify-workload"),
        "a hidden subcommand in the script"
    );
    let functions = tmp.join("functions");
    std::fs::create_dir_all(&functions).unwrap();
    std::fs::copy(&script, functions.join("_spanprof")).unwrap();
    let listed = output(
        "zsh",
        &[
            "-f",
            "-c",
            &format!(
                "fpath=({} $fpath); autoload -Uz compinit; compinit -u -D; \
                 autoload +X _spanprof; echo $_comps[spanprof]; functions _spanprof",
                functions.display()
            ),
        ],
    );
    // Registered for spanprof, and loaded from the file (+X): its body has the subcommands and
    // their flags.
    assert!(listed.starts_with("_spanprof\n"), "{listed:.300}");
    for needle in ["profile", "--frequency", "completions"] {
        assert!(
            listed.contains(needle),
            "{needle} not in _spanprof:\n{listed:.2000}"
        );
    }
    // The script parses.
    output("zsh", &["-n", &script.display().to_string()]);
}

/// The process's umask set to a value until dropped.
struct Umask(libc::mode_t);

impl Umask {
    fn set(mask: libc::mode_t) -> Umask {
        // SAFETY: umask changes the process's mask only; no other test here checks the mode of
        // a file it writes.
        Umask(unsafe { libc::umask(mask) })
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { libc::umask(self.0) };
    }
}

#[test]
fn man_pages_render() {
    // Whatever the umask, every user's man reads the pages (the mask is put back on drop, a
    // failed assertion included).
    let mask = Umask::set(0o077);
    let tmp = TempDir::new("man-pages");
    let page = run_spanprof(["man"]);
    page.assert_success();
    assert!(
        page.stdout.starts_with(".ie") || page.stdout.contains(".TH spanprof"),
        "{}",
        page.stdout
    );
    let dir = tmp.join("man1");
    let out = run_spanprof(["man".into(), "--dir".into(), dir.clone().into_os_string()]);
    out.assert_success();
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for want in [
        "spanprof.1",
        "spanprof-profile.1",
        "spanprof-daemon.1",
        "spanprof-man.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "no {want} in {pages:?}");
    }
    assert!(
        !pages.iter().any(|p| p.contains("verify-workload")),
        "a page for a hidden subcommand: {pages:?}"
    );
    let text = output(
        "man",
        &[
            "-P",
            "cat",
            "-l",
            &dir.join("spanprof-profile.1").display().to_string(),
        ],
    );
    drop(mask);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o755, "{}", dir.display());
    assert_eq!(mode(&dir.join("spanprof.1")), 0o644);
    for needle in ["SYNOPSIS", "--frequency", "--python-only"] {
        assert!(
            text.contains(needle),
            "{needle} not in the rendered page:\n{text}"
        );
    }
}
