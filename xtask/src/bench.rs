//! `cargo xtask bench`: spanprof's overhead, side by side with `perf record -g`, in one run.
//!
//! Method (also in BENCHMARKS.md):
//! - The target is `fixed_work`, a fixed number of rounds of frame-pointer code, started
//!   gated: it prints its pid and waits for a byte on stdin, so the profiler attaches first.
//! - Three configurations run interleaved, `--rounds` times each: the target alone, under
//!   `spanprof profile --pid` and under `perf record -g --pid`, both at 99 Hz. The target's own
//!   CPU time (user + system, from `wait4`) is measured in each; the slowdown is the median of
//!   the per-round ratios (profiled / alone), because these VMs vary ±25% run to run.
//! - The profiler's own CPU time and peak RSS come from `wait4` on the profiler process; divided
//!   by the samples it reports, that is the user-space cost per sample. spanprof's figure
//!   includes symbolization and writing a pprof file; perf's includes only `perf record`.
//! - In-kernel cost: with `kernel.bpf_stats_enabled=1`, `bpftool prog show` gives run_time_ns
//!   and run_cnt of the sampling program, read while it is attached.
//!
//! The results are printed and written between the markers of BENCHMARKS.md.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::run::step;

/// Resource usage of one finished process.
#[derive(Debug, Clone, Copy)]
struct Usage {
    cpu: Duration,
    max_rss_kib: u64,
}

/// Waits for `child` and returns its own CPU time and peak RSS.
fn wait_usage(child: &mut Child) -> Result<(i32, Usage)> {
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
            max_rss_kib: ru.ru_maxrss as u64,
        },
    ))
}

/// Starts the gated target; returns it and its pid.
fn start_target(workload: &Path, rounds: u64) -> Result<(Child, u32)> {
    let mut child = Command::new(workload)
        .arg(rounds.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", workload.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped"))
        .read_line(&mut line)
        .context("target did not print its pid")?;
    let pid = line.trim().parse().context("target printed no pid")?;
    Ok((child, pid))
}

fn release(target: &mut Child) -> Result<()> {
    let mut stdin = target.stdin.take().expect("piped");
    stdin
        .write_all(b"g")
        .context("failed to start the target")?;
    Ok(())
}

/// Reads stderr of a profiler until a line contains `ready`, returning the reader.
fn wait_ready(child: &mut Child, ready: &str) -> Result<BufReader<std::process::ChildStderr>> {
    let mut reader = BufReader::new(child.stderr.take().expect("piped"));
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

/// In-kernel statistics of the sampling program: (run_time_ns, run_cnt).
fn bpf_prog_stats() -> Option<(u64, u64)> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show", "name", "on_cpu_sample"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let i = text.find(&format!("\"{name}\":"))? + name.len() + 3;
        let digits: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    };
    Some((field("run_time_ns")?, field("run_cnt")?))
}

#[derive(Debug, Default)]
struct Round {
    alone: Duration,
    spanprof_target: Duration,
    spanprof_own: Duration,
    spanprof_rss_kib: u64,
    spanprof_samples: u64,
    /// spanprof's own figure: CPU per sample in its sampling loop (no setup, no symbolization).
    spanprof_loop_us: f64,
    perf_target: Duration,
    perf_own: Duration,
    perf_rss_kib: u64,
    perf_samples: u64,
    bpf_ns: u64,
    bpf_runs: u64,
}

fn run_alone(workload: &Path, rounds: u64) -> Result<Duration> {
    let (mut t, _) = start_target(workload, rounds)?;
    release(&mut t)?;
    Ok(wait_usage(&mut t)?.1.cpu)
}

fn run_spanprof(
    spanprof: &Path,
    workload: &Path,
    rounds: u64,
    out: &Path,
    r: &mut Round,
) -> Result<()> {
    let (mut t, pid) = start_target(workload, rounds)?;
    let mut prof = Command::new(spanprof)
        .args([
            "profile",
            "--frequency",
            "99",
            "--pid",
            &pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start spanprof")?;
    let mut err = wait_ready(&mut prof, "spanprof: profiling")?;
    release(&mut t)?;
    // Read the in-kernel statistics while the program is attached, until the target is done.
    let done = Arc::new(AtomicBool::new(false));
    let poll = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut last = None;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                if let Some(s) = bpf_prog_stats() {
                    last = Some(s);
                }
            }
            last
        })
    };
    let target = wait_usage(&mut t);
    done.store(true, Ordering::Relaxed);
    r.spanprof_target = target?.1.cpu;
    let mut rest = String::new();
    err.read_to_string(&mut rest)?;
    let (status, own) = wait_usage(&mut prof)?;
    if status != 0 {
        bail!("spanprof failed (status {status}):\n{rest}");
    }
    r.spanprof_own = own.cpu;
    r.spanprof_rss_kib = own.max_rss_kib;
    r.spanprof_samples = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("spanprof: ")?
                .split(" samples")
                .next()?
                .parse()
                .ok()
        })
        .context("spanprof printed no sample count")?;
    // "spanprof own CPU: 48.5 ms setup, 16.6 µs per sample while sampling (8.1 ms), …"
    r.spanprof_loop_us = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("spanprof own CPU: ")?
                .split(" setup, ")
                .nth(1)?
                .split(" µs per sample")
                .next()?
                .parse()
                .ok()
        })
        .context("spanprof printed no own-CPU line")?;
    if let Some((ns, runs)) = poll.join().ok().flatten() {
        r.bpf_ns = ns;
        r.bpf_runs = runs;
    }
    Ok(())
}

