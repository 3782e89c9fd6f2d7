//! Bad input: each case is one `error: ` line on stderr (with a hint where a likely mistake is
//! recognized), exit code 2 for usage errors and 1 for the others, no panic and no output file.
//! A target that exits mid-session: exit 0, say so, write what was gathered. `--python-only` on
//! a program without Python: a warning.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use spanprof_tests::{
    args, assert_error, assert_private_output, folded_total, profiling_lock, read_folded,
    require_profiling, run_spanprof, run_with_timeout, spanprof_bin, spanprof_command, unused_pid,
    workload_path, RunOutput, TempDir, Workload, RUN_TIMEOUT,
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
            &["--python-allocators"][..],
            &["--python-allocators needs --event alloc or heap"][..],
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

/// The capabilities docs/requirements.md's "Capabilities" section documents for profiling another user's
/// processes (setpriv names): CAP_BPF and CAP_PERFMON to load and attach, CAP_SYS_PTRACE for
/// the target's files and memory, CAP_DAC_READ_SEARCH for files in directories the user
/// cannot search (pyenv's under /root), CAP_SYSLOG for kernel symbols.
const DOCUMENTED: &str = "+bpf,+perfmon,+sys_ptrace,+dac_read_search,+syslog";

/// Runs spanprof as uid/gid 65534 holding exactly `caps` (setpriv names, e.g. `+bpf,+perfmon`)
/// with `args`, from a copy of the binary in a directory that user can enter; `dir` is where
/// that user may write its outputs.
fn run_as_nobody(caps: &str, dir: &TempDir, args: Vec<std::ffi::OsString>) -> RunOutput {
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.join("spanprof");
    if !bin.exists() {
        std::fs::copy(spanprof_bin(), &bin).expect("copy spanprof");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let drop_all = if caps.is_empty() {
        "-all".to_string()
    } else {
        format!("-all,{caps}")
    };
    let mut setpriv: Vec<std::ffi::OsString> = vec![
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps={drop_all}").into(),
        format!("--ambient-caps={drop_all}").into(),
        bin.into(),
    ];
    setpriv.extend(args);
    let mut out = run_with_timeout(clone_command(&setpriv), RUN_TIMEOUT);
    // NB: ETXTBSY while another test thread's fork still holds the fresh copy (see above).
    for _ in 0..20 {
        if !out.stderr.contains("Text file busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        out = run_with_timeout(clone_command(&setpriv), RUN_TIMEOUT);
    }
    out
}

/// A non-root user holding what their own processes need (CAP_BPF, CAP_PERFMON): `-- CMD` of
/// a setuid-root copy of a workload is dropped at its exec, with a line, as `--pid` refuses a
/// setuid process without CAP_SYS_PTRACE (no sample of it in the output); the same copy without
/// the setuid bit is profiled (issue 42, item 2).
#[test]
fn a_setuid_command_is_not_profiled_by_a_non_root_user() {
    require_profiling();
    let tmp = TempDir::new("err-setuid");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let plain = tmp.join("plain_split");
    let setuid = tmp.join("setuid_split");
    for (path, mode) in [(&plain, 0o755), (&setuid, 0o4755)] {
        std::fs::copy(workload_path("cpu_split"), path).unwrap();
        std::os::unix::fs::chown(path, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let _lock = profiling_lock();
    let run = |program: &Path, name: &str| {
        let out = tmp.join(name);
        let run = run_as_nobody(
            "+bpf,+perfmon",
            &tmp,
            // NB: --no-kernel: without CAP_SYSLOG, kernel frames would be unnamed.
            args![
                "profile",
                "-F",
                "499",
                "--no-kernel",
                "-o",
                &out,
                "--",
                program,
                "0.5"
            ],
        );
        let hot: u64 = if out.exists() {
            read_folded(&out)
        } else {
            Vec::new()
        }
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "hot_alpha"))
        .map(|s| s.count)
        .sum();
        (run, hot)
    };
    let (out, hot) = run(&plain, "plain.folded");
    out.assert_success();
    assert!(hot > 0, "the plain copy was not profiled\n{out}");
    let (out, hot) = run(&setuid, "setuid.folded");
    assert!(
        out.stderr
            .contains("started a program that runs with other credentials"),
        "{out}"
    );
    assert_eq!(hot, 0, "the setuid copy was profiled\n{out}");
}

/// A non-root user holding only the documented capabilities profiles a root-owned CPython
/// process (pyenv's, under /root) with on- and off-CPU stacks: Python frames of the workload,
/// named kernel frames, a 0600 output of its own, and no capability warning. Dropping
/// CAP_SYS_PTRACE is an error naming it; dropping CAP_SYSLOG a warning naming it; the
/// allocation probes without CAP_SYS_ADMIN an error naming that.
#[test]
fn documented_capabilities_suffice_for_a_non_root_user() {
    require_profiling();
    let python = spanprof_tests::pyenv_python(12);
    let _lock = profiling_lock();
    let workload = spanprof_tests::start_py_workload(&python, "py_offcpu.py", &["40"]);
    let pid = workload.pid().to_string();
    let tmp = TempDir::new("err-caps");
    let out = tmp.join("out.pb.gz");
    let profile = |duration: &str, extra: &[&str]| {
        let mut a = args!["profile", "--pid", &pid, "--duration", duration, "-o", &out];
        a.extend(extra.iter().map(std::ffi::OsString::from));
        a
    };
    let run = run_as_nobody(DOCUMENTED, &tmp, profile("2s", &["--event", "cpu,offcpu"]));
    run.assert_success();
    assert!(
        !run.stderr.contains("capability"),
        "a capability is said to be missing\n{run}"
    );
    assert_private_output(&out);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), 65534);
    let decoded = spanprof_tests::decode_pprof(&out);
    let samples = decoded["samples"].as_array().unwrap();
    let functions = |s: &serde_json::Value| spanprof_tests::sample_functions(s);
    let with = |name: &str| {
        samples
            .iter()
            .filter(|s| functions(s).iter().any(|f| f.starts_with(name)))
            .count()
    };
    assert!(
        with("sleeper") > 0 && with("spin") > 0,
        "no Python frames of the workload (sleeper {}, spin {}) in {} samples\n{run}",
        with("sleeper"),
        with("spin"),
        samples.len()
    );
    let kernel_named = samples.iter().any(|s| {
        s["stack"].as_array().unwrap().iter().any(|f| {
            f["mapping"].as_str() == Some("[kernel.kallsyms]")
                && f["function"].as_str() == Some("do_syscall_64")
        })
    });
    let kernel_frames: std::collections::BTreeSet<String> = samples
        .iter()
        .flat_map(|s| s["stack"].as_array().unwrap().iter())
        .filter(|f| f["mapping"].as_str() == Some("[kernel.kallsyms]"))
        .map(|f| f["function"].to_string())
        .collect();
    assert!(
        kernel_named,
        "no named kernel frame (do_syscall_64) among {kernel_frames:?}\n{run}"
    );

    let alloc = run_as_nobody(DOCUMENTED, &tmp, profile("2s", &["--event", "alloc"]));
    assert_error(&alloc, FAILURE, &["missing capability CAP_SYS_ADMIN"]);
    let no_ptrace = run_as_nobody(
        "+bpf,+perfmon,+dac_read_search,+syslog",
        &tmp,
        profile("2s", &[]),
    );
    assert_error(&no_ptrace, FAILURE, &["missing capability CAP_SYS_PTRACE"]);
    let no_syslog = run_as_nobody(
        "+bpf,+perfmon,+sys_ptrace,+dac_read_search",
        &tmp,
        profile("500ms", &[]),
    );
    no_syslog.assert_success();
    assert!(
        no_syslog.stderr.contains("missing capability CAP_SYSLOG"),
        "{no_syslog}"
    );
    drop(workload);
}

