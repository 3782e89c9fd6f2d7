//! A time-limited profiling session (`spanprof profile`): the targets set up, the
//! [collector](crate::collect) ticked until a stop condition, and the profile built.
//!
//! The loop waits on the ring buffer's file descriptor and the targets' pidfds (at most
//! [`TICK`], or [`collect::QUIET_TICK`] once no process is new: see
//! [`Collector::max_wait`]), has the collector drain every record into its aggregate and normalize addresses
//! of new stacks while their processes live, and checks the stop conditions: duration over,
//! Ctrl-C/SIGTERM, the command exited, or every target process exited.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use profiler_common::{ErrorCode, ERROR_COUNT};

use crate::aggregate;
use crate::bpf::{Programs, ThreadState};
use crate::collect::{self, signals, Collector, Stopped, TICK};
pub use crate::collect::{process_cpu_time, Overhead, StackCopySizes};
use crate::command::GatedCommand;
use crate::preflight;
use crate::profile::Profile;

/// How often an off-CPU session names the code objects on its Python threads' stacks ahead of
/// their samples ([`spanprof_pipeline::python::Python::set_read_ahead`]; the loop wakes for
/// it, a few ms late at most): a last wait that spans one of these reads keeps its names when its
/// process exits at once.
const READ_AHEAD_EVERY: Duration = Duration::from_millis(200);

/// What to profile.
#[derive(Debug, Clone)]
pub enum Target {
    /// Running processes, by pid.
    Pids(Vec<u32>),
    /// A command to run; it and its children are profiled until it exits.
    Command(Vec<OsString>),
}

/// Options of a session (the `profile` subcommand's flags, with defaults).
#[derive(Debug, Clone)]
pub struct Options {
    /// What to profile.
    pub target: Target,
    /// Stop after this long; `None` runs until the command or the targets exit, or Ctrl-C.
    pub duration: Option<Duration>,
    /// What to sample, and how; `follow_children` is `--children` (always on for a command).
    pub sampling: collect::Options,
    /// What to keep of each sample (kernel frames, Python lines, native frames).
    pub aggregate: aggregate::Options,
    /// Show a progress bar (stderr is a terminal) or plain progress lines.
    pub progress: bool,
    /// `--redact-paths`: the paths in what the session prints (the start line, warnings) are
    /// redacted as the profile's will be.
    pub redact_paths: Option<crate::privacy::PathMode>,
    /// Fetch debug files of stripped modules from the servers of `DEBUGINFOD_URLS`, when it
    /// is set (`--no-debuginfod` turns it off).
    pub debuginfod: bool,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The requested duration passed.
    Duration,
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// The command exited.
    CommandExited,
    /// Every target process exited (the pids that exited, in order).
    TargetsExited(Vec<u32>),
}

/// What a session produced.
#[derive(Debug)]
pub struct Outcome {
    /// The symbolized profile.
    pub profile: Profile,
    /// How the session ended.
    pub ending: Ending,
    /// Targets that exited during the session (pid mode).
    pub exited: Vec<(u32, Duration)>,
    /// The command, in command mode; it may still run (see [`Outcome::wait_command`]).
    pub command: Option<GatedCommand>,
    /// Kernel-side error counters, by [`ErrorCode`].
    pub errors: [u64; ERROR_COUNT as usize],
    /// Symbolizer counters.
    pub symbolizer: symbolizer::Stats,
    /// Stack copy sizes, and the processes whose copy was raised.
    pub stack_copy: StackCopySizes,
    /// What the stack unwinders read (`--unwind dwarf`).
    pub unwind: symbolizer::unwind::UnwindStats,
    /// spanprof's own CPU time, by phase.
    pub overhead: Overhead,
    /// Off-CPU time the profile does not hold (`--event offcpu`, `wall`).
    pub off_cpu_unseen: Option<OffCpuUnseen>,
    /// With [`aggregate::Options::record`]: the recording (gzip), or why it could not be kept.
    pub recording: Option<Result<Vec<u8>, String>>,
}

