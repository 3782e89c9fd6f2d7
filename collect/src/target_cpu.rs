//! The CPU time of the profiled processes, read from `/proc/PID/stat`: what spanprof's overhead
//! share is a share of.
//!
//! The sampled figure (on-CPU samples × period) cannot serve: a record lost because the ring
//! buffer was full is counted by the kernel under one counter whatever its kind (an on-CPU
//! sample, an off-CPU interval, an exec), so lost records cannot be told apart, and with
//! `--event offcpu` they are no CPU time at all. The kernel's own accounting is exact instead:
//!
//! - a process's `utime + stime` (fields 14, 15) hold every thread it ran, those that exited
//!   included;
//! - a child that exited and was waited for by its parent is added to the parent's `cutime +
//!   cstime` (fields 16, 17), with what it had waited for itself; while not waited for (a
//!   zombie), its own `stat` still reads with its final figures;
//! - a child waited for by spanprof (the `-- CMD` command) goes to spanprof's
//!   `getrusage(RUSAGE_CHILDREN)`.
//!
//! [`TargetCpu`] reads every profiled process when it is added ([`add`]: it counts from then),
//! again when asked ([`refresh`]: once a second in a session, every 10 s in the daemon; [`add`]
//! again when its exit is seen) and at the end of the session or window ([`take`]). A process
//! that [`refresh`] finds in the target map, a child the kernel added at its fork, counts from
//! zero when it started since tracking began. With children followed (`-- CMD`, `--children`,
//! the daemon), a parent's `cutime + cstime` is counted and a child that was waited for by a
//! tracked parent (or by spanprof) is taken from there; without, only `utime + stime` of the
//! named processes. Not seen exactly: a process waited for by a parent that is not tracked (a
//! `--pid` target reaped by its shell, a double-forked daemon reparented to init) counts until
//! its last read, at most one refresh old; a child of a parent that ignores `SIGCHLD` (reaped
//! by the kernel without adding its time anywhere) likewise; a child that was not profiled
//! (one that exited between [`with_descendants`] listing it and its being added) is in its
//! parent's `cutime + cstime` when waited for. A process never read at all (gone before its first read) is counted in
//! [`Measured::unreadable`]; when no process could be read, the caller falls back to the
//! samples' estimate.
//!
//! [`add`]: TargetCpu::add
//!
//! [`refresh`]: TargetCpu::refresh
//! [`take`]: TargetCpu::take

use std::io::Read;

use rustc_hash::FxHashMap;

/// The figures of one `/proc/PID/stat` that the CPU accounting uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatTimes {
    /// `ppid` (field 4).
    pub ppid: u32,
    /// `utime + stime` (fields 14, 15), clock ticks: every thread of the process.
    pub own_ticks: u64,
    /// `cutime + cstime` (fields 16, 17), clock ticks: the children it waited for.
    pub children_ticks: u64,
    /// `starttime` (field 22), clock ticks since boot.
    pub start_ticks: u64,
}

/// Parses `/proc/PID/stat` (cut at the last `)`: `comm` may hold spaces and parentheses).
pub fn parse_stat_times(stat: &str) -> Option<StatTimes> {
    let close = stat.rfind(')')?;
    // After ") ": state(3) ppid(4) … utime(14) stime(15) cutime(16) cstime(17) … starttime(22).
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    let field = |f: &mut std::str::SplitWhitespace<'_>, skip: usize| -> Option<u64> {
        f.nth(skip)?.parse().ok()
    };
    let ppid = field(&mut fields, 1)?; // field 4
    let utime = field(&mut fields, 9)?; // field 14
    let stime = field(&mut fields, 0)?;
    // NB: cutime and cstime are printed signed; they are never negative.
    let cutime = field(&mut fields, 0)?;
    let cstime = field(&mut fields, 0)?;
    let start = field(&mut fields, 4)?; // field 22
    Some(StatTimes {
        ppid: u32::try_from(ppid).ok()?,
        own_ticks: utime.saturating_add(stime),
        children_ticks: cutime.saturating_add(cstime),
        start_ticks: start,
    })
}

/// The targets' CPU time over a session or a daemon window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measured {
    /// Nanoseconds of CPU (user + system) of the profiled processes.
    pub ns: u64,
    /// Processes read at least once.
    pub processes: u32,
    /// Processes that could not be read at all (gone before their first read).
    pub unreadable: u32,
}

