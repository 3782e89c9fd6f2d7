//! A time-limited profiling session: load, sample, drain, stop, build the profile.
//!
//! The loop waits on the ring buffer's file descriptor (at most [`TICK`]), drains every record
//! into the [`Aggregator`], normalizes addresses of new stacks while their processes live, and
//! checks the stop conditions: duration over, Ctrl-C/SIGTERM, the command exited, or every
//! target process exited.

use std::ffi::{CString, OsString};
use std::io::IsTerminal;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use profiler_common::{ErrorCode, SampleRecord, ERROR_COUNT};
use symbolizer::Symbolizer;

use crate::aggregate::Aggregator;
use crate::bpf::{LoadOptions, Programs};
use crate::preflight;
use crate::profile::{Meta, Profile};

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
    /// Keep kernel frames. Default true.
    pub kernel: bool,
    /// Profile children of `--pid` targets too (always on for a command).
    pub children: bool,
    /// Ring buffer size in bytes. Default 4 MiB.
    pub ring_buffer_size: u32,
    /// Kernel BTF file. Default `/sys/kernel/btf/vmlinux`, or `$SPANPROF_BTF_PATH`.
    pub btf_path: PathBuf,
    /// Show a progress bar (stderr is a terminal) or plain progress lines.
    pub progress: bool,
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
    /// The command's exit status, in command mode.
    pub exit_status: Option<ExitStatus>,
    /// Kernel-side error counters, by [`ErrorCode`].
    pub errors: [u64; ERROR_COUNT as usize],
    /// Symbolizer counters.
    pub symbolizer: symbolizer::Stats,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM end the session (outputs are still written).
fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// A command started by [`spawn_gated`], held before `exec` until [`Gated::release`].
#[derive(Debug)]
struct Gated {
    pid: u32,
    gate: Option<OwnedFd>,
    exec_errors: OwnedFd,
    status: Option<ExitStatus>,
}