/// Whether this process is in the terminal's foreground process group, so a Ctrl-C from that
/// terminal reached the command too.
fn in_terminal_foreground() -> bool {
    // SAFETY: both calls only read process state.
    unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp() }
}

impl Outcome {
    /// Waits for the command (command mode) and returns its status. Call it after the outputs
    /// are written: the command may outlive `--duration`, and spanprof waits for it, as `time`
    /// does. A SIGTERM or SIGHUP to spanprof, before or during the wait, is passed on to the command, and
    /// so is a SIGINT that did not come from the terminal the command shares.
    pub fn wait_command(&mut self) -> Result<Option<ExitStatus>> {
        let Some(cmd) = self.command.as_mut() else {
            return Ok(None);
        };
        if let Some(status) = cmd.wait(false)? {
            return Ok(Some(status));
        }
        eprintln!(
            "spanprof: outputs written; waiting for the command (pid {}) to exit",
            cmd.pid()
        );
        let mut passed_on = false;
        loop {
            if let Some(status) = cmd.wait(false)? {
                return Ok(Some(status));
            }
            let sig = signals::stop_signal().unwrap_or(0);
            let pass = sig == libc::SIGTERM
                || sig == libc::SIGHUP
                || (sig == libc::SIGINT && !in_terminal_foreground());
            if pass && !passed_on {
                cmd.signal(sig);
                passed_on = true;
            }
            std::thread::sleep(TICK);
        }
    }
}

/// Progress display: a bar on a terminal, a plain line every few seconds otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    last_line: Instant,
    duration: Option<Duration>,
}