/// One tracked process.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// Its `starttime`: a pid reused by another process has another.
    start_ticks: u64,
    /// Its parent at the last read.
    ppid: u32,
    /// What it had used when the session or window began (0 for a process started since).
    base_ns: u64,
    /// What it had used at the last read.
    last_ns: u64,
}

/// Tracks the CPU time of the profiled processes (see the module's documentation).
#[derive(Debug)]
pub struct TargetCpu {
    /// Count `cutime + cstime` (children are followed) and take children waited for from their
    /// parent.
    children: bool,
    tick_ns: u64,
    /// Boot time in clock ticks when tracking began: a process started since counts from 0.
    since_ticks: u64,
    /// This process (the parent of a `-- CMD` command).
    me: u32,
    /// This process's `RUSAGE_CHILDREN` (ns) when last accounted for.
    reaped_ns: u64,
    procs: FxHashMap<u32, Tracked>,
    /// What processes no longer tracked contributed to the current window (may be negative:
    /// a child waited for by a tracked parent is in the parent's figure whole, so what was
    /// counted of it in earlier windows is taken back).
    carry: i128,
    /// Processes read in the current window.
    read: u32,
    unreadable: u32,
    buf: String,
}

impl TargetCpu {
    /// Starts tracking now; `children`: children of the targets are profiled too.
    pub fn new(children: bool) -> TargetCpu {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let tick_ns = 1_000_000_000 / u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        let boot_ns = (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64);
        TargetCpu::with_clock(children, tick_ns, boot_ns / tick_ns, std::process::id())
            .with_reaped(reaped_children_ns())
    }

    fn with_clock(children: bool, tick_ns: u64, since_ticks: u64, me: u32) -> TargetCpu {
        TargetCpu {
            children,
            tick_ns,
            since_ticks,
            me,
            reaped_ns: 0,
            procs: FxHashMap::default(),
            carry: 0,
            read: 0,
            unreadable: 0,
            buf: String::new(),
        }
    }

    fn with_reaped(mut self, reaped_ns: u64) -> TargetCpu {
        self.reaped_ns = reaped_ns;
        self
    }

    /// Starts tracking `pid`, a process just added to the profiled set: it counts from now. A
    /// process already tracked is read again (call it when its exit is seen: a zombie's
    /// figures are final).
    pub fn add(&mut self, pid: u32) {
        self.read_one(pid, true);
    }

    fn read_one(&mut self, pid: u32, explicit: bool) {
        let stat = self.read_stat(pid);
        if stat.is_none() && !self.procs.contains_key(&pid) {
            self.unreadable += 1;
        }
        self.update(pid, stat, explicit, reaped_children_ns);
    }

    /// Reads every tracked process again, and starts tracking those of `pids` not tracked yet
    /// (the profiled set now): children the kernel added at their fork, so one started since
    /// tracking began counts from zero.
    pub fn refresh(&mut self, pids: &[u32]) {
        let mut all: Vec<u32> = self.procs.keys().copied().collect();
        all.extend(pids.iter().filter(|p| !self.procs.contains_key(p)));
        for pid in all {
            self.read_one(pid, false);
        }
    }

    /// Stops tracking every process (the profiled set was emptied): what they used until now
    /// stays in the current window.
    pub fn untrack_all(&mut self) {
        self.refresh(&[]);
        self.drop_all();
    }

    fn drop_all(&mut self) {
        for t in self.procs.values() {
            self.carry += i128::from(t.last_ns) - i128::from(t.base_ns);
        }
        self.procs.clear();
    }

    /// Ends a session or window: reads every tracked process (and `pids`, the profiled set
    /// now), and returns their CPU time since it began; the next window begins now. `None`
    /// when no process could be read.
    pub fn take(&mut self, pids: &[u32]) -> Option<Measured> {
        self.refresh(pids);
        Some(self.settle()).filter(|m| m.processes > 0)
    }

    /// The window's sum, then the next window's bases.
    fn settle(&mut self) -> Measured {
        let mut total = self.carry;
        for t in self.procs.values_mut() {
            total += i128::from(t.last_ns) - i128::from(t.base_ns);
            t.base_ns = t.last_ns;
        }
        let out = Measured {
            ns: u64::try_from(total.max(0)).unwrap_or(u64::MAX),
            processes: self.read,
            unreadable: self.unreadable,
        };
        self.carry = 0;
        self.read = u32::try_from(self.procs.len()).unwrap_or(u32::MAX);
        self.unreadable = 0;
        out
    }

