//! A time-limited profiling session: load, sample, drain, stop, build the profile.
//!
//! The loop waits on the ring buffer's file descriptor (at most `TICK`), drains every record
//! into the [`Aggregator`], normalizes addresses of new stacks while their processes live, and
//! checks the stop conditions: duration over, Ctrl-C/SIGTERM, the command exited, or every
//! target process exited.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use profiler_common::{ErrorCode, Record, ERROR_COUNT, MAX_STACK_COPY, USTACK_COPY_OK};
use symbolizer::Symbolizer;

use crate::aggregate::{self, Aggregator};
use crate::bpf::{AllocOptions, LoadOptions, OffCpuOptions, Programs, ThreadState};
use crate::command::GatedCommand;
use crate::preflight;
use crate::profile::{Events, Meta, Profile};
use crate::python::Python;
use crate::target_cpu::TargetCpu;

/// How often the loop wakes up when no sample arrives.
const TICK: Duration = Duration::from_millis(50);

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
    /// Samples per second per CPU. Default 99 (not 100, to avoid lockstep with timers).
    pub frequency: u64,
    /// What to keep of each sample (kernel frames, Python lines, native frames).
    pub aggregate: aggregate::Options,
    /// Profile children of `--pid` targets too (always on for a command).
    pub children: bool,
    /// Ring buffer size in bytes (`--ring-buffer-size`, default 16 MiB).
    pub ring_buffer_size: u32,
    /// Kernel BTF file. Default `/sys/kernel/btf/vmlinux`, or `$SPANPROF_BTF_PATH`.
    pub btf_path: PathBuf,
    /// Show a progress bar (stderr is a terminal) or plain progress lines.
    pub progress: bool,
    /// Read the span context (OpenTelemetry, OSProfiler) of Python threads. Default on.
    pub spans: bool,
    /// Bytes of user stack the kernel copies per sample for unwinding with the modules' unwind
    /// tables (`--unwind dwarf`, `--stack-copy`); 0 for the kernel's frame-pointer walk
    /// (`--unwind fp`).
    pub stack_copy_bytes: u32,
    /// What to sample (`--event`).
    pub events: Events,
    /// Off-CPU intervals shorter than this are not counted (`--offcpu-min`).
    pub offcpu_min_ns: u64,
    /// `--redact-paths`: the paths in what the session prints (the start line, warnings) are
    /// redacted as the profile's will be.
    pub redact_paths: Option<crate::privacy::PathMode>,
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
}

/// spanprof's own CPU time (user + system, all its threads), by phase of the session.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overhead {
    /// Checking, loading and attaching the programs, starting the command.
    pub setup: Duration,
    /// The sampling loop: draining, aggregating, normalizing addresses, progress.
    pub sampling: Duration,
    /// The process's CPU time when sampling ended; later phases are measured from here.
    pub cpu_at_end_of_sampling: Duration,
    /// The programs' run time in the kernel while sampling; `None` when the kernel did not
    /// count it (see [`crate::bpf::KernelTime`]).
    pub kernel: Option<crate::bpf::KernelTime>,
    /// Records read from the programs while sampling: on-CPU samples, off-CPU intervals,
    /// allocations (the lost ones are in [`Meta::lost_samples`]).
    pub records: u64,
    /// The targets' CPU time while sampling, read from `/proc` ([`crate::target_cpu`]);
    /// `None` when no target could be read.
    pub targets: Option<crate::target_cpu::Measured>,
}

/// This process's CPU time so far (user + system).
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The signal that asked the session to stop, 0 while none did.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if STOP.swap(sig, Ordering::Relaxed) != 0 {
        // The second one: leave now, without the outputs and without their temporary files.
        crate::write::remove_temp_files();
        // SAFETY: signal and raise are async-signal-safe; the default action ends the process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Makes SIGINT and SIGTERM end the session (the outputs are still written). Installed once,
/// before anything is created that must be cleaned up; a second Ctrl-C ends spanprof at once
/// (removing its temporary files), so a user can always get out.
///
/// A signal spanprof was started with ignored (`nohup`, `&` in a script) stays ignored, for
/// spanprof and, through `exec`, for the command; caught ones are reset to the default by `exec`.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; `old` is a
        // valid out-parameter.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &act, &mut old);
            if old.sa_sigaction == libc::SIG_IGN {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
    }
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
    /// does. A SIGTERM to spanprof, before or during the wait, is passed on to the command, and
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
            let sig = STOP.load(Ordering::Relaxed);
            let pass = sig == libc::SIGTERM || (sig == libc::SIGINT && !in_terminal_foreground());
            if pass && !passed_on {
                cmd.signal(sig);
                passed_on = true;
            }
            std::thread::sleep(TICK);
        }
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

