//! Checks done before anything is loaded, each giving one clear error.

use std::fs;

/// Linux capability numbers (include/uapi/linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `PF_KTHREAD` from include/linux/sched.h: the task is a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO`, include/linux/proc_ns.h).
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// Errors of the checks; messages are one line.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Capabilities needed to load and attach the programs are missing.
    #[error(
        "missing capability {0}: run spanprof as root, or grant it with \
         `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep spanprof`"
    )]
    MissingCapabilities(String),
    /// spanprof runs in a pid namespace other than the host's, where its pids are not the ones
    /// the kernel programs see.
    #[error(
        "spanprof runs in a container's pid namespace, but its eBPF programs see host pids: run \
         it in the host pid namespace (docker --pid=host, Kubernetes hostPID: true)"
    )]
    OtherPidNamespace,
    /// No process has this pid.
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    /// The id is a thread's, not a process's.
    #[error("{tid} is a thread of process {pid}: give the process id, --pid {pid}")]
    Thread {
        /// The thread id given.
        tid: u32,
        /// Its process.
        pid: u32,
    },
    /// The process's files and memory are not ours to read: another user's process, without
    /// CAP_SYS_PTRACE.
    #[error(
        "missing capability CAP_SYS_PTRACE: pid {pid} ({name}) belongs to another user, and \
         its module files and memory cannot be read without it: run spanprof as root, or \
         grant it with \
         `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep spanprof`"
    )]
    NoPtraceAccess {
        /// Pid.
        pid: u32,
        /// Its comm.
        name: String,
    },
    /// The pid is a kernel thread, which has no user space to profile.
    #[error("pid {pid} ({name}) is a kernel thread; spanprof profiles user-space processes")]
    KernelThread {
        /// Pid.
        pid: u32,
        /// Its comm.
        name: String,
    },
}

/// The effective capability set of this process, from `/proc/self/status`.
fn effective_caps() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// The kernel's exec guard settings (`guard_exec`, `guard_uid`, `guard_gid`, `guard_caps` of
/// maps.h): on for a spanprof that is not root and lacks CAP_SYS_PTRACE, which `--pid` refuses
/// another user's (or a setuid) process, so that a command or a child of its own that execs a
/// setuid, setgid or file-capability program is dropped there too. Its real ids and its
/// effective capabilities are what the new program may have.
pub fn exec_guard() -> (u32, u32, u32, u64) {
    // SAFETY: geteuid, getuid and getgid have no preconditions.
    let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
    if euid == 0 || has(CAP_SYS_PTRACE) {
        return (0, 0, 0, 0);
    }
    // The kernel's ptrace check (PTRACE_MODE_FSCREDS) compares with the effective set.
    (1, uid, gid, effective_caps())
}

/// Checks for CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, which implies both), naming the
/// missing ones.
pub fn check_capabilities() -> Result<(), PreflightError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(c, _)| !has(c))
        .map(|(_, n)| n)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::MissingCapabilities(missing.join(", ")))
    }
}

/// Checks that spanprof runs in the initial pid namespace, so the pids it is given and the pids
/// the eBPF programs compare them with are the same numbers.
pub fn check_pid_namespace() -> Result<(), PreflightError> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata("/proc/self/ns/pid") {
        Ok(m) if m.ino() != PROC_PID_INIT_INO => Err(PreflightError::OtherPidNamespace),
        _ => Ok(()),
    }
}

/// Fields of `/proc/PID/stat` that the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// `comm`, between the parentheses.
    pub comm: String,
    /// `state` (field 3): `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    pub state: char,
    /// `flags` (field 9).
    pub flags: u64,
}

impl ProcStat {
    /// Whether the task is a kernel thread (`PF_KTHREAD`).
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// Parses `/proc/PID/stat`; `comm` may contain spaces and parentheses, so it is cut at the last
/// `)`. Returns `None` on anything malformed.
pub fn parse_stat(stat: &str) -> Option<ProcStat> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // After ") ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8) flags(9)
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let flags = fields.nth(5)?.parse().ok()?;
    Some(ProcStat { comm, state, flags })
}