    /// Applies one read of `pid` (`None`: it is gone, waited for by its parent); `explicit`: a
    /// new process counts from this read, not from its start.
    fn update(
        &mut self,
        pid: u32,
        stat: Option<StatTimes>,
        explicit: bool,
        reaped: impl Fn() -> u64,
    ) {
        let old = self.procs.get(&pid).copied();
        match (old, stat) {
            (Some(t), Some(s)) if t.start_ticks == s.start_ticks => {
                let now = self.ns_of(&s);
                let t = self.procs.get_mut(&pid).expect("tracked");
                t.last_ns = now;
                t.ppid = s.ppid;
            }
            (old, Some(s)) => {
                // A new process, or the pid reused by one (the old one is gone).
                if let Some(t) = old {
                    self.gone(t, &reaped);
                }
                let now = self.ns_of(&s);
                let base = if !explicit && s.start_ticks >= self.since_ticks {
                    0
                } else {
                    now
                };
                self.procs.insert(
                    pid,
                    Tracked {
                        start_ticks: s.start_ticks,
                        ppid: s.ppid,
                        base_ns: base,
                        last_ns: now,
                    },
                );
                self.read += 1;
            }
            (Some(t), None) => {
                self.procs.remove(&pid);
                self.gone(t, &reaped);
            }
            (None, None) => {}
        }
    }

    /// Accounts for a process that was waited for.
    fn gone(&mut self, t: Tracked, reaped: &impl Fn() -> u64) {
        if self.children && t.ppid == self.me {
            // The command: its whole time (and its waited-for children's) is in ours.
            let now = reaped();
            self.carry += i128::from(now.saturating_sub(self.reaped_ns)) - i128::from(t.base_ns);
            self.reaped_ns = now;
        } else if self.children && self.procs.contains_key(&t.ppid) {
            // In its parent's cutime + cstime now, whole: what was counted of it before goes.
            self.carry -= i128::from(t.base_ns);
        } else {
            // Waited for elsewhere: its last read.
            self.carry += i128::from(t.last_ns) - i128::from(t.base_ns);
        }
    }

    fn ns_of(&self, s: &StatTimes) -> u64 {
        let ticks = if self.children {
            s.own_ticks.saturating_add(s.children_ticks)
        } else {
            s.own_ticks
        };
        ticks.saturating_mul(self.tick_ns)
    }

    fn read_stat(&mut self, pid: u32) -> Option<StatTimes> {
        self.buf.clear();
        let mut f = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
        f.read_to_string(&mut self.buf).ok()?;
        parse_stat_times(&self.buf)
    }
}

/// This process's `RUSAGE_CHILDREN` (user + system), ns: the children it waited for.
fn reaped_children_ns() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ns = |t: libc::timeval| (t.tv_sec as u64) * 1_000_000_000 + (t.tv_usec as u64) * 1000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

