//! What every part of the benchmark measures with: gated targets and their CPU time from
//! `wait4`, spanprof's BPF programs and their in-kernel counters, medians and the version
//! and machine lines of the headings.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::run::step;

/// Sampling rate of every profiler in the side-by-side runs.
pub(super) const HZ: u32 = 99;

/// Resource usage of one finished process (with its waited-for children).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Usage {
    /// User + system.
    pub(super) cpu: Duration,
    /// User alone: the work of a CPU-bound target that runs for a fixed time.
    user: Duration,
    pub(super) max_rss_kib: u64,
}

/// Waits for `child` and returns its exit status, own CPU time and peak RSS.
pub(super) fn wait_usage(child: &mut Child) -> Result<(i32, Usage)> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both pointers are valid.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if r < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok((
        status,
        Usage {
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
            user: tv(ru.ru_utime),
            max_rss_kib: ru.ru_maxrss as u64,
        },
    ))
}

/// A gated target: a program and its leading arguments; the amount of work is appended.
pub(super) struct Target {
    pub(super) program: PathBuf,
    pub(super) args: Vec<OsString>,
    /// Extra environment variables.
    pub(super) env: Vec<(OsString, OsString)>,
}

/// A started, gated target.
pub(super) struct Gated {
    pub(super) child: Child,
    pub(super) pid: u32,
}

/// The target's CPU time (user + system, and user alone) and its wall time from release to
/// exit.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TargetRun {
    pub(super) cpu: Duration,
    pub(super) user: Duration,
    pub(super) wall: Duration,
}

impl Target {
    pub(super) fn start(&self, amount: u64) -> Result<Gated> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(amount.to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", self.program.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .context("target did not print its pid")?;
        let pid = line.trim().parse().context("target printed no pid")?;
        Ok(Gated { child, pid })
    }
}

impl Gated {
    /// Lets the target start its work; returns when it did.
    pub(super) fn release(&mut self) -> Result<Instant> {
        let mut stdin = self.child.stdin.take().expect("piped");
        stdin
            .write_all(b"g")
            .context("failed to start the target")?;
        Ok(Instant::now())
    }

    pub(super) fn wait(&mut self, released: Instant) -> Result<TargetRun> {
        let (status, usage) = wait_usage(&mut self.child)?;
        let wall = released.elapsed();
        if status != 0 {
            bail!("the target failed (wait status {status})");
        }
        Ok(TargetRun {
            cpu: usage.cpu,
            user: usage.user,
            wall,
        })
    }
}

/// Reads `stream` until a line contains `ready`, returning the reader.
pub(crate) fn wait_ready<R: Read>(stream: R, ready: &str) -> Result<BufReader<R>> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("profiler exited before it was ready");
        }
        if line.contains(ready) {
            return Ok(reader);
        }
    }
}

/// spanprof's sampling program (`on_cpu_sample`, its one perf_event program), held open by an
/// fd of our own: the counters stay readable after spanprof detaches, which it does as soon as
/// its target exits.
pub(super) struct SamplingProg(OwnedFd);

impl SamplingProg {
    /// Finds the perf_event program among the fds of process `pid` and opens it by id.
    pub(super) fn of(pid: u32) -> Option<Self> {
        const BPF_PROG_TYPE_PERF_EVENT: &str = "7";
        const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
        let id: u32 = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .ok()?
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .find(|text| fdinfo_field(text, "prog_type") == Some(BPF_PROG_TYPE_PERF_EVENT))
            .and_then(|text| fdinfo_field(&text, "prog_id")?.parse().ok())?;
        // union bpf_attr for BPF_PROG_GET_FD_BY_ID: prog_id, next_id, open_flags.
        let attr: [u32; 3] = [id, 0, 0];
        // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives for the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_FD_BY_ID,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        // SAFETY: a non-negative return is a new fd that nothing else owns.
        (fd >= 0).then(|| Self(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// (run_time_ns, run_cnt): the counters `bpftool prog show` prints, from our fd's fdinfo.
    pub(super) fn stats(&self) -> Option<(u64, u64)> {
        let text =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.0.as_raw_fd())).ok()?;
        Some((
            fdinfo_field(&text, "run_time_ns")?.parse().ok()?,
            fdinfo_field(&text, "run_cnt")?.parse().ok()?,
        ))
    }
}

impl SamplingProg {
    /// The instructions the kernel's verifier checked when the program was loaded
    /// (`verified_insns`, Linux 5.16+).
    pub(super) fn verified_insns(&self) -> Option<u64> {
        let text =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.0.as_raw_fd())).ok()?;
        fdinfo_field(&text, "verified_insns")?.trim().parse().ok()
    }
}

