//! One tick of a collection: wait for samples (or a watched process's exit), drain the ring
//! buffer into the aggregate, probe the processes found meanwhile, and normalize the addresses
//! of new stacks while their processes live.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use profiler_common::{Record, MAX_STACK_COPY, PY_NONE, USTACK_COPY_OK};

use super::Collector;

/// How often a collection wakes up when no sample arrives, while it is lively (see
/// [`QUIET_TICK`]).
pub const TICK: Duration = Duration::from_millis(50);

/// How often a quiet collection wakes up: no process new to it, exec'd or with a sample in code
/// its map did not hold (what [`symbolizer::Symbolizer::seen`] reads the map again for: new
/// code found only in callers' frames does not count) for [`QUIET_AFTER`]. The kernel still
/// wakes it at once for what cannot wait (a process's first samples, an exec, a long off-CPU
/// wait, a ring buffer filling up), and so does a session's target's exit (its pidfd; a child's
/// exit does not wake it); what is left is the drain of samples from processes whose modules
/// are read already. At 99 Hz on one busy thread a tick drains 10 samples rather than 5: a
/// wake-up, a poll and a look at the span objects cost the same for either. (Not longer: a tracing library imported mid-session
/// is looked for at each tick, so its first spans are read within about this long.)
pub const QUIET_TICK: Duration = Duration::from_millis(100);

/// How long a collection stays lively after a process appeared, exec'd or mapped new code: its
/// libraries are often still being loaded, or it is a short-lived child whose addresses are
/// best normalized while it runs.
pub const QUIET_AFTER: Duration = Duration::from_secs(1);

/// How often a long drain stops to look for new interpreters.
const DETECT_DURING_DRAIN: Duration = Duration::from_millis(10);

impl Collector {
    /// One tick's work after the wait: drain, probe what was found, normalize new stacks.
    pub fn tick(&mut self) {
        self.drain();
        self.python.read_ahead_if_due();
        self.probes.python(&mut self.programs, &mut self.python);
        self.agg.normalize_pending(&mut self.symbolizer);
    }

    /// Drains the ring buffer into the aggregate, then looks for the interpreters of processes
    /// that just appeared or exec'd.
    pub fn drain(&mut self) {
        let Collector {
            programs,
            agg,
            python,
            copy,
            symbolizer,
            lively_until,
            ..
        } = self;
        let mut lively = false;
        agg.next_drain();
        symbolizer.next_drain();
        let mut looked = Instant::now();
        let mut n = 0u32;
        loop {
            let Some(item) = programs.samples.next() else {
                break;
            };
            match Record::from_bytes(&item) {
                Some(Record::Sample(sample)) => {
                    // A process's modules are read at its first sample, while it (most likely)
                    // lives: a drain of a backlog can take longer than a short-lived child.
                    let h = sample.header;
                    let ip = if h.ustack_copy_status & 0xff == USTACK_COPY_OK {
                        h.user_ip
                    } else {
                        sample.user_stack().first().copied().unwrap_or(0)
                    };
                    lively |= symbolizer.seen(h.pid, ip);
                    // Discovery: a process new to the collection (or whose kernel entry was
                    // lost) is looked at for an interpreter before its frames are named.
                    if agg.accepts(h.pid) {
                        python.saw(
                            h.pid,
                            !sample.python_stack().is_empty(),
                            sample.python_status() != PY_NONE,
                            h.time_ns,
                        );
                    }
                    agg.record(&sample, python)
                }
                Some(Record::Exec(e)) => {
                    lively = true;
                    python.exec(e.pid);
                    agg.exec(e.pid, e.time_ns);
                    symbolizer.exec(e.pid);
                }
                Some(Record::Exit(e)) => agg.exited(e.pid),
                Some(Record::Refused(e)) => {
                    let comm = std::fs::read_to_string(format!("/proc/{}/comm", e.pid))
                        .map(|c| c.trim_end().to_string())
                        .unwrap_or_default();
                    eprintln!(
                        "spanprof: warning: pid {} ({comm}) started a program that runs with \
                         other credentials (setuid, setgid or file capabilities): no longer \
                         profiled, as --pid refuses such a process without CAP_SYS_PTRACE",
                        e.pid
                    );
                    agg.exited(e.pid);
                }
                None => {}
            }
            // A long drain (a backlog, cold module tables) still hands new interpreters to the
            // kernel every few ms: a short-lived child must be found while it runs.
            // A program that just exec'd is looked at again when due (its libpython mapped
            // by now), not after the drain: its next samples are walked.
            n = n.wrapping_add(1);
            if python.due_now() || n.is_multiple_of(64) && looked.elapsed() >= DETECT_DURING_DRAIN {
                drop(item);
                python.detect_pending(programs);
                looked = Instant::now();
            }
        }
        if lively {
            *lively_until = Instant::now() + QUIET_AFTER;
        }
        python.detect_pending(programs);
        // A process whose stacks the copy cut short gets the largest copy from the next sample
        // on (its children too, in the kernel): deep C recursion, e.g. CPython 3.8-3.10's.
        for pid in agg.take_truncated_by_copy() {
            // Not for a process that exited meanwhile (the kernel dropped its entries already).
            if programs.is_target(pid)
                && programs.set_stack_copy(pid, MAX_STACK_COPY as u32).is_ok()
            {
                copy.raised.push(pid);
            }
        }
    }

