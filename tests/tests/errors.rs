//! Bad input: each case is one `error: ` line on stderr, exit code 2 for
//! usage errors and 1 for the others, no panic and no output file. And a
//! target that exits mid-session: exit 0, say so, write what was gathered.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use spanprof_tests::{
    args, assert_error, assert_private_output, folded_total, profiling_lock, read_folded,
    require_profiling, run_spanprof, run_with_timeout, spanprof_bin, spanprof_command, unused_pid,
    RunOutput, TempDir, Workload, RUN_TIMEOUT,
};

/// Exit code of usage errors (bad arguments).
const USAGE: i32 = 2;
/// Exit code of the other errors.
const FAILURE: i32 = 1;

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
    assert_error(&out, FAILURE, &["no process with pid", &pid]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn kernel_thread() {
    require_profiling();
    let tmp = TempDir::new("err-kthread");
    // pid 2 is kthreadd.
    let out = run_spanprof(profile_args("2", "1s", &tmp.join("out.svg"), &[]));
    assert_error(&out, FAILURE, &["kernel thread"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

/// Runs spanprof on a cpu_split workload as uid/gid 65534 under `setpriv`
/// with `caps` (setpriv options), and returns what it left and whether an
/// output file was created.
fn run_unprivileged(label: &str, caps: &[&str]) -> (RunOutput, bool) {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    // NB: a copy of the binary in a world-readable directory, because the
    // checkout may sit below a directory that uid 65534 cannot enter.
    let tmp = TempDir::new(label);
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = tmp.join("spanprof");
    std::fs::copy(spanprof_bin(), &bin).expect("copy spanprof");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = tmp.join("out.svg");

    let mut cmd_args: Vec<std::ffi::OsString> = vec![
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
    ];
    cmd_args.extend(caps.iter().map(Into::into));
    cmd_args.push(bin.clone().into());
    cmd_args.extend(
        profile_args(&workload.pid().to_string(), "1s", &output, &[])
            .into_iter()
            .map(Into::into),
    );
    let cmd = clone_command(&cmd_args);
    // NB: a test thread that forks while `fs::copy` still holds the copy open for writing
    // makes exec fail with ETXTBSY until that child execs; try again briefly.
    let mut out = run_with_timeout(cmd, RUN_TIMEOUT);
    for _ in 0..20 {
        if !out.stderr.contains("Text file busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        out = run_with_timeout(clone_command(&cmd_args), RUN_TIMEOUT);
    }
    (out, output.exists())
}

fn clone_command(args: &[std::ffi::OsString]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(args);
    cmd
}

/// The effective capability set (`CapEff` of /proc/self/status, a bit mask)
/// of a process started by `setpriv` with `caps` as uid/gid 65534.
fn effective_caps_under_setpriv(caps: &[&str]) -> u64 {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(caps)
        .args(["cat", "/proc/self/status"]);
    let out = run_with_timeout(cmd, RUN_TIMEOUT);
    out.assert_success();
    let hex = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap_or_else(|| panic!("no CapEff line\n{out}"))
        .trim();
    u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("CapEff {hex:?}: {e}\n{out}"))
}

/// CAP_BPF's number in linux/capability.h.
const CAP_BPF: u32 = 39;

#[test]
fn not_root_names_the_missing_capability() {
    require_profiling();
    let caps = ["--inh-caps=-all"];
    let effective = effective_caps_under_setpriv(&caps);
    assert_eq!(effective, 0, "CapEff {effective:#x} under setpriv {caps:?}");
    let (out, created) = run_unprivileged("err-noroot", &caps);
    assert_error(&out, FAILURE, &["missing capability CAP_BPF"]);
    assert!(!created, "an output file was created");
}

#[test]
fn cap_bpf_without_cap_perfmon_names_cap_perfmon() {
    require_profiling();
    // Ambient capabilities survive the exec as a non-root user; they must be
    // inheritable too.
    let caps = ["--inh-caps=-all,+bpf", "--ambient-caps=-all,+bpf"];
    let effective = effective_caps_under_setpriv(&caps);
    assert_eq!(
        effective,
        1 << CAP_BPF,
        "setpriv {caps:?} should leave exactly CAP_BPF effective, got CapEff {effective:#x}"
    );
    let (out, created) = run_unprivileged("err-noperfmon", &caps);
    assert_error(&out, FAILURE, &["missing capability CAP_PERFMON"]);
    assert!(
        !out.stderr.contains("CAP_BPF"),
        "spanprof has CAP_BPF but names it as missing\n{out}"
    );
    assert!(!created, "an output file was created");
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
    assert_error(&out, FAILURE, &["BTF"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn unwritable_output_path() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let output = Path::new("/nonexistent-dir/x.svg");
    let out = run_spanprof(profile_args(&workload.pid().to_string(), "1s", output, &[]));
    assert_error(&out, FAILURE, &["cannot write", "/nonexistent-dir/x.svg"]);
    assert!(!Path::new("/nonexistent-dir").exists());
}

#[test]
fn output_in_a_directory_that_refuses_new_files() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    // NB: root ignores permission bits; sysfs refuses to create files even
    // for root, so /sys is a directory that exists but is not writable.
    let output = Path::new("/sys/x.svg");
    let out = run_spanprof(profile_args(&workload.pid().to_string(), "1s", output, &[]));
    assert_error(&out, FAILURE, &["cannot write", "/sys/x.svg"]);
    assert!(!output.exists());
}

#[test]
fn unknown_format_flag() {
    require_profiling();
    let workload = Workload::start("cpu_split", 20.0);
    let tmp = TempDir::new("err-format-flag");
    let out = run_spanprof(profile_args(
        &workload.pid().to_string(),
        "1s",
        &tmp.join("out.svg"),
        &["--format", "nosuch"],
    ));
    assert_error(&out, USAGE, &["unknown output format", "nosuch"]);
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn command_that_cannot_be_run() {
    require_profiling();
    let tmp = TempDir::new("err-nocmd");
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "5s",
        "-o",
        tmp.join("out.folded"),
        "--",
        "/nonexistent/cmd",
    ]);
    // As a shell would have it: 127 for a command that is not found.
    assert_error(
        &out,
        127,
        &["error: cannot run /nonexistent/cmd: No such file"],
    );
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
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
    assert_error(&out, USAGE, &["unknown output format"]);
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
    assert_error(&out, USAGE, &["invalid duration"]);
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
    // 3 s: on a loaded machine loading the programs has taken a good part of 2 s.
    let workload = Workload::start_reaped("cpu_split", 3.0);
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
    let total = folded_total(&read_folded(&folded));
    assert!(total > 0, "no samples were kept\n{out}");
    assert_private_output(&folded);
    assert_private_output(&svg);
}

#[test]
fn unwind_arguments_are_checked() {
    let tmp = TempDir::new("err-unwind");
    let out = tmp.join("out.folded");
    for (extra, words) in [
        (
            &["--unwind", "lbr"][..],
            &["invalid --unwind lbr", "dwarf or fp"][..],
        ),
        (
            &["--stack-copy", "65536"][..],
            &["invalid --stack-copy 65536", "8 to 32768"][..],
        ),
        (&["--stack-copy", "0"][..], &["invalid --stack-copy 0"][..]),
        (
            &["--ring-buffer-size", "8192"][..],
            &[
                "--ring-buffer-size 8192 is too small for --unwind dwarf",
                "524288",
            ][..],
        ),
    ] {
        let result = run_spanprof(profile_args("1", "1s", &out, extra));
        assert_error(&result, USAGE, words);
    }
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn event_arguments_are_checked() {
    let tmp = TempDir::new("err-event");
    let out = tmp.join("out.folded");
    for (extra, words) in [
        (
            &["--event", "disk"][..],
            &[
                "invalid --event \"disk\"",
                "cpu, offcpu, wall, alloc or heap",
            ][..],
        ),
        (
            &["--event", "cpu,alloc"][..],
            &["do not combine with cpu, offcpu or wall"][..],
        ),
        (
            &["--alloc-rate", "1024"][..],
            &["--alloc-rate needs --event alloc or heap"][..],
        ),
        (
            &["--event", "alloc", "--alloc-rate", "0"][..],
            &["invalid --alloc-rate 0"][..],
        ),
        (
            &["--event", "cpu", "--offcpu-min", "1ms"][..],
            &["--offcpu-min needs --event offcpu or wall"][..],
        ),
        (
            &["--event", "offcpu", "--offcpu-min", "soon"][..],
            &["invalid duration"][..],
        ),
    ] {
        let result = run_spanprof(profile_args("1", "1s", &out, extra));
        assert_error(&result, USAGE, words);
    }
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}