impl Progress {
    /// `shared_terminal`: a command writes to the same terminal, where a redrawn bar would mangle
    /// its output; plain lines are used then.
    fn new(enabled: bool, duration: Option<Duration>, shared_terminal: bool) -> Self {
        let tty = std::io::stderr().is_terminal() && !shared_terminal;
        let bar = (enabled && tty).then(|| {
            let bar = match duration {
                Some(d) => {
                    let b = ProgressBar::new(d.as_millis() as u64);
                    b.set_style(
                        ProgressStyle::with_template(
                            "{spinner} [{elapsed_precise}] {wide_bar} {msg} ({eta} left)",
                        )
                        .expect("valid template"),
                    );
                    b
                }
                None => {
                    let b = ProgressBar::new_spinner();
                    b.set_style(
                        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                            .expect("valid template"),
                    );
                    b
                }
            };
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            plain: enabled && !tty,
            last_line: Instant::now(),
            duration,
        }
    }

    fn update(&mut self, elapsed: Duration, samples: u64, lost: u64) {
        let lost = if lost > 0 {
            format!(", {lost} lost")
        } else {
            String::new()
        };
        if let Some(bar) = &self.bar {
            bar.set_position(elapsed.as_millis() as u64);
            bar.set_message(format!("{samples} samples{lost}"));
        } else if self.plain && self.last_line.elapsed() >= Duration::from_secs(5) {
            self.last_line = Instant::now();
            let of = self
                .duration
                .map(|d| format!(" of {:.0}s", d.as_secs_f64()))
                .unwrap_or_default();
            eprintln!(
                "spanprof: {:.0}s{of}, {samples} samples{lost}",
                elapsed.as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Runs one session to its end.
pub fn run(opts: &Options) -> Result<Outcome> {
    collect::preflight()?;
    let mut target_desc = String::new();
    if let Target::Pids(pids) = &opts.target {
        for &pid in pids {
            let stat = preflight::check_pid(pid)?;
            if !target_desc.is_empty() {
                target_desc.push_str(", ");
            }
            target_desc.push_str(&format!("pid {pid} ({})", stat.comm));
        }
    }
    if opts.aggregate.kernel && !opts.aggregate.python_only {
        if let Some(warning) = preflight::kernel_symbols_warning() {
            eprintln!("spanprof: warning: {warning}");
        }
    }
    let cpu_at_start = process_cpu_time();
    let sampling = collect::Options {
        follow_children: opts.sampling.follow_children || matches!(opts.target, Target::Command(_)),
        ..opts.sampling.clone()
    };
    let events = sampling.events;
    let mut c = Collector::load(&sampling, opts.aggregate)?;
    if sampling.events.off_cpu() {
        // A session's last wait often ends as its process exits (a final join or sleep): the
        // code objects on the threads' stacks are named while they wait. Measured: 50 threads
        // 32 frames deep, 74 ms of spanprof's CPU over 5 s. Not in the daemon, where a process's
        // exit is rare and the cost would be paid for every Python process all the time.
        c.python.set_read_ahead(Some(READ_AHEAD_EVERY));
    }
    if opts.debuginfod {
        c.symbolizer
            .set_debuginfod(symbolizer::debuginfod::Debuginfod::from_env());
    }
    let mut child = None;
    let mut pids = Vec::new();
    match &opts.target {
        Target::Pids(p) => {
            // With --children, the processes the targets started before the session too (a
            // pre-fork server's workers): the kernel adds only those forked from now on.
            let all = if sampling.follow_children {
                collect::target_cpu::with_descendants(p)
            } else {
                p.clone()
            };
            for &pid in &all {
                let given = p.contains(&pid);
                // Before the pid is a target, so its first samples have their Python frames
                // (found after, the 6-8 ms the look takes were sampled without them).
                // A descendant is checked as a given pid is (a setuid program's process is
                // refused without CAP_SYS_PTRACE), before anything of it is read.
                let checked = if given {
                    Ok(())
                } else {
                    collect::preflight::check_pid(pid)
                        .map(drop)
                        .map_err(anyhow::Error::from)
                };
                let added = checked
                    .and_then(|()| c.discover(pid))
                    .map(|()| c.flush_discovered())
                    .and_then(|()| c.add_target(pid).map_err(anyhow::Error::from));
                match added {
                    Ok(()) => pids.push(pid),
                    Err(e) if given => return Err(e),
                    // A descendant that exited since it was listed, or cannot be read.
                    Err(e) => {
                        if opts.progress {
                            eprintln!("spanprof: warning: descendant {pid} not profiled: {e:#}");
                        }
                        continue;
                    }
                }
            }
            let descendants: Vec<u32> = pids.iter().copied().filter(|d| !p.contains(d)).collect();
            if !descendants.is_empty() && opts.progress {
                let shown: Vec<String> = descendants.iter().take(20).map(u32::to_string).collect();
                eprintln!(
                    "spanprof: --children: also {} process{} the targets started before: {}{}",
                    descendants.len(),
                    if descendants.len() == 1 { "" } else { "es" },
                    shown.join(", "),
                    if descendants.len() > 20 { ", …" } else { "" }
                );
            }
        }
        Target::Command(argv) => {
            let mut cmd = GatedCommand::spawn(argv)?;
            c.add_target(cmd.pid())?;
            // The command has not run its program yet: probe the C library spanprof itself
            // uses, the one of most programs on the host (others' are probed as they are found).
            c.probe_own_libc()?;
            if signals::stop_signal().is_some() {
                // Dropping the unreleased command makes it exit 127 without running.
                bail!("interrupted before the command started");
            }
            cmd.release()?;
            target_desc = argv
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            pids.push(cmd.pid());
            child = Some(cmd);
        }
    }

    if opts.progress {
        let until = match opts.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until it exits".to_string(),
        };
        let what = match (events.in_bytes(), sampling.alloc_rate) {
            (false, _) => format!("at {} Hz", sampling.frequency),
            (true, 0 | 1) => "recording every allocation".to_string(),
            (true, rate) => format!("sampling allocations every {rate} bytes on average"),
        };
        if let Some(mode) = opts.redact_paths {
            target_desc = crate::privacy::redact_text(&target_desc, mode);
        }
        eprintln!("spanprof: profiling {target_desc} {what} {until}; Ctrl-C to stop early");
    }
    // The pass at the end that counts the threads still blocked, ready to run at once.
    let count_at_end = events.off_cpu()
        && match c.programs.load_task_iterator() {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "spanprof: warning: threads still blocked at the end will not be counted: {e}"
                );
                false
            }
        };
    let cpu_at_sampling = c.start_sampling(&pids);
    // Threads asleep now: their time until they wake is counted from the session's start.
    if events.off_cpu() && matches!(opts.target, Target::Pids(_)) {
        for &pid in &pids {
            c.programs.start_blocked_threads(pid);
        }
    }
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let mut progress = Progress::new(
        opts.progress,
        opts.duration,
        matches!(opts.target, Target::Command(_)),
    );
    let mut exited: Vec<(u32, Duration)> = Vec::new();
    let mut waiter = c.waiter(&pids);
    let mut lost = 0;
    let mut last_check = start;
    let mut said_children = false;

    let ending = loop {
        let remaining = opts
            .duration
            .map(|d| d.saturating_sub(start.elapsed()))
            .unwrap_or(Duration::MAX);
        waiter.wait(remaining.min(c.max_wait()));
        c.tick();
        // One bpf() call a second is enough for the live count; the final one is exact.
        let once_a_second = last_check.elapsed() >= Duration::from_secs(1);
        if once_a_second {
            last_check = Instant::now();
            lost = c.programs.lost_samples();
            c.target_cpu.refresh(&c.programs.target_pids());
        }
        progress.update(start.elapsed(), c.agg.samples(), lost);

        if signals::stop_signal().is_some() {
            break Ending::Interrupted;
        }
        if opts.duration.is_some_and(|d| start.elapsed() >= d) {
            break Ending::Duration;
        }
        let gone = waiter.exited();
        if let Some(cmd) = child.as_mut() {
            // The pidfd says when; a check once a second covers a kernel without pidfds.
            if (!gone.is_empty() || once_a_second) && cmd.wait(false)?.is_some() {
                break Ending::CommandExited;
            }
        } else {
            for pid in gone {
                // Its last read: final while it is a zombie (see `target_cpu`).
                c.target_cpu.add(pid);
                exited.push((pid, start.elapsed()));
                c.programs.remove_target(pid);
            }
            // With --children, the session goes on while children of the targets run (the
            // kernel removes each process from the map when it exits).
            if exited.len() == pids.len() {
                if !(sampling.follow_children && c.programs.has_targets()) {
                    break Ending::TargetsExited(exited.iter().map(|&(p, _)| p).collect());
                }
                if !said_children {
                    said_children = true;
                    eprintln!(
                        "spanprof: the targets exited; profiling their child processes until \
                         they exit"
                    );
                }
            }
        }
    };
    let duration = start.elapsed();
    let mut overhead = c.cost_since_mark();
    // Threads still blocked count up to the end (a thread stuck for the whole session too).
    let counted_at = spanprof_pipeline::monotonic_ns();
    let lost_before = c.programs.lost_samples();
    if count_at_end {
        if let Err(e) = c.programs.count_open_intervals() {
            eprintln!("spanprof: warning: threads still blocked are not counted to the end: {e}");
        }
    }
    let counted = (counted_at, spanprof_pipeline::monotonic_ns());
    let lost_at_end = c.programs.lost_samples().saturating_sub(lost_before);
    if count_at_end && lost_at_end > 0 {
        eprintln!(
            "spanprof: warning: {lost_at_end} records of threads still blocked at the end were \
             lost (the ring buffer was full): their time is not in the profile (a larger \
             --ring-buffer-size keeps them)"
        );
    }
    c.drain();
    overhead.setup = cpu_at_sampling.saturating_sub(cpu_at_start);
    overhead.records = c.agg.samples();
    progress.finish();
    let errors = c.programs.error_counts();
    c.agg.set_errors(&errors);
    let off_cpu_unseen = events
        .off_cpu()
        .then(|| OffCpuUnseen::of(&c.programs, counted));
    if events.heap() {
        c.agg.set_live(c.programs.live_allocations());
        let unattributed = c.agg.unattributed_inuse();
        if unattributed > 0 {
            eprintln!(
                "spanprof: warning: {unattributed} sampled allocations still in use have no \
                 stack: sampled as the session ended (their records not read), or beyond the \
                 million sampled allocations whose stacks are kept (a larger --alloc-rate keeps \
                 fewer)"
            );
        }
    }
    let mut meta = c.meta(
        target_desc,
        start_wall,
        duration,
        errors[ErrorCode::RingbufFull as usize],
    );
    meta.build = crate::profile::Build::from_env();
    // Stop sampling before the (slower) symbolization.
    let Stopped {
        agg,
        mut symbolizer,
        python,
        copy,
    } = c.stop();

    if opts.progress {
        eprintln!("spanprof: symbolizing {} samples", agg.samples());
    }
    let unwind = agg.unwind_stats();
    let (profile, recording) = agg.into_profile_recorded(&mut symbolizer, &python, meta);
    if let Some(client) = symbolizer.debuginfod() {
        let s = client.stats();
        if s.cached + s.fetched + s.missing + s.skipped > 0 {
            let mut line = format!(
                "spanprof: debuginfod ({}): {} debug files fetched, {} from the cache, {} not found",
                client
                    .urls()
                    .iter()
                    .map(|u| symbolizer::debuginfod::without_credentials(u))
                    .collect::<Vec<_>>()
                    .join(" "),
                s.fetched,
                s.cached,
                s.missing
            );
            if s.skipped > 0 {
                line.push_str(&format!(
                    ", {} not asked (the session's {} s were spent)",
                    s.skipped,
                    client.budget.as_secs()
                ));
            }
            if let Some(err) = client.last_error().filter(|_| s.missing > 0) {
                line.push_str(&format!(" (last: {err})"));
            }
            eprintln!("{line}");
        }
    }
    if let Some(line) = refused_files_line(&symbolizer, 0) {
        eprintln!("spanprof: warning: {line}");
    }
    Ok(Outcome {
        profile,
        ending,
        exited,
        command: child,
        errors,
        symbolizer: symbolizer.stats(),
        unwind,
        stack_copy: copy,
        off_cpu_unseen,
        overhead,
        recording,
    })
}

/// What the symbolizer refused to parse past the first `skip` files ([`symbolizer::elf_check`]):
/// how many, and each kept one's path and reason; `None` when nothing more was refused.
pub fn refused_files_line(symbolizer: &symbolizer::Symbolizer, skip: u64) -> Option<String> {
    let (kept, all) = symbolizer.refused_files();
    if all <= skip {
        return None;
    }
    let shown: Vec<String> = kept
        .iter()
        .skip(skip as usize)
        .map(|(path, why)| format!("{}: {why}", path.display()))
        .collect();
    let more = (all - skip).saturating_sub(shown.len() as u64);
    Some(format!(
        "{} module or debug file{} refused as unsafe or too large to read ({}{}); a refused \
         module's frames stay unnamed",
        all - skip,
        if all - skip == 1 { "" } else { "s" },
        shown.join("; "),
        if more > 0 {
            format!("; {more} more")
        } else {
            String::new()
        }
    ))
}

/// Off-CPU time of the targets' threads that the profile does not hold: intervals still open
/// when the session ended (a sample is made when the thread comes back), sampled intervals not
/// sent yet (the thread has not left its system call), and with `--event wall` the time threads
/// waited runnable for a CPU (neither on nor blocked off it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuUnseen {
    /// Threads blocked when the session ended whose time was counted up to it.
    pub counted_threads: u32,
    /// Threads blocked when the session ended whose time was not (the count failed).
    pub open_threads: u32,
    /// Their time blocked, from their switch out (or the session's start) to the end.
    pub open_ns: u64,
    /// Sampled intervals' weight not sent: the thread had not returned to user mode.
    pub pending_ns: u64,
    /// Threads whose state could not be read (a kernel without `PIDFD_THREAD`, before 6.9).
    pub unreadable_threads: u32,
    /// `--event wall`: time the threads waited runnable for a CPU.
    pub runnable_ns: u64,
}

impl OffCpuUnseen {
    /// Reads the kernel's per-thread state of every target, at the end of a session whose
    /// threads still blocked were counted by a pass between `counted` (their intervals start
    /// again then).
    fn of(programs: &Programs, counted: (u64, u64)) -> OffCpuUnseen {
        let now = spanprof_pipeline::monotonic_ns();
        let mut unseen = OffCpuUnseen {
            runnable_ns: programs.error_counts()[ErrorCode::RunnableNs as usize],
            ..Default::default()
        };
        for pid in programs.target_pids() {
            for (_, state) in programs.offcpu_threads(pid) {
                match state {
                    ThreadState::Known(t) => {
                        if (counted.0..=counted.1).contains(&t.off_ts) {
                            unseen.counted_threads += 1;
                        } else if t.off_ts != 0 && t.off_ts <= now {
                            unseen.open_threads += 1;
                            unseen.open_ns += now - t.off_ts;
                        }
                        unseen.pending_ns += t.weight_ns;
                        if t.runnable_ts != 0 && t.runnable_ts <= now {
                            unseen.runnable_ns += now - t.runnable_ts;
                        }
                    }
                    ThreadState::Nothing => {}
                    ThreadState::Unreadable => unseen.unreadable_threads += 1,
                }
            }
        }
        unseen
    }