    /// How long the loop may wait for samples: [`TICK`] while lively, [`QUIET_TICK`] once
    /// quiet, or less when a process that just exec'd is due to be looked at again for its
    /// interpreter (its own samples do not wake the loop), the off-CPU read-ahead is due, or a
    /// young Python process's quick look for the tracing libraries it imports.
    pub fn max_wait(&self) -> Duration {
        let now = Instant::now();
        let tick = if now < self.lively_until {
            TICK
        } else {
            QUIET_TICK
        };
        [
            self.python.next_due(),
            self.python.next_read_ahead(),
            self.python.next_span_look(),
        ]
        .into_iter()
        .flatten()
        .map(|due| due.saturating_duration_since(now))
        .fold(tick, Duration::min)
    }

    /// A waiter on this collection's ring buffer and on the exit of `pids`.
    pub fn waiter(&self, pids: &[u32]) -> Waiter {
        Waiter::new(self.programs.samples.as_raw_fd(), pids)
    }
}

/// A pidfd for `pid` (Linux 5.3+): it polls readable when the process exits, so the loop learns
/// of exits without a system call per target per tick.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    // SAFETY: a non-negative return is a fresh fd that we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// What a loop waits on: the ring buffer first, then one pidfd per watched process.
pub struct Waiter {
    pfds: Vec<libc::pollfd>,
    /// Watched pids, parallel to `pfds[1..]`; their fds are kept open here.
    watched: Vec<(u32, Option<OwnedFd>)>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

impl Waiter {
    fn new(ring_fd: i32, pids: &[u32]) -> Waiter {
        let watched: Vec<(u32, Option<OwnedFd>)> =
            pids.iter().map(|&p| (p, pidfd_open(p))).collect();
        let mut pfds = vec![libc::pollfd {
            fd: ring_fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        pfds.extend(watched.iter().map(|(_, fd)| libc::pollfd {
            // NB: poll ignores negative fds; without a pidfd the pid is checked in /proc.
            fd: fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        }));
        Waiter { pfds, watched }
    }

    /// Waits up to `timeout` for samples past the wake-up mark or for a watched process to
    /// exit; a signal ends the wait early.
    pub fn wait(&mut self, timeout: Duration) {
        // Whole ms, rounded up: a wait shorter than one is not a busy loop.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: `pfds` is a valid array of pollfds of the given length.
        let r = unsafe { libc::poll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, ms) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // NB: never spin: without poll (e.g. too many fds), the loop still ticks.
            std::thread::sleep(timeout);
        }
    }

    /// Pids that exited since the last call; each is reported once.
    pub fn exited(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, (pid, fd)) in self.watched.iter().enumerate() {
            let pfd = &mut self.pfds[i + 1];
            let gone = match fd {
                Some(_) if pfd.fd >= 0 => pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0,
                Some(_) => false,
                None => pfd.events != 0 && !crate::preflight::is_running(*pid),
            };
            if gone {
                pfd.fd = -1;
                pfd.events = 0;
                out.push(*pid);
            }
        }
        out
    }
}