/// `spanprof verify` as a user without capabilities: the capability check fails naming
/// CAP_BPF, nothing else runs, exit 1.
#[test]
fn verify_without_cap_bpf_names_it() {
    require_profiling();
    let tmp = TempDir::new("err-verify-nocaps");
    let out = run_as_nobody("", &tmp, args!["verify"]);
    assert_eq!(out.code(), FAILURE, "{out}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("capabilities "))
        .unwrap_or_else(|| panic!("no capabilities row\n{out}"));
    assert!(
        line.contains("FAIL") && line.contains("missing capability CAP_BPF"),
        "{line}"
    );
    assert!(!out.stdout.contains("native: functions"), "{out}");
}

/// Mistakes on the command line get a hint on the error's one line: a flag or subcommand of a
/// similar name, a long flag written with one dash, a command without `--` before it.
#[test]
fn command_line_mistakes_get_a_hint() {
    for (line, words) in [
        (
            &["profile", "--freq", "99", "--pid", "1"][..],
            &["'--freq'", "did you mean `--frequency`?"][..],
        ),
        (
            &["profle", "--pid", "1"][..],
            &["'profle'", "did you mean `profile`?"][..],
        ),
        (
            &["profile", "-pid", "28202"][..],
            &["`-pid` is read as short flags: did you mean `--pid`?"][..],
        ),
        (
            &["profile", "-F", "99", "python3", "app.py"][..],
            &["put it after `--`: spanprof profile [OPTIONS] -- python3 …"][..],
        ),
    ] {
        let out = run_spanprof(line.to_vec());
        assert_error(&out, USAGE, words);
    }
}

/// `--python-only` on a process without Python says so (every sample would be `[no python
/// frames]`), and still writes the profile.
#[test]
fn python_only_without_python_warns() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("err-python-only");
    let out_path = tmp.join("out.folded");
    // `profile --python-only -F 99 -o OUT -- COMMAND…`, which must succeed.
    let profile = |command: &[&std::ffi::OsStr]| {
        let mut line = args![
            "profile",
            "--python-only",
            "-F",
            "99",
            "-o",
            &out_path,
            "--"
        ];
        line.extend(command.iter().map(|a| a.to_os_string()));
        let out = run_spanprof(line);
        out.assert_success();
        out
    };
    let cpu_split = spanprof_tests::workload_path("cpu_split");
    let out = profile(&[cpu_split.as_os_str(), "1".as_ref()]);
    assert!(
        out.stderr
            .contains("spanprof: warning: --python-only, but no sample has a Python frame"),
        "{out}"
    );
    let stacks = read_folded(&out_path);
    assert!(folded_total(&stacks) > 0, "{out}");
    // Not for a Python program.
    let python = spanprof_tests::pyenv_python(12);
    let out = profile(&[
        python.as_os_str(),
        "-c".as_ref(),
        "import time\nt = time.time()\nwhile time.time() - t < 1: pass".as_ref(),
    ]);
    assert!(!out.stderr.contains("--python-only, but"), "{out}");
}