/// What the loop waits on: the ring buffer first, then one pidfd per watched process.
struct Waiter {
    pfds: Vec<libc::pollfd>,
    /// Watched pids, parallel to `pfds[1..]`; their fds are kept open here.
    watched: Vec<(u32, Option<OwnedFd>)>,
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

    /// Waits up to `timeout` for samples past the wake-up mark or for a watched process to exit.
    fn wait(&mut self, timeout: Duration) {
        // SAFETY: `pfds` is a valid array of pollfds of the given length.
        let r = unsafe {
            libc::poll(
                self.pfds.as_mut_ptr(),
                self.pfds.len() as libc::nfds_t,
                timeout.as_millis() as i32,
            )
        };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // NB: never spin: without poll (e.g. too many fds), the loop still ticks.
            std::thread::sleep(timeout);
        }
    }

    /// Pids that exited since the last call; each is reported once.
    fn exited(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, (pid, fd)) in self.watched.iter().enumerate() {
            let pfd = &mut self.pfds[i + 1];
            let gone = match fd {
                Some(_) if pfd.fd >= 0 => pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0,
                Some(_) => false,
                None => pfd.events != 0 && !preflight::is_running(*pid),
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
    preflight::check_capabilities()?;
    preflight::check_pid_namespace()?;
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
    let mut programs = Programs::load(&LoadOptions {
        frequency: opts.frequency,
        follow_children: opts.children || matches!(opts.target, Target::Command(_)),
        ring_buffer_size: opts.ring_buffer_size,
        btf_path: opts.btf_path.clone(),
        stack_copy_bytes: opts.stack_copy_bytes,
        cpu: opts.events.cpu,
        off_cpu: opts.events.off_cpu.then_some(OffCpuOptions {
            period_ns: 1_000_000_000 / opts.frequency.max(1),
            min_ns: opts.offcpu_min_ns,
            runnable: opts.events.wall,
        }),
        alloc: opts.events.in_bytes().then_some(AllocOptions {
            rate: opts.events.alloc_rate,
            heap: opts.events.heap,
        }),
    })?;
    // Allocation probes: for every process that maps the module (the kernel keeps the
    // targets' calls only). A probe for one process would fire for its main thread alone
    // (measured on 6.18: two worker threads' 64 MiB were not seen).
    let mut probes = Probes {
        enabled: opts.events.in_bytes(),
    };
    let mut child = None;
    let mut pids = Vec::new();
    let mut python = Python::new(true, opts.spans);
    match &opts.target {
        Target::Pids(p) => {
            for &pid in p {
                programs.add_target(pid)?;
                // Before sampling starts, so the first samples have their Python frames.
                python.detect_now(pid);
                python.flush(&mut programs);
                probes.libc_of(&mut programs, pid)?;
                probes.python(&mut programs, &mut python);
                // Threads asleep now: their time until they wake is counted from here.
                if opts.events.off_cpu {
                    programs.start_blocked_threads(pid);
                }
            }
            pids.clone_from(p);
        }
        Target::Command(argv) => {
            let mut c = GatedCommand::spawn(argv)?;
            programs.add_target(c.pid())?;
            // The command has not run its program yet: probe the C library spanprof itself
            // uses, the one of most programs on the host (others' are probed as they are found).
            probes.libc_of(&mut programs, std::process::id())?;
            if STOP.load(Ordering::Relaxed) != 0 {
                // Dropping the unreleased command makes it exit 127 without running.
                bail!("interrupted before the command started");
            }
            c.release()?;
            target_desc = argv
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            pids.push(c.pid());
            child = Some(c);
        }
    }

    if opts.progress {
        let until = match opts.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until it exits".to_string(),
        };
        let what = match (opts.events.in_bytes(), opts.events.alloc_rate) {
            (false, _) => format!("at {} Hz", opts.frequency),
            (true, 0 | 1) => "recording every allocation".to_string(),
            (true, rate) => format!("sampling allocations every {rate} bytes on average"),
        };
        if let Some(mode) = opts.redact_paths {
            target_desc = crate::privacy::redact_text(&target_desc, mode);
        }
        eprintln!("spanprof: profiling {target_desc} {what} {until}; Ctrl-C to stop early");
    }
    let cpu_at_sampling = process_cpu_time();
    let kernel_at_sampling = programs.kernel_time();
    let follow_children = opts.children || matches!(opts.target, Target::Command(_));
    let mut target_cpu = TargetCpu::new(follow_children);
    for &pid in &pids {
        target_cpu.add(pid);
    }
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let mut agg = Aggregator::new(opts.aggregate);
    let mut copy = StackCopySizes {
        default: opts.stack_copy_bytes,
        raised: Vec::new(),
    };
    let mut symbolizer = Symbolizer::new();
    let mut progress = Progress::new(
        opts.progress,
        opts.duration,
        matches!(opts.target, Target::Command(_)),
    );
    let mut exited: Vec<(u32, Duration)> = Vec::new();
    let mut waiter = Waiter::new(programs.samples.as_raw_fd(), &pids);
    let mut lost = 0;
    let mut last_check = start;
    let mut said_children = false;

    let ending = loop {
        let remaining = opts
            .duration
            .map(|d| d.saturating_sub(start.elapsed()))
            .unwrap_or(TICK);
        waiter.wait(remaining.min(TICK));
        drain(
            &mut programs,
            &mut agg,
            &mut python,
            &mut copy,
            &mut symbolizer,
        );
        probes.python(&mut programs, &mut python);
        agg.normalize_pending(&mut symbolizer);
        // One bpf() call a second is enough for the live count; the final one is exact.
        let once_a_second = last_check.elapsed() >= Duration::from_secs(1);
        if once_a_second {
            last_check = Instant::now();
            lost = programs.lost_samples();
            target_cpu.refresh(&programs.target_pids());
        }
        progress.update(start.elapsed(), agg.samples(), lost);

        if STOP.load(Ordering::Relaxed) != 0 {
            break Ending::Interrupted;
        }
        if opts.duration.is_some_and(|d| start.elapsed() >= d) {
            break Ending::Duration;
        }
        let gone = waiter.exited();
        if let Some(c) = child.as_mut() {
            // The pidfd says when; a check once a second covers a kernel without pidfds.
            if (!gone.is_empty() || once_a_second) && c.wait(false)?.is_some() {
                break Ending::CommandExited;
            }
        } else {
            for pid in gone {
                // Its last read: final while it is a zombie (see `target_cpu`).
                target_cpu.add(pid);
                exited.push((pid, start.elapsed()));
                programs.remove_target(pid);
            }
            // With --children, the session goes on while children of the targets run (the
            // kernel removes each process from the map when it exits).
            if exited.len() == pids.len() {
                if !(opts.children && programs.has_targets()) {
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
    let cpu_at_end = process_cpu_time();
    let kernel = programs
        .kernel_time()
        .zip(kernel_at_sampling)
        .map(|(end, start)| end.since(&start));
    let targets_cpu = target_cpu.take(&programs.target_pids());
    drain(
        &mut programs,
        &mut agg,
        &mut python,
        &mut copy,
        &mut symbolizer,
    );
    let records = agg.samples();
    progress.finish();
    let errors = programs.error_counts();
    let off_cpu_unseen = opts.events.off_cpu.then(|| OffCpuUnseen::of(&programs));
    if opts.events.heap {
        agg.set_live(programs.live_allocations());
        let unattributed = agg.unattributed_inuse();
        if unattributed > 0 {
            eprintln!(
                "spanprof: warning: {unattributed} sampled allocations still in use have no \
                 stack: sampled as the session ended (their records not read), or beyond the \
                 million sampled allocations whose stacks are kept (a larger --alloc-rate keeps \
                 fewer)"
            );
        }
    }
    // Stop sampling before the (slower) symbolization.
    drop(programs);

    let meta = Meta {
        target: target_desc,
        start: start_wall,
        duration,
        // A memory profile has no sampling frequency (and its files do not keep one).
        frequency: if opts.events.in_bytes() {
            0
        } else {
            opts.frequency
        },
        events: opts.events,
        lost_samples: errors[ErrorCode::RingbufFull as usize],
        python: Default::default(),
        host: Some(crate::resource::HostInfo::current()),
        build: crate::profile::Build::from_env(),
        dropped_labels: Vec::new(),
    };
    if opts.progress {
        eprintln!("spanprof: symbolizing {} samples", agg.samples());
    }
    let unwind = agg.unwind_stats();
    let profile = agg.into_profile(&mut symbolizer, &python, meta);
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
        overhead: Overhead {
            setup: cpu_at_sampling.saturating_sub(cpu_at_start),
            sampling: cpu_at_end.saturating_sub(cpu_at_sampling),
            cpu_at_end_of_sampling: cpu_at_end,
            kernel,
            records,
            targets: targets_cpu,
        },
    })
}

/// Off-CPU time of the targets' threads that the profile does not hold: intervals still open
/// when the session ended (a sample is made when the thread comes back), sampled intervals not
/// sent yet (the thread has not left its system call), and with `--event wall` the time threads
/// waited runnable for a CPU (neither on nor blocked off it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuUnseen {
    /// Threads blocked when the session ended.
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
    /// Reads the kernel's per-thread state of every target, at the end of a session.
    fn of(programs: &Programs) -> OffCpuUnseen {
        let now = crate::bpf::monotonic_ns();
        let mut unseen = OffCpuUnseen {
            runnable_ns: programs.error_counts()[ErrorCode::RunnableNs as usize],
            ..Default::default()
        };
        for pid in programs.target_pids() {
            for (_, state) in programs.offcpu_threads(pid) {
                match state {
                    ThreadState::Known(t) => {
                        if t.off_ts != 0 && t.off_ts <= now {
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

/// The allocation probes of a session (`--event alloc`, `heap`).
pub(crate) struct Probes {
    pub(crate) enabled: bool,
}

impl Probes {
    /// Probes the C library process `pid` has mapped (once per library file).
    pub(crate) fn libc_of(&mut self, programs: &mut Programs, pid: u32) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        // A process that exited meanwhile has nothing left to probe.
        let Ok(maps) = symbolizer::mapped::read_maps(pid) else {
            return Ok(());
        };
        if maps.is_empty() {
            return Ok(());
        }
        let Some(libc_map) = maps.iter().find(|m| {
            let file = m.file_path();
            let name = file.rsplit('/').next().unwrap_or(file);
            name.starts_with("libc.so") || name.starts_with("libc-2.")
        }) else {
            eprintln!(
                "spanprof: warning: pid {pid} has no C library mapped: its malloc calls are not \
                 seen (a static binary, or another allocator)"
            );
            return Ok(());
        };
        // The file the process maps (a container's own libc, or the one replaced on disk
        // since: `libc.so.6 (deleted)`), never another of its path.
        let (file, _) = match symbolizer::mapped::open_mapped(pid, libc_map) {
            Ok(opened) => opened,
            Err(e) if libc_map.path.ends_with("(deleted)") => anyhow::bail!(
                "pid {pid}'s C library was replaced on disk, and the file it maps is reached \
                 only through /proc/{pid}/map_files, which needs CAP_CHECKPOINT_RESTORE or \
                 CAP_SYS_ADMIN ({e}): its malloc calls are not seen"
            ),
            Err(e) => anyhow::bail!(
                "cannot open pid {pid}'s C library {} ({e}): its malloc calls are not seen",
                libc_map.path
            ),
        };
        use std::os::fd::AsRawFd;
        let module = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        programs.attach_allocator(&module, libc_map.file_path())?;
        Ok(())
    }

    /// Probes the C library of the CPython processes found since the last call, when it is
    /// another one than those probed already (a container's).
    pub(crate) fn python(&mut self, programs: &mut Programs, python: &mut Python) {
        for pid in python.take_new_processes() {
            if let Err(e) = self.libc_of(programs, pid) {
                eprintln!("spanprof: warning: pid {pid}: {e:#}");
            }
        }
    }
}

/// How often a long drain stops to look for new interpreters.
const DETECT_DURING_DRAIN: Duration = Duration::from_millis(10);

/// Drains the ring buffer into the aggregate, then looks for the interpreters of processes
/// that just appeared or exec'd.
pub(crate) fn drain(
    programs: &mut Programs,
    agg: &mut Aggregator,
    python: &mut Python,
    copy: &mut StackCopySizes,
    symbolizer: &mut Symbolizer,
) {
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
                symbolizer.seen(h.pid, ip);
                agg.record(&sample, python)
            }
            Some(Record::Exec(e)) => {
                python.exec(e.pid);
                agg.exec(e.pid, e.time_ns);
            }
            Some(Record::Exit(e)) => agg.exited(e.pid),
            None => {}
        }
        // A long drain (a backlog, cold module tables) still hands new interpreters to the
        // kernel every few ms: a short-lived child must be found while it runs.
        n = n.wrapping_add(1);
        if n.is_multiple_of(64) && looked.elapsed() >= DETECT_DURING_DRAIN {
            drop(item);
            python.detect_pending(programs);
            looked = Instant::now();
        }
    }
    python.detect_pending(programs);
    // A process whose stacks the copy cut short gets the largest copy from the next sample on
    // (its children too, in the kernel): deep C recursion, e.g. CPython 3.8-3.10's.
    for pid in agg.take_truncated_by_copy() {
        // Not for a process that exited meanwhile (the kernel dropped its entries already).
        if programs.is_target(pid) && programs.set_stack_copy(pid, MAX_STACK_COPY as u32).is_ok() {
            copy.raised.push(pid);
        }
    }
}

/// The stack copy sizes of a session: `--stack-copy`, and the processes given the largest.
#[derive(Debug, Clone, Default)]
pub struct StackCopySizes {
    /// Bytes copied per sample by default (0: frame pointers).
    pub default: u32,
    /// Processes raised to [`MAX_STACK_COPY`] because the default truncated their stacks.
    pub raised: Vec<u32>,
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