/// The value of `name:` in an fdinfo text.
fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// In-kernel counters of one spanprof run, as deltas over two intervals.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BpfWindow {
    /// 1 s with spanprof attached and the target blocked: every run is for another process.
    pub(super) idle_ns: u64,
    pub(super) idle_runs: u64,
    /// From the target's release to its exit.
    pub(super) ns: u64,
    pub(super) runs: u64,
    /// Target samples in that window: the samples spanprof reports plus the lost ones (the
    /// target runs only inside the window).
    pub(super) target_samples: u64,
}

/// In-kernel figures pooled over several runs (sums of the counters, then one division).
pub(super) struct BpfFigures {
    /// Per run of the program, every run in the windows (any process, any CPU).
    pub(super) per_run_ns: f64,
    /// Per run for other processes (the idle intervals).
    pub(super) other_run_ns: f64,
    /// Window time / target samples: every run charged to the target.
    pub(super) gross_ns: f64,
    /// Window time less the other runs (priced at `other_run_ns`) / target samples.
    pub(super) net_ns: f64,
    pub(super) target_samples: u64,
    pub(super) runs: u64,
}

pub(super) fn bpf_figures(windows: &[BpfWindow]) -> Option<BpfFigures> {
    let sum = |f: fn(&BpfWindow) -> u64| windows.iter().map(f).sum::<u64>() as f64;
    let (ns, runs, n) = (sum(|w| w.ns), sum(|w| w.runs), sum(|w| w.target_samples));
    let (idle_ns, idle_runs) = (sum(|w| w.idle_ns), sum(|w| w.idle_runs));
    if n == 0.0 || runs == 0.0 || idle_runs == 0.0 {
        return None;
    }
    let other_run_ns = idle_ns / idle_runs;
    Some(BpfFigures {
        per_run_ns: ns / runs,
        other_run_ns,
        gross_ns: ns / n,
        net_ns: (ns - (runs - n).max(0.0) * other_run_ns) / n,
        target_samples: n as u64,
        runs: runs as u64,
    })
}

/// The (stack, count) lines of a folded file.
pub(super) fn folded_stacks(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|l| {
        let (stack, n) = l.rsplit_once(' ')?;
        Some((stack, n.parse().ok()?))
    })
}

pub(super) fn run_alone(target: &Target, amount: u64) -> Result<TargetRun> {
    let mut t = target.start(amount)?;
    let released = t.release()?;
    t.wait(released)
}

/// The lowest and highest of `values` (infinities when there are none).
pub(crate) fn lowest_highest(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub(super) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub(super) fn per_sample_us(own: Duration, n: u64) -> f64 {
    secs(own) * 1e6 / n.max(1) as f64
}

pub(crate) fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// "Linux …, N CPUs" for the headings.
pub(crate) fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} CPUs, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

/// Runs `f(i)` for each round with the round's progress line.
pub(crate) fn rounds<T>(
    name: &str,
    n: usize,
    mut f: impl FnMut(usize) -> Result<T>,
) -> Result<Vec<T>> {
    (0..n)
        .map(|i| {
            step(&format!("bench {name}: round {}/{n}", i + 1));
            f(i)
        })
        .collect()
}