    /// The summary line, or `None` when nothing is missing: e.g. `off-CPU not in the profile: 3
    /// threads still blocked when the session ended, for 1200.0 ms since they blocked; 0.4 ms
    /// sampled but not sent; 400.0 ms waiting runnable for a CPU`.
    pub fn line(&self, wall: bool) -> Option<String> {
        let mut parts = Vec::new();
        if self.open_threads > 0 {
            parts.push(format!(
                "{} thread{} still blocked when the session ended, for {:.1} ms since they \
                 blocked (or since the start)",
                self.open_threads,
                if self.open_threads == 1 { "" } else { "s" },
                self.open_ns as f64 / 1e6
            ));
        }
        if self.pending_ns > 0 {
            parts.push(format!(
                "{:.1} ms sampled but not sent (the threads had not returned from their system \
                 call)",
                self.pending_ns as f64 / 1e6
            ));
        }
        if self.unreadable_threads > 0 {
            parts.push(format!(
                "the state of {} threads unreadable (Linux 6.9 reads a thread's by pidfd)",
                self.unreadable_threads
            ));
        }
        if wall && self.runnable_ns > 0 {
            parts.push(format!(
                "{:.1} ms waiting runnable for a CPU",
                self.runnable_ns as f64 / 1e6
            ));
        }
        (!parts.is_empty()).then(|| format!("off-CPU not in the profile: {}", parts.join("; ")))
    }
}

/// Exit code a shell would report for a command's status (128+signal when killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod off_cpu_unseen_tests {
    use super::OffCpuUnseen;

    #[test]
    fn says_what_the_profile_does_not_hold() {
        assert_eq!(OffCpuUnseen::default().line(true), None);
        let unseen = OffCpuUnseen {
            counted_threads: 1,
            open_threads: 2,
            open_ns: 1_500_000,
            pending_ns: 400_000,
            unreadable_threads: 0,
            runnable_ns: 2_000_000,
        };
        assert_eq!(
            unseen.line(true).as_deref(),
            Some(
                "off-CPU not in the profile: 2 threads still blocked when the session ended, for \
                 1.5 ms since they blocked (or since the start); 0.4 ms sampled but not sent (the \
                 threads had not returned from their system call); 2.0 ms waiting runnable for a \
                 CPU"
            )
        );
        // Runnable time is only summed for --event wall.
        assert!(!unseen.line(false).unwrap().contains("runnable"));
    }
}