/// Whether `pid` still runs: it exists and is neither a zombie nor dead. A zombie has released
/// its memory, so there is nothing left to profile even before its parent reaps it.
pub fn is_running(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|st| !matches!(st.state, 'Z' | 'X' | 'x'))
}

/// Checks that `pid` is a live user-space process.
pub fn check_pid(pid: u32) -> Result<ProcStat, PreflightError> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|_| PreflightError::NoSuchPid(pid))?;
    // A thread id that is not a process id still has /proc/TID; sampling filters by process.
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    if let Some(tgid) = tgid.filter(|&t| t != pid) {
        return Err(PreflightError::Thread {
            tid: pid,
            pid: tgid,
        });
    }
    let stat = parse_stat(&stat).ok_or(PreflightError::NoSuchPid(pid))?;
    if stat.is_kernel_thread() {
        return Err(PreflightError::KernelThread {
            pid,
            name: stat.comm,
        });
    }
    // NB: /proc/PID/maps is readable with CAP_PERFMON alone; the process's root (its module
    // files) and its memory (process_vm_readv) need ptrace access, which readlink checks.
    if let Err(e) = fs::read_link(format!("/proc/{pid}/root")) {
        if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
            return Err(PreflightError::NoPtraceAccess {
                pid,
                name: stat.comm,
            });
        }
    }
    Ok(stat)
}

/// Whether this process holds the capability named `name` (`CAP_BPF`, …); unknown names are
/// not held.
pub fn holds(name: &str) -> bool {
    let number = match name {
        "CAP_DAC_READ_SEARCH" => CAP_DAC_READ_SEARCH,
        "CAP_SYS_PTRACE" => CAP_SYS_PTRACE,
        "CAP_SYS_ADMIN" => CAP_SYS_ADMIN,
        "CAP_SYSLOG" => CAP_SYSLOG,
        "CAP_PERFMON" => CAP_PERFMON,
        "CAP_BPF" => CAP_BPF,
        _ => return false,
    };
    has(number)
}

/// Whether this process holds CAP_SYS_ADMIN.
pub fn has_sys_admin() -> bool {
    has(CAP_SYS_ADMIN)
}

/// Whether this process holds capability `cap` in its effective set.
fn has(cap: u32) -> bool {
    effective_caps() & (1u64 << cap) != 0
}

/// Why files of other users' processes may be unreadable, when spanprof lacks what reads
/// them: `None` when it has both capabilities.
pub fn file_access_hint() -> Option<&'static str> {
    match (has(CAP_SYS_PTRACE), has(CAP_DAC_READ_SEARCH)) {
        (true, true) => None,
        (false, _) => Some(
            "missing capability CAP_SYS_PTRACE (files of another user's process) or \
             CAP_DAC_READ_SEARCH (files in directories spanprof's user cannot search)",
        ),
        (true, false) => Some(
            "missing capability CAP_DAC_READ_SEARCH: files in directories spanprof's user \
             cannot search (e.g. under /root) are unreadable without it",
        ),
    }
}

/// A warning when kernel symbol addresses are hidden from spanprof (`kernel.kptr_restrict`
/// shows them as zeros without CAP_SYSLOG): kernel frames would be unnamed.
pub fn kernel_symbols_warning() -> Option<String> {
    use std::io::{BufRead, BufReader};
    let file = fs::File::open("/proc/kallsyms").ok()?;
    let mut line = String::new();
    BufReader::new(file).read_line(&mut line).ok()?;
    let address = line.split_whitespace().next()?;
    if !address.bytes().all(|b| b == b'0') {
        return None;
    }
    let why = if has(CAP_SYSLOG) {
        "kernel.kptr_restrict hides them even with CAP_SYSLOG"
    } else {
        "missing capability CAP_SYSLOG"
    };
    Some(format!(
        "kernel symbol addresses are hidden from spanprof ({why}): kernel frames will be \
         unnamed ([unknown] in [kernel.kallsyms]); use --no-kernel to leave them out"
    ))
}

