//! Which processes of the host match the daemon's [`Scope`]: a scan of `/proc` for processes
//! not seen yet. Children of a matched process are added by the kernel as they are forked
//! (`follow_children`), so a process started by a matched one is profiled from its first
//! instruction; others are found by the next scan.

use std::collections::HashSet;

use super::config::Scope;
use crate::resource::container_id;

/// `*` (any run of characters, `/` included) and `?` (one character) glob matching.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative matching with backtracking to the last `*`: O(len(p) * len(t)) at worst.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// What the scope is matched against, read from `/proc/PID`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcFacts {
    /// `/proc/PID/comm`.
    pub comm: String,
    /// The basename of `/proc/PID/exe` (empty for kernel threads or without permission).
    pub exe_name: String,
    /// The cgroup v2 path (`0::PATH`).
    pub cgroup: String,
    /// The container id, from the cgroup path.
    pub container: Option<String>,
}

impl ProcFacts {
    /// Reads them; `None` when the process is gone.
    pub fn read(pid: u32) -> Option<ProcFacts> {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let exe_name = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cgroup = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("")
            .to_string();
        Some(ProcFacts {
            comm: comm.trim_end().to_string(),
            exe_name,
            cgroup,
            container: container_id(&cgroups),
        })
    }
}

impl Scope {
    /// Whether a process with these facts is in scope.
    pub fn matches(&self, pid: u32, facts: &ProcFacts) -> bool {
        if self.is_host() || self.pids.contains(&pid) {
            return true;
        }
        let name = |p: &String| {
            glob(p, &facts.comm) || (!facts.exe_name.is_empty() && glob(p, &facts.exe_name))
        };
        self.executables.iter().any(name)
            || self.cgroups.iter().any(|p| glob(p, &facts.cgroup))
            || facts
                .container
                .as_deref()
                .is_some_and(|id| self.containers.iter().any(|c| id.starts_with(c.as_str())))
    }
}

/// Whether `pid` is a kernel thread (false when it is gone).
pub fn is_kernel_thread(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| crate::preflight::parse_stat(&stat))
        .is_some_and(|stat| stat.is_kernel_thread())
}

/// The pids in `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Finds the processes that came into scope since the last scan.
#[derive(Debug, Default)]
pub struct Scanner {
    /// Pids looked at already (matched or not), forgotten when they leave `/proc`.
    seen: HashSet<u32>,
}

impl Scanner {
    /// Forgets every process, so the next scan looks at all of them (a new scope).
    pub fn reset(&mut self) {
        self.seen.clear();
    }

    /// The processes of `/proc` not looked at before that match `scope`, but never `exclude`
    /// (the daemon itself).
    pub fn scan(&mut self, scope: &Scope, exclude: u32) -> Vec<u32> {
        let pids = all_pids();
        let live: HashSet<u32> = pids.iter().copied().collect();
        self.seen.retain(|p| live.contains(p));
        let mut out = Vec::new();
        for pid in pids {
            if pid == exclude || !self.seen.insert(pid) {
                continue;
            }
            // Kernel threads have no user stacks, resources or libraries worth a target slot.
            let in_scope = scope.pids.contains(&pid)
                || (!is_kernel_thread(pid)
                    && (scope.is_host()
                        || ProcFacts::read(pid).is_some_and(|f| scope.matches(pid, &f))));
            if in_scope {
                out.push(pid);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("python3*", "python3.11", true),
            ("python3*", "python", false),
            ("*", "", true),
            ("nova-?pi", "nova-api", true),
            (
                "/system.slice/*.service",
                "/system.slice/nova-api.service",
                true,
            ),
            ("/system.slice/*.service", "/user.slice/x.scope", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob(p, t), want, "{p:?} {t:?}");
        }
    }

    #[test]
    fn scope_matches_names_cgroups_and_containers() {
        let facts = ProcFacts {
            comm: "python3".to_string(),
            exe_name: "python3.11".to_string(),
            cgroup: "/system.slice/docker-abc.scope".to_string(),
            container: Some("3f4e".to_string() + &"0".repeat(60)),
        };
        let scope = |f: fn(&mut Scope)| {
            let mut s = Scope {
                pids: vec![999_999],
                ..Scope::default()
            };
            f(&mut s);
            s
        };
        assert!(scope(|s| s.executables.push("python3.1?".into())).matches(1, &facts));
        assert!(scope(|s| s.executables.push("python3".into())).matches(1, &facts));
        assert!(!scope(|s| s.executables.push("nova*".into())).matches(1, &facts));
        assert!(scope(|s| s.cgroups.push("/system.slice/*".into())).matches(1, &facts));
        assert!(scope(|s| s.containers.push("3f4e".into())).matches(1, &facts));
        assert!(!scope(|s| s.containers.push("3f5".into())).matches(1, &facts));
        assert!(scope(|_| {}).matches(999_999, &ProcFacts::default()));
        assert!(Scope::default().matches(1, &ProcFacts::default()));
    }

    #[test]
    fn kernel_threads_are_known_by_their_flags() {
        // kthreadd is pid 2 on Linux; this process is not a kernel thread.
        assert!(is_kernel_thread(2));
        assert!(!is_kernel_thread(std::process::id()));
        assert!(!is_kernel_thread(u32::MAX));
    }

    #[test]
    fn the_scan_finds_this_process_once_and_never_the_excluded() {
        let me = std::process::id();
        let scope = Scope {
            pids: vec![me],
            ..Scope::default()
        };
        let mut scanner = Scanner::default();
        assert_eq!(scanner.scan(&scope, 0), [me]);
        assert!(scanner.scan(&scope, 0).is_empty());
        scanner.reset();
        assert!(scanner.scan(&scope, me).is_empty());
    }
}
