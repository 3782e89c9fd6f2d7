//! A kernel without the BPF features spanprof needs: simulated for real with a seccomp filter on
//! the `bpf()` system call of the spanprof process, so the error paths run against this kernel.

use std::os::unix::process::CommandExt;
use std::process::Command;

use spanprof_tests::{
    assert_error, require_profiling, run_with_timeout, spanprof_bin, RunOutput, RUN_TIMEOUT,
};

const NR_BPF: u32 = 321; // x86_64 syscall table
const BPF_PROG_LOAD: u32 = 5; // include/uapi/linux/bpf.h, enum bpf_cmd
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// A classic-BPF seccomp filter: `bpf(cmd, …)` fails with `errno` when `cmd` is `only_cmd` (or
/// for every command when `only_cmd` is `None`); every other system call is allowed.
fn filter(errno: u32, only_cmd: Option<u32>) -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let allow = libc::SECCOMP_RET_ALLOW;
    let deny = libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA);
    // struct seccomp_data: nr @0, arch @4, instruction_pointer @8, args[6] @16.
    let mut f = vec![
        stmt(ld, 4),
        jeq(AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, allow),
        stmt(ld, 0),
        jeq(NR_BPF, 1, 0),
        stmt(ret, allow),
    ];
    if let Some(cmd) = only_cmd {
        f.push(stmt(ld, 16)); // low 32 bits of args[0] (little-endian)
        f.push(jeq(cmd, 1, 0));
        f.push(stmt(ret, allow));
    }
    f.push(stmt(ret, deny));
    f
}

fn run_filtered(errno: u32, only_cmd: Option<u32>) -> RunOutput {
    let prog = filter(errno, only_cmd);
    let dir = std::env::temp_dir().join(format!("spanprof-seccomp-{}-{errno}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("never.folded");
    let mut cmd = Command::new(spanprof_bin());
    cmd.args(["profile", "--duration", "1s", "-o"])
        .arg(&out)
        .args(["--", "true"]);
    // SAFETY: prctl is async-signal-safe; `prog` lives until after exec (the closure owns it).
    unsafe {
        cmd.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let result = run_with_timeout(cmd, RUN_TIMEOUT);
    assert!(!out.exists(), "no output may be written\n{result}");
    let leftovers = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(leftovers, 0, "temporary output files left behind\n{result}");
    result
}

#[test]
fn kernel_without_perf_event_programs_is_named() {
    require_profiling();
    // The kernel answers EINVAL to a program load of a type it does not know.
    let out = run_filtered(libc::EINVAL as u32, Some(BPF_PROG_LOAD));
    assert_error(&out, 1, &["does not support BPF program type perf_event"]);
}

#[test]
fn kernel_without_bpf_syscall_is_named() {
    require_profiling();
    // CONFIG_BPF_SYSCALL=n: the system call does not exist.
    let out = run_filtered(libc::ENOSYS as u32, None);
    assert_error(&out, 1, &["bpf() system call is not available"]);
}

#[test]
fn container_pid_namespace_is_refused_with_the_reason() {
    require_profiling();
    // unshare(1) runs spanprof as pid 1 of a new pid namespace, as in a container without
    // hostPID: its pids are not the ones the eBPF programs see.
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(spanprof_bin())
        .args(["profile", "--duration", "1s", "--", "true"]);
    let out = run_with_timeout(cmd, RUN_TIMEOUT);
    assert_error(&out, 1, &["pid namespace"]);
}