/// Capabilities spanprof keeps once its programs are loaded and attached, when it still
/// finds processes, reads their files and memory and names kernel frames: CAP_SYS_PTRACE
/// (another user's files through /proc/PID/root, `process_vm_readv`), CAP_DAC_READ_SEARCH
/// (files in directories its user cannot search), CAP_SYSLOG (kernel symbols, read again every
/// minute), CAP_NET_BIND_SERVICE (a metrics port below 1024 after SIGHUP), and with `uprobes`
/// what attaching the allocation probes to a new C library takes: CAP_BPF, CAP_PERFMON and
/// CAP_SYS_ADMIN.
pub fn capabilities_after_loading(uprobes: bool) -> Vec<caps::Capability> {
    use caps::Capability as C;
    let mut keep = vec![
        C::CAP_SYS_PTRACE,
        C::CAP_DAC_READ_SEARCH,
        C::CAP_SYSLOG,
        C::CAP_NET_BIND_SERVICE,
    ];
    if uprobes {
        keep.extend([C::CAP_BPF, C::CAP_PERFMON, C::CAP_SYS_ADMIN]);
    } else if !kernel_at_least(6, 5) {
        // NB: before 6.5, with kernel.unprivileged_bpf_disabled set, every bpf() command
        // (map updates through an open fd too) wants CAP_BPF; since, only creating maps and
        // loading programs does (measured on 6.18: targets are added without it).
        keep.push(C::CAP_BPF);
    }
    keep
}

/// Whether the running kernel is at least `major.minor` (`/proc/sys/kernel/osrelease`); an
/// unreadable release is taken as old.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Drops every capability but `keep` from this thread's effective, permitted, inheritable and
/// ambient sets, for good (threads started later inherit the smaller sets). Returns the names
/// of the capabilities still held, sorted.
pub fn drop_capabilities(keep: &[caps::Capability]) -> Result<Vec<String>, String> {
    use caps::CapSet;
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    let kept: caps::CapsHashSet = permitted
        .iter()
        .copied()
        .filter(|c| keep.contains(c))
        .collect();
    // NB: the effective set must stay within the permitted one at each step.
    caps::clear(None, CapSet::Ambient).map_err(|e| e.to_string())?;
    let none = caps::CapsHashSet::new();
    for (set, value, name) in [
        (CapSet::Effective, &kept, "effective"),
        (CapSet::Inheritable, &none, "inheritable"),
        (CapSet::Permitted, &kept, "permitted"),
    ] {
        caps::set(None, set, value).map_err(|e| format!("cannot set the {name} set: {e}"))?;
    }
    // An execve (none is made) could not give back what was dropped.
    // SAFETY: prctl with these arguments only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "cannot set no_new_privs: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut names: Vec<String> = kept.iter().map(|c| c.to_string()).collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_comm() {
        let s = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0";
        let st = parse_stat(s).unwrap();
        assert_eq!(st.comm, "a) b (c)");
        assert_eq!(st.flags, 4194560);
        assert_eq!(st.state, 'S');
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S 1").is_none());
    }

    #[test]
    fn own_process_passes_and_kthreadd_is_a_kernel_thread() {
        assert!(check_pid(std::process::id()).is_ok());
        match check_pid(2) {
            Err(PreflightError::KernelThread { pid: 2, name }) => assert_eq!(name, "kthreadd"),
            other => panic!("pid 2 should be kthreadd: {other:?}"),
        }
        assert!(matches!(
            check_pid(u32::MAX - 1),
            Err(PreflightError::NoSuchPid(_))
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
        });
        let tid = rx.recv().unwrap();
        let err = check_pid(tid).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{tid} is a thread of process {0}: give the process id, --pid {0}",
                std::process::id()
            )
        );
        t.join().unwrap();
    }
}
