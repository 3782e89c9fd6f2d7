//! Bad input: each case is one `error: ` line on stderr, a non-zero exit
//! code (2 for usage errors), no panic and no output file. And a target that
//! exits mid-session: exit 0, say so, write what was gathered.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use spanprof_tests::{
    assert_private_output, folded_total, profiling_lock, read_folded, require_profiling,
    run_spanprof, run_with_timeout, spanprof_bin, spanprof_command, unused_pid, RunOutput, TempDir,
    Workload, RUN_TIMEOUT,
};

/// Asserts the error contract: exit code (any non-zero one when `code` is
/// None, not 101, Rust's panic code), exactly one non-empty stderr line,
/// starting with `error: ` and containing every one of `needles`.
#[track_caller]
fn assert_error(out: &RunOutput, code: Option<i32>, needles: &[&str]) {
    let actual = out.code();
    match code {
        Some(code) => assert_eq!(actual, code, "exit code\n{out}"),
        None => assert_ne!(actual, 0, "expected failure\n{out}"),
    }
    assert_ne!(actual, 101, "spanprof panicked\n{out}");
    assert!(!out.stderr.contains("panicked"), "spanprof panicked\n{out}");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr\n{out}");
    let line = lines[0];
    assert!(
        line.starts_with("error: "),
        "the line does not start with `error: `\n{out}"
    );
    for needle in needles {
        assert!(
            line.contains(needle),
            "the error does not mention {needle:?}\n{out}"
        );
    }
}

/// `spanprof profile --pid PID --duration DURATION -o OUT` plus `extra`.
fn profile_args(pid: &str, duration: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["profile", "--pid", pid, "--duration", duration, "-o"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn no_such_pid() {
    require_profiling();
    let tmp = TempDir::new("err-nopid");
    let pid = unused_pid().to_string();
    let out = run_spanprof(profile_args(&pid, "1s", &tmp.join("out.svg"), &[]));
    assert_error(&out, None, &["no process with pid", &pid]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn kernel_thread() {
    require_profiling();
    let tmp = TempDir::new("err-kthread");
    // pid 2 is kthreadd.
    let out = run_spanprof(profile_args("2", "1s", &tmp.join("out.svg"), &[]));
    assert_error(&out, None, &["kernel thread"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn not_root_names_the_missing_capability() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    // NB: a copy of the binary in a world-readable directory, because the
    // checkout may sit below a directory that uid 65534 cannot enter.
    let tmp = TempDir::new("err-noroot");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = tmp.join("spanprof");
    std::fs::copy(spanprof_bin(), &bin).expect("copy spanprof");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = tmp.join("out.svg");

    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(&bin)
    .args(profile_args(
        &workload.pid().to_string(),
        "1s",
        &output,
        &[],
    ));
    let out = run_with_timeout(cmd, RUN_TIMEOUT);
    assert_error(&out, None, &["missing capability", "CAP_BPF"]);
    assert!(!output.exists(), "an output file was created");
}

#[test]
fn kernel_without_btf() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let tmp = TempDir::new("err-btf");
    let mut cmd = spanprof_command(profile_args(
        &workload.pid().to_string(),
        "1s",
        &tmp.join("out.svg"),
        &[],
    ));
    cmd.env("SPANPROF_BTF_PATH", "/nonexistent");
    let out = run_with_timeout(cmd, RUN_TIMEOUT);
    assert_error(&out, None, &["BTF"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn unwritable_output_path() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let output = Path::new("/nonexistent-dir/x.svg");
    let out = run_spanprof(profile_args(&workload.pid().to_string(), "1s", output, &[]));
    assert_error(&out, None, &["cannot write", "/nonexistent-dir/x.svg"]);
    assert!(!Path::new("/nonexistent-dir").exists());
}

#[test]
fn unknown_output_format() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let tmp = TempDir::new("err-format");
    let out = run_spanprof(profile_args(
        &workload.pid().to_string(),
        "1s",
        &tmp.join("out.xyz"),
        &[],
    ));
    assert_error(&out, Some(2), &["unknown output format"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn invalid_duration() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let tmp = TempDir::new("err-duration");
    let out = run_spanprof(profile_args(
        &workload.pid().to_string(),
        "abc",
        &tmp.join("out.svg"),
        &[],
    ));
    assert_error(&out, Some(2), &["invalid duration"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn target_exiting_mid_session_keeps_what_was_gathered() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("exited");
    let folded = tmp.join("out.folded");
    let svg = tmp.join("out.svg");
    // Reaped by a thread as soon as it exits, as its parent would.
    let workload = Workload::start_reaped("cpu_split", 2.0);
    let out = run_spanprof(profile_args(
        &workload.pid().to_string(),
        "5s",
        &folded,
        &["--frequency", "199", "-o", &svg.display().to_string()],
    ));
    assert!(workload.wait().success());
    out.assert_success();
    assert!(
        out.stderr.contains("exited"),
        "stderr does not say the target exited\n{out}"
    );
    assert_private_output(&folded);
    assert_private_output(&svg);
    let total = folded_total(&read_folded(&folded));
    assert!(total > 0, "no samples were kept\n{out}");
}