/// Forks the command and holds the child before `exec`, so its pid can enter the target map
/// before it runs a single instruction of the command.
///
/// `std::process::Command` cannot do this: `spawn` returns only after the child has exec'd.
fn spawn_gated(argv: &[OsString]) -> Result<Gated> {
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .context("the command has a NUL byte in an argument")?;
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let (gate_r, gate_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // SAFETY: between fork and exec/_exit the child calls only async-signal-safe functions
    // (close, read, execvp, write, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("failed to fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; the child never returns from this block.
        unsafe {
            libc::close(gate_w.as_raw_fd());
            libc::close(err_r.as_raw_fd());
            let mut b = 0u8;
            // Blocks until spanprof added this pid to the targets (or died: EOF, run anyway).
            while libc::read(gate_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    drop(gate_r);
    drop(err_w);
    Ok(Gated {
        pid: pid as u32,
        gate: Some(gate_w),
        exec_errors: err_r,
        status: None,
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!(
            "failed to create a pipe: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Gated {
    /// Lets the child exec; fails with the reason when the command cannot be run.
    fn release(&mut self, argv0: &OsString) -> Result<()> {
        let gate = self.gate.take().expect("released once");
        // NB: if this write fails the child sees EOF and runs anyway.
        // SAFETY: writes one byte from a valid buffer to an fd we own.
        unsafe { libc::write(gate.as_raw_fd(), b"g".as_ptr().cast(), 1) };
        drop(gate);
        let mut errno = [0u8; 4];
        let n = loop {
            // SAFETY: reads at most 4 bytes into a 4-byte buffer.
            let n =
                unsafe { libc::read(self.exec_errors.as_raw_fd(), errno.as_mut_ptr().cast(), 4) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break n;
            }
        };
        if n == 4 {
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            let _ = self.wait(true);
            bail!("cannot run {}: {err}", argv0.to_string_lossy());
        }
        // EOF: exec succeeded and closed the CLOEXEC pipe.
        Ok(())
    }

    /// Reaps the child; `None` while it runs (when `block` is false).
    fn wait(&mut self, block: bool) -> Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let mut status = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, flags) };
            if r == 0 {
                return Ok(None);
            }
            if r > 0 {
                self.status = Some(ExitStatus::from_raw(status));
                return Ok(self.status);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("failed to wait for the command");
            }
        }
    }
}

fn wait_readable(fd: i32, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
}

/// Progress display: a bar on a terminal, a plain line every few seconds otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    last_line: Instant,
    duration: Option<Duration>,
}

impl Progress {
    fn new(enabled: bool, duration: Option<Duration>) -> Self {
        let tty = std::io::stderr().is_terminal();
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
    let mut programs = Programs::load(&LoadOptions {
        frequency: opts.frequency,
        follow_children: opts.children || matches!(opts.target, Target::Command(_)),
        ring_buffer_size: opts.ring_buffer_size,
        btf_path: opts.btf_path.clone(),
    })?;
    install_signal_handlers();

    let mut child = None;
    let mut pids = Vec::new();
    match &opts.target {
        Target::Pids(p) => {
            for &pid in p {
                programs.add_target(pid)?;
            }
            pids.clone_from(p);
        }
        Target::Command(argv) => {
            let mut c = spawn_gated(argv)?;
            programs.add_target(c.pid)?;
            c.release(&argv[0])?;
            target_desc = argv
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            pids.push(c.pid);
            child = Some(c);
        }
    }

    if opts.progress {
        let until = match opts.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until it exits".to_string(),
        };
        eprintln!(
            "spanprof: profiling {target_desc} at {} Hz {until}; Ctrl-C to stop early",
            opts.frequency
        );
    }
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let mut agg = Aggregator::new(opts.kernel);
    let mut symbolizer = Symbolizer::new();
    let mut progress = Progress::new(opts.progress, opts.duration);
    let mut exited: Vec<(u32, Duration)> = Vec::new();
    let mut exit_status = None;
    let fd = programs.samples.as_raw_fd();

    let ending = loop {
        let remaining = opts
            .duration
            .map(|d| d.saturating_sub(start.elapsed()))
            .unwrap_or(TICK);
        wait_readable(fd, remaining.min(TICK));
        drain(&mut programs, &mut agg);
        agg.normalize_pending(&mut symbolizer);
        let errors = programs.error_counts();
        progress.update(
            start.elapsed(),
            agg.samples(),
            errors[ErrorCode::RingbufFull as usize],
        );

        if STOP.load(Ordering::Relaxed) {
            break Ending::Interrupted;
        }
        if opts.duration.is_some_and(|d| start.elapsed() >= d) {
            break Ending::Duration;
        }
        if let Some(c) = child.as_mut() {
            if let Some(status) = c.wait(false)? {
                exit_status = Some(status);
                break Ending::CommandExited;
            }
        } else {
            for &pid in &pids {
                if !preflight::is_running(pid) && !exited.iter().any(|&(p, _)| p == pid) {
                    exited.push((pid, start.elapsed()));
                    programs.remove_target(pid);
                }
            }
            if exited.len() == pids.len() {
                break Ending::TargetsExited(exited.iter().map(|&(p, _)| p).collect());
            }
        }
    };
    let duration = start.elapsed();
    drain(&mut programs, &mut agg);
    progress.finish();
    let errors = programs.error_counts();
    // Stop sampling before the (slower) symbolization.
    drop(programs);

    if let (Some(c), None) = (child.as_mut(), exit_status) {
        // Interrupted or out of time: the command got the same Ctrl-C from the terminal, or
        // keeps running past the duration; wait for it either way, as `time` does.
        exit_status = c.wait(true)?;
    }

    let meta = Meta {
        target: target_desc,
        start: start_wall,
        duration,
        frequency: opts.frequency,
        lost_samples: errors[ErrorCode::RingbufFull as usize],
    };
    let profile = agg.into_profile(&mut symbolizer, meta);
    Ok(Outcome {
        profile,
        ending,
        exited,
        exit_status,
        errors,
        symbolizer: symbolizer.stats(),
    })
}

fn drain(programs: &mut Programs, agg: &mut Aggregator) {
    while let Some(item) = programs.samples.next() {
        if let Some(rec) = SampleRecord::from_bytes(&item) {
            agg.record(rec);
        }
    }
}

/// Exit code a shell would report for a command's status (128+signal when killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