/// `pids` and every process descended from them now (from each process's parent in
/// `/proc/PID/stat`), sorted: the workers a pre-fork server (gunicorn, uwsgi, celery) started
/// before a session that follows children (`--pid … --children`) or a `dump --children`.
pub fn with_descendants(pids: &[u32]) -> Vec<u32> {
    let mut all: std::collections::BTreeSet<u32> = pids.iter().copied().collect();
    let mut kids: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if let Some(times) = parse_stat_times(&stat) {
                kids.entry(times.ppid).or_default().push(pid);
            }
        }
    }
    let mut queue: Vec<u32> = pids.to_vec();
    while let Some(p) = queue.pop() {
        for &k in kids.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if all.insert(k) {
                queue.push(k);
            }
        }
    }
    all.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 10_000_000;
    const ME: u32 = 7;

    fn stat(ppid: u32, own: u64, children: u64, start: u64) -> Option<StatTimes> {
        Some(StatTimes {
            ppid,
            own_ticks: own,
            children_ticks: children,
            start_ticks: start,
        })
    }

    #[test]
    fn parses_stat_with_odd_names() {
        let line = "4242 (a b) c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 12 3 20 0 3 0 \
                    987654 12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 \
                    0 0";
        assert_eq!(
            parse_stat_times(line),
            Some(StatTimes {
                ppid: 17,
                own_ticks: 325,
                children_ticks: 15,
                start_ticks: 987654,
            })
        );
        assert_eq!(parse_stat_times("4242 (x) S 1 2"), None);
        assert_eq!(parse_stat_times("garbage"), None);
    }

    #[test]
    fn a_named_process_counts_from_its_first_read() {
        // Started before tracking (tick 1000): its 5 s before do not count.
        let mut cpu = TargetCpu::with_clock(false, TICK, 1000, ME);
        cpu.update(100, stat(50, 500, 7, 10), true, || 0);
        cpu.update(100, stat(50, 620, 9, 10), true, || 0);
        let m = cpu.settle();
        assert_eq!(m.ns, 120 * TICK);
        assert_eq!((m.processes, m.unreadable), (1, 0));
        // The next window from there; without children, cutime is not counted.
        cpu.update(100, stat(50, 650, 900, 10), true, || 0);
        assert_eq!(cpu.settle().ns, 30 * TICK);
        // Gone (waited for by a parent that is not tracked): its last read stands.
        cpu.update(100, stat(50, 700, 900, 10), true, || 0);
        cpu.update(100, None, true, || 0);
        assert_eq!(cpu.settle().ns, 50 * TICK);
        assert_eq!(cpu.settle().processes, 0);
    }

    #[test]
    fn children_waited_for_are_counted_once() {
        let mut cpu = TargetCpu::with_clock(true, TICK, 1000, ME);
        // The parent (named, older) and a child started since (counts from 0).
        cpu.update(100, stat(50, 400, 100, 10), true, || 0);
        cpu.update(200, stat(100, 30, 0, 1500), false, || 0);
        let first = cpu.settle();
        assert_eq!((first.ns, first.processes), (30 * TICK, 2));
        // The child runs 20 more ticks, exits and is waited for by the parent: its 50 ticks
        // land in the parent's cutime, of which 30 were counted already.
        cpu.update(200, None, false, || 0);
        cpu.update(100, stat(50, 410, 150, 10), true, || 0);
        assert_eq!(cpu.settle().ns, (10 + 50 - 30) * TICK);
        // A grandchild's parent gone, reparented to init: its own last read.
        cpu.update(300, stat(1, 40, 0, 2000), false, || 0);
        cpu.update(300, None, false, || 0);
        assert_eq!(cpu.settle().ns, 40 * TICK);
    }

    #[test]
    fn the_command_is_taken_from_what_spanprof_waited_for() {
        let mut cpu = TargetCpu::with_clock(true, TICK, 1000, ME).with_reaped(7 * TICK);
        // Started just before tracking began: counts from its first read (3 ticks).
        cpu.update(100, stat(ME, 3, 0, 999), true, || 0);
        cpu.update(100, stat(ME, 80, 0, 999), true, || 0);
        // Waited for by spanprof, with 100 ticks of its own and 20 of its children's.
        cpu.update(100, None, true, || 127 * TICK);
        assert_eq!(cpu.settle().ns, (100 + 20 - 3) * TICK);
    }

    #[test]
    fn a_reused_pid_is_another_process() {
        let mut cpu = TargetCpu::with_clock(false, TICK, 1000, ME);
        // Named after it started: from its first read.
        cpu.update(100, stat(50, 10, 0, 1100), true, || 0);
        cpu.update(100, stat(50, 40, 0, 1100), true, || 0);
        // Another process with its pid, added by the kernel at its fork: from zero.
        cpu.update(100, stat(60, 5, 0, 1200), false, || 0);
        let m = cpu.settle();
        assert_eq!((m.ns, m.processes), ((30 + 5) * TICK, 2));
    }

    #[test]
    fn untracked_processes_keep_what_they_used() {
        let mut cpu = TargetCpu::with_clock(true, TICK, 1000, ME);
        cpu.update(100, stat(50, 10, 0, 900), true, || 0);
        cpu.update(100, stat(50, 25, 0, 900), true, || 0);
        cpu.drop_all();
        // Added again later: from then on.
        cpu.update(100, stat(50, 40, 0, 900), true, || 0);
        cpu.update(100, stat(50, 42, 0, 900), true, || 0);
        assert_eq!(cpu.settle().ns, (15 + 2) * TICK);
    }
}