/// The first line `program args…` prints, e.g. "3.12.1" or "py-spy 0.4.3".
pub(crate) fn version(program: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("failed to run {}", program.display()))?;
    if !out.status.success() {
        bail!("{} {} failed", program.display(), args.join(" "));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

pub(super) fn percent(part: u64, all: u64) -> f64 {
    100.0 * part as f64 / all.max(1) as f64
}

/// A BPF program of a spanprof process, opened by id from the fds it holds (as
/// [`SamplingProg`]), so its counters stay readable once spanprof detached.
pub(crate) struct NamedProg {
    pub(crate) name: String,
    fd: OwnedFd,
}

impl NamedProg {
    /// Every BPF program among the fds of process `pid`, by name, each once.
    pub(crate) fn all_of(pid: u32) -> Vec<Self> {
        const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
        const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
        let mut ids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .map(|dir| {
                dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .filter(|text| fdinfo_field(text, "prog_type").is_some())
                    .filter_map(|text| fdinfo_field(&text, "prog_id")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        let mut progs: Vec<Self> = Vec::new();
        for id in ids {
            // union bpf_attr for BPF_PROG_GET_FD_BY_ID: prog_id, next_id, open_flags.
            let attr: [u32; 3] = [id, 0, 0];
            // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives for the call.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_PROG_GET_FD_BY_ID,
                    attr.as_ptr(),
                    std::mem::size_of_val(&attr),
                )
            };
            if fd < 0 {
                continue;
            }
            // SAFETY: a non-negative return is a new fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // struct bpf_prog_info up to its `name` (char[16] at byte 64): the kernel fills
            // `info_len` bytes of it.
            let mut info = [0u8; 80];
            // union bpf_attr for BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info (a pointer).
            #[repr(C)]
            struct InfoAttr {
                bpf_fd: u32,
                info_len: u32,
                info: u64,
            }
            let attr = InfoAttr {
                bpf_fd: fd.as_raw_fd() as u32,
                info_len: info.len() as u32,
                info: info.as_mut_ptr() as u64,
            };
            // SAFETY: bpf(2) reads `attr` and writes at most `info_len` bytes to `info`; both
            // live for the call.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_OBJ_GET_INFO_BY_FD,
                    &attr as *const InfoAttr,
                    std::mem::size_of::<InfoAttr>(),
                )
            };
            if r != 0 {
                continue;
            }
            let name = &info[64..80];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let name = String::from_utf8_lossy(&name[..len]).into_owned();
            if !progs.iter().any(|p| p.name == name) {
                progs.push(Self { name, fd });
            }
        }
        progs
    }

    /// (run_time_ns, run_cnt), as [`SamplingProg::stats`].
    pub(crate) fn stats(&self) -> Option<(u64, u64)> {
        let text =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.fd.as_raw_fd())).ok()?;
        Some((
            fdinfo_field(&text, "run_time_ns")?.parse().ok()?,
            fdinfo_field(&text, "run_cnt")?.parse().ok()?,
        ))
    }
}

/// One program's counters over the two intervals of a spanprof run (see [`BpfWindow`]): 1 s
/// with the target blocked on its gate, then from the release to the target's exit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProgWindow {
    pub(crate) idle_ns: u64,
    pub(crate) idle_runs: u64,
    pub(crate) ns: u64,
    pub(crate) runs: u64,
}

impl ProgWindow {
    /// From a program's (run_time_ns, run_cnt) at the start of the idle interval, at the
    /// release, and at the end.
    pub(crate) fn between(start: (u64, u64), release: (u64, u64), end: (u64, u64)) -> Self {
        ProgWindow {
            idle_ns: release.0 - start.0,
            idle_runs: release.1 - start.1,
            ns: end.0 - release.0,
            runs: end.1 - release.1,
        }
    }
}