fn run_perf(workload: &Path, rounds: u64, out: &Path, r: &mut Round) -> Result<()> {
    let (mut t, pid) = start_target(workload, rounds)?;
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-g",
            "-F",
            "99",
            "-e",
            "cpu-clock",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    // perf prints nothing when it is attached; give it time, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    release(&mut t)?;
    r.perf_target = wait_usage(&mut t)?.1.cpu;
    let mut text = String::new();
    perf.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (_, own) = wait_usage(&mut perf)?;
    r.perf_own = own.cpu;
    r.perf_rss_kib = own.max_rss_kib;
    // "[ perf record: Captured and wrote 0.052 MB perf.data (198 samples) ]"
    r.perf_samples = text
        .rsplit_once(" samples)")
        .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
        .with_context(|| format!("perf printed no sample count:\n{text}"))?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the benchmark and updates BENCHMARKS.md.
pub fn run(root: &Path, spanprof: &Path, workloads: &Path, rounds: usize, work: u64) -> Result<()> {
    let workload = workloads.join("fixed_work");
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
        .context("failed to enable kernel.bpf_stats_enabled (needs root)")?;
    // Turned off again however the run ends: the setting is system-wide and costs every program.
    struct StatsOff;
    impl Drop for StatsOff {
        fn drop(&mut self) {
            let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
        }
    }
    let stats_off = StatsOff;
    let mut results = Vec::new();
    for i in 0..rounds {
        step(&format!("bench round {}/{rounds}", i + 1));
        let mut r = Round::default();
        // Alternate the order so drift in the machine's speed does not favour one configuration.
        if i % 2 == 0 {
            r.alone = run_alone(&workload, work)?;
            run_spanprof(
                spanprof,
                &workload,
                work,
                &out_dir.join("bench.pb.gz"),
                &mut r,
            )?;
            run_perf(&workload, work, &out_dir.join("perf.data"), &mut r)?;
        } else {
            run_perf(&workload, work, &out_dir.join("perf.data"), &mut r)?;
            run_spanprof(
                spanprof,
                &workload,
                work,
                &out_dir.join("bench.pb.gz"),
                &mut r,
            )?;
            r.alone = run_alone(&workload, work)?;
        }
        results.push(r);
    }
    drop(stats_off);

    let secs = |d: Duration| d.as_secs_f64();
    // The median over rounds of one figure of each round.
    let med = |f: &dyn Fn(&Round) -> f64| median(results.iter().map(f).collect());
    let per_sample = |own: Duration, n: u64| secs(own) * 1e6 / n.max(1) as f64;
    let sp_ratio = med(&|r| secs(r.spanprof_target) / secs(r.alone));
    let perf_ratio = med(&|r| secs(r.perf_target) / secs(r.alone));
    let sp_us = med(&|r| per_sample(r.spanprof_own, r.spanprof_samples));
    let sp_loop_us = med(&|r| r.spanprof_loop_us);
    let perf_us = med(&|r| per_sample(r.perf_own, r.perf_samples));
    let sp_rss = results
        .iter()
        .map(|r| r.spanprof_rss_kib)
        .max()
        .unwrap_or(0);
    let perf_rss = results.iter().map(|r| r.perf_rss_kib).max().unwrap_or(0);
    let bpf_run_ns = median(
        results
            .iter()
            .filter(|r| r.bpf_runs > 0)
            .map(|r| r.bpf_ns as f64 / r.bpf_runs as f64)
            .collect(),
    );
    let alone = med(&|r| secs(r.alone));
    let samples = med(&|r| r.spanprof_samples as f64);

    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let table = format!(
        "Run of `cargo xtask bench --rounds {rounds} --work {work}` on {} CPUs, Linux {}: \
         target `fixed_work` alone {alone:.2} s CPU (median), {samples:.0} samples per spanprof run.\n\n\
         | figure | spanprof | perf record -g | goal |\n\
         |---|---|---|---|\n\
         | target CPU time, profiled / alone (median of {rounds} interleaved rounds) | {sp_ratio:.4} | {perf_ratio:.4} | ≤ 1.005 |\n\
         | profiler's own CPU per sample, whole process (median) | {sp_us:.1} µs | {perf_us:.1} µs | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median) | {sp_loop_us:.1} µs | n/a | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | ≤ 64 MB |\n\
         | in-kernel time per sampling-program run (BPF stats, median) | {:.2} µs | n/a | |\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        kernel.trim(),
        sp_rss as f64 / 1024.0,
        perf_rss as f64 / 1024.0,
        bpf_run_ns / 1000.0,
    );
    println!("{table}");
    let md_path = root.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    let (begin, end) = ("<!-- bench:begin -->", "<!-- bench:end -->");
    match (md.find(begin), md.find(end)) {
        (Some(b), Some(e)) if b < e => {
            let new = format!("{}{begin}\n{table}{}", &md[..b], &md[e..]);
            std::fs::write(&md_path, new)?;
            step(&format!("updated {}", md_path.display()));
        }
        _ => step("BENCHMARKS.md has no bench markers; figures printed only"),
    }
    Ok(())
}
