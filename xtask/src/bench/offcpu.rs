//! The off-CPU part (`bench-offcpu` block): what `--event offcpu` costs a context-switch-heavy
//! target, against `perf record -e sched:sched_switch -g`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::json::Json;
use super::measure::{
    folded_stacks, machine, mb, median, percent, rounds, secs, version, wait_ready, wait_usage,
    Gated, NamedProg, ProgWindow, Target, TargetRun, Usage, HZ,
};
use super::Config;

/// The off-CPU part's target (built by `cargo xtask workloads` from
/// `xtask/workloads/offcpu_pingpong.c`) and its round trips per run.
const OFFCPU_TARGET: &str = "offcpu_pingpong";
const OFFCPU_ROUND_TRIPS: u64 = 200_000;
/// spanprof's off-CPU programs: `tp_btf/sched_switch` (every context switch on the machine) and
/// `tp_btf/sys_exit` (every system call exit; sends the off-CPU samples).
const ON_SWITCH: &str = "on_switch";
const ON_SYS_EXIT: &str = "on_sys_exit";
/// perf's tracepoint for the side-by-side: one record with a frame-pointer call graph per
/// switch out of a target thread.
const PERF_SWITCH_EVENT: &str = "sched:sched_switch";

/// What `offcpu_pingpong` says of its loop.
#[derive(Debug, Clone, Copy, Default)]
struct PingPong {
    round_trips: u64,
    /// The loop's wall time (CLOCK_MONOTONIC around it).
    seconds: f64,
    /// Context switches of the process (every thread) during the loop, from getrusage.
    voluntary: u64,
    involuntary: u64,
}

impl PingPong {
    fn switches_per_second(&self) -> f64 {
        (self.voluntary + self.involuntary) as f64 / self.seconds
    }
}

/// Parses the target's JSON line.
fn parse_pingpong(text: &str) -> Result<PingPong> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{OFFCPU_TARGET} printed no JSON line: {text:?}"))?;
    let json = Json::parse(line)?;
    let int = |key: &str| {
        json.get(key)
            .and_then(Json::as_u64)
            .with_context(|| format!("no integer {key} in {line}"))
    };
    let seconds = match json.get("seconds") {
        Some(Json::Num(s)) if *s > 0.0 => *s,
        _ => bail!("no positive seconds in {line}"),
    };
    Ok(PingPong {
        round_trips: int("round_trips")?,
        seconds,
        voluntary: int("voluntary_switches")?,
        involuntary: int("involuntary_switches")?,
    })
}

impl Gated {
    /// Like [`Gated::wait`], then the target's JSON line (what it printed after its pid),
    /// which must say it made the [`OFFCPU_ROUND_TRIPS`] it was asked for.
    fn wait_pingpong(&mut self, released: Instant) -> Result<(TargetRun, PingPong)> {
        let run = self.wait(released)?;
        let mut text = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            stdout.read_to_string(&mut text)?;
        }
        let pingpong = parse_pingpong(&text)?;
        if pingpong.round_trips != OFFCPU_ROUND_TRIPS {
            bail!(
                "{OFFCPU_TARGET} made {} round trips, not {OFFCPU_ROUND_TRIPS}",
                pingpong.round_trips
            );
        }
        Ok((run, pingpong))
    }
}

/// The off-CPU stacks of a folded output weighed in nanoseconds, by root frame
/// (`[off-cpu: io]`, …; other roots are on-CPU stacks, under `on-CPU`).
fn offcpu_by_reason(path: &Path) -> Result<BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in folded_stacks(&text) {
        let root = stack.split(';').next().unwrap_or("");
        let key = root
            .strip_prefix("[off-cpu: ")
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or("on-CPU");
        *by_reason.entry(key.to_string()).or_default() += n;
    }
    Ok(by_reason)
}

/// One run of the ping-pong target alone or under a profiler.
#[derive(Debug, Default)]
struct OffcpuRun {
    target: TargetRun,
    pingpong: PingPong,
    /// The profiler's own resource usage.
    own: Usage,
}

/// One run under `spanprof profile --event offcpu`.
#[derive(Debug, Default)]
struct OffcpuSpanprofRun {
    run: OffcpuRun,
    /// Every program spanprof held, by name.
    progs: BTreeMap<String, ProgWindow>,
    /// What the summary's first line says was recorded (`500.5 ms off-CPU`), and lost samples.
    recorded: String,
    lost: u64,
    /// The off-CPU lines of the summary, as printed.
    summary: Vec<String>,
    /// Nanoseconds by reason (and `on-CPU`), from the folded output.
    by_reason: BTreeMap<String, u64>,
}

/// One run under `perf record -e sched:sched_switch -g`.
#[derive(Debug, Default)]
struct OffcpuPerfRun {
    run: OffcpuRun,
    samples: u64,
    data_bytes: u64,
}

#[derive(Debug, Default)]
struct OffcpuRound {
    alone: OffcpuRun,
    spanprof: OffcpuSpanprofRun,
    perf: OffcpuPerfRun,
}

fn run_pingpong_alone(target: &Target) -> Result<OffcpuRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let released = t.release()?;
    let (target, pingpong) = t.wait_pingpong(released)?;
    Ok(OffcpuRun {
        target,
        pingpong,
        own: Usage::default(),
    })
}

/// `spanprof profile --event offcpu --pid PID -o OUT` (folded) on the gated target, with the
/// counters of each of its programs read as in [`run_spanprof`](super::profilers::run_spanprof).
fn run_spanprof_offcpu(spanprof: &Path, target: &Target, out: &Path) -> Result<OffcpuSpanprofRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let mut prof = Command::new(spanprof)
        .args([
            "profile",
            "--event",
            "offcpu",
            "--frequency",
            &HZ.to_string(),
            "--pid",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start spanprof")?;
    let mut err = wait_ready(prof.stderr.take().expect("piped"), "spanprof: profiling")?;
    let progs = NamedProg::all_of(prof.id());
    let stats = || -> Vec<Option<(u64, u64)>> { progs.iter().map(NamedProg::stats).collect() };
    let idle_start = stats();
    std::thread::sleep(Duration::from_secs(1));
    let window_start = stats();
    let released = t.release()?;
    let target_run = t.wait_pingpong(released);
    let window_end = stats();
    let mut rest = String::new();
    err.read_to_string(&mut rest)?;
    let (status, own) = wait_usage(&mut prof)?;
    let (target_run, pingpong) = target_run?;
    if status != 0 {
        bail!("spanprof failed (status {status}):\n{rest}");
    }
    let names: Vec<&str> = progs.iter().map(|p| p.name.as_str()).collect();
    if !names.contains(&ON_SWITCH) || !names.contains(&ON_SYS_EXIT) {
        bail!(
            "spanprof --event offcpu holds no {ON_SWITCH} and {ON_SYS_EXIT} programs (it holds \
             {names:?})"
        );
    }
    let mut windows = BTreeMap::new();
    for (i, prog) in progs.iter().enumerate() {
        if let (Some(a), Some(b), Some(c)) = (idle_start[i], window_start[i], window_end[i]) {
            windows.insert(prog.name.clone(), ProgWindow::between(a, b, c));
        }
    }
    // "spanprof: 500.5 ms off-CPU, 0 lost, from 1 process in …": what was recorded, then the
    // lost samples.
    let (recorded, lost) = rest
        .lines()
        .find_map(|l| {
            let (head, _) = l.strip_prefix("spanprof: ")?.split_once(" lost, from ")?;
            let (recorded, lost) = head.rsplit_once(", ")?;
            Some((recorded.to_string(), lost.parse::<u64>().ok()?))
        })
        .with_context(|| format!("spanprof printed no summary line with a lost count:\n{rest}"))?;
    let summary = rest
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("off-cpu"))
        .map(str::to_string)
        .collect();
    Ok(OffcpuSpanprofRun {
        run: OffcpuRun {
            target: target_run,
            pingpong,
            own,
        },
        progs: windows,
        recorded,
        lost,
        summary,
        by_reason: offcpu_by_reason(out)?,
    })
}

/// `perf record -e sched:sched_switch -g -p PID -o OUT` on the gated target.
fn run_perf_switch(target: &Target, out: &Path) -> Result<OffcpuPerfRun> {
    let mut t = target.start(OFFCPU_ROUND_TRIPS)?;
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-e",
            PERF_SWITCH_EVENT,
            "-g",
            "-p",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    // perf prints nothing when it is attached; give it time, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    let released = t.release()?;
    let (target_run, pingpong) = t.wait_pingpong(released)?;
    let mut text = String::new();
    perf.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (_, own) = wait_usage(&mut perf)?;
    let samples = text
        .rsplit_once(" samples)")
        .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
        .with_context(|| format!("perf printed no sample count:\n{text}"))?;
    let data_bytes = std::fs::metadata(out)
        .with_context(|| format!("perf wrote no {}", out.display()))?
        .len();
    Ok(OffcpuPerfRun {
        run: OffcpuRun {
            target: target_run,
            pingpong,
            own,
        },
        samples,
        data_bytes,
    })
}

/// offcpu_pingpong alone, under `spanprof --event offcpu` and under `perf record -e
/// sched:sched_switch -g`, interleaved; the markdown of their figures.
pub(super) fn offcpu(
    spanprof: &Path,
    workloads: &Path,
    out_dir: &Path,
    cfg: &Config,
) -> Result<String> {
    let program = workloads.join(OFFCPU_TARGET);
    if !program.is_file() {
        bail!(
            "{} is missing (`cargo xtask workloads` builds it)",
            program.display()
        );
    }
    let perf_version = version(Path::new("perf"), &["--version"])
        .context("perf (Debian package linux-perf) is needed")?;
    let cpu = offcpu_cpu();
    let target = Target {
        program,
        args: vec!["--cpu".into(), cpu.to_string().into()],
        env: Vec::new(),
    };
    let sp_out = out_dir.join("offcpu.folded");
    let perf_out = out_dir.join("offcpu_perf.data");
    let n = cfg.rounds;
    let results = rounds("offcpu", n, |i| {
        let mut r = OffcpuRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            r.alone = run_pingpong_alone(&target)?;
            r.spanprof = run_spanprof_offcpu(spanprof, &target, &sp_out)?;
            r.perf = run_perf_switch(&target, &perf_out)?;
        } else {
            r.perf = run_perf_switch(&target, &perf_out)?;
            r.spanprof = run_spanprof_offcpu(spanprof, &target, &sp_out)?;
            r.alone = run_pingpong_alone(&target)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("offcpu_rounds.txt"), format!("{results:#?}\n"))?;
    Ok(offcpu_table(&results, cfg, &perf_version))
}

/// The CPU both threads of the ping-pong are pinned to: the last one, so that the first one is
/// left to the profilers (their own threads are not pinned). Pinned, each round trip is two
/// switches from one thread to the other, and the loop's time is steady; left to the scheduler
/// on these 2-CPU VMs it takes 1 s or 8 s depending on whether the threads share a CPU.
fn offcpu_cpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
}

/// The markdown of the off-CPU part's figures.
fn offcpu_table(results: &[OffcpuRound], cfg: &Config, perf_version: &str) -> String {
    let n = cfg.rounds;
    let trips = OFFCPU_ROUND_TRIPS as f64;
    let med = |f: &dyn Fn(&OffcpuRound) -> f64| median(results.iter().map(f).collect());
    let loop_secs = |r: &OffcpuRun| r.pingpong.seconds;
    let alone_secs = med(&|r| loop_secs(&r.alone));
    let alone_rate = med(&|r| r.alone.pingpong.switches_per_second());
    let alone_cpu = med(&|r| secs(r.alone.target.cpu));
    let vol_per_trip = med(&|r| r.alone.pingpong.voluntary as f64 / trips);
    let invol_per_trip = med(&|r| r.alone.pingpong.involuntary as f64 / trips);

    // Per configuration: (wall ratio, CPU ratio, µs added per round trip, switches per second).
    let ratios = |run: &dyn Fn(&OffcpuRound) -> &OffcpuRun| {
        (
            med(&|r| loop_secs(run(r)) / loop_secs(&r.alone)),
            med(&|r| secs(run(r).target.cpu) / secs(r.alone.target.cpu)),
            med(&|r| (loop_secs(run(r)) - loop_secs(&r.alone)) * 1e6 / trips),
            med(&|r| run(r).pingpong.switches_per_second()),
        )
    };
    let (sp_wall, sp_cpu, sp_added, sp_rate) = ratios(&|r| &r.spanprof.run);
    let (perf_wall, perf_cpu, perf_added, perf_rate) = ratios(&|r| &r.perf.run);

    // In-kernel: each program's counters summed over the rounds, then divided.
    let prog = |name: &str| {
        let mut sum = ProgWindow::default();
        for r in results {
            if let Some(w) = r.spanprof.progs.get(name) {
                sum.idle_ns += w.idle_ns;
                sum.idle_runs += w.idle_runs;
                sum.ns += w.ns;
                sum.runs += w.runs;
            }
        }
        sum
    };
    let per_run = |ns: u64, runs: u64| {
        if runs == 0 {
            "n/a".to_string()
        } else {
            format!("{:.3} µs", ns as f64 / runs as f64 / 1000.0)
        }
    };
    let switch = prog(ON_SWITCH);
    let sys_exit = prog(ON_SYS_EXIT);
    let window_secs: f64 = results
        .iter()
        .map(|r| secs(r.spanprof.run.target.wall))
        .sum();
    let machine_switch_rate = switch.runs as f64 / window_secs.max(1e-9);
    let kernel_per_trip = (switch.ns + sys_exit.ns) as f64 / (trips * n as f64) / 1000.0;
    // Other programs that ran in the windows (e.g. an on-CPU sampling program).
    let mut others = Vec::new();
    let mut names: Vec<&String> = results
        .iter()
        .flat_map(|r| r.spanprof.progs.keys())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        if name != ON_SWITCH && name != ON_SYS_EXIT {
            let w = prog(name);
            if w.runs > 0 {
                others.push(format!(
                    "`{name}` {} runs, {}",
                    w.runs,
                    per_run(w.ns, w.runs)
                ));
            }
        }
    }
    let others = if others.is_empty() {
        "none".to_string()
    } else {
        others.join("; ")
    };

    // Off-CPU time spanprof recorded, by reason.
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    for r in results {
        for (reason, ns) in &r.spanprof.by_reason {
            *by_reason.entry(reason.clone()).or_default() += ns;
        }
    }
    let recorded: u64 = by_reason
        .iter()
        .filter(|(k, _)| k.as_str() != "on-CPU")
        .map(|(_, v)| v)
        .sum();
    let reasons = by_reason
        .iter()
        .filter(|(k, _)| k.as_str() != "on-CPU")
        .map(|(k, v)| format!("{k} {:.1}%", percent(*v, recorded)))
        .collect::<Vec<_>>()
        .join(", ");
    let lost: u64 = results.iter().map(|r| r.spanprof.lost).sum();
    let summary = results
        .last()
        .map(|r| r.spanprof.summary.join(" / "))
        .unwrap_or_default();

    let sp_own = med(&|r| secs(r.spanprof.run.own.cpu) * 1e6 / trips);
    let perf_own = med(&|r| secs(r.perf.run.own.cpu) * 1e6 / trips);
    let sp_own_total = med(&|r| secs(r.spanprof.run.own.cpu));
    let perf_own_total = med(&|r| secs(r.perf.run.own.cpu));
    let sp_rss = results
        .iter()
        .map(|r| r.spanprof.run.own.max_rss_kib)
        .max()
        .unwrap_or(0);
    let perf_rss = results
        .iter()
        .map(|r| r.perf.run.own.max_rss_kib)
        .max()
        .unwrap_or(0);
    let perf_samples = med(&|r| r.perf.samples as f64);
    let perf_bytes = med(&|r| r.perf.data_bytes as f64 / trips);

    format!(
        "Method: `xtask/workloads/{OFFCPU_TARGET}.c` (built by `cargo xtask workloads`, frame \
         pointers): two threads pass a byte back and forth through two pipes, \
         {OFFCPU_ROUND_TRIPS} round trips per run, each hop waking the other thread and blocking \
         the writer in a read of an empty pipe, both threads pinned to CPU {} (`--cpu`: two \
         switches per round trip from one thread straight to the other; unpinned, the loop takes \
         1 s or 8 s on these VMs depending on whether the threads share a CPU). It is gated like `fixed_work` and times its loop \
         itself (CLOCK_MONOTONIC), with the context switches of its threads in the loop \
         (getrusage). Each round runs it alone, under `spanprof profile --event offcpu \
         --frequency {HZ} --pid` (folded output) and under `perf record -e {PERF_SWITCH_EVENT} -g \
         -p` (one record with a frame-pointer call graph per switch out of a target thread, the \
         classic off-CPU recipe), the order reversed every other round. Slowdowns are medians \
         of the per-round ratios (loop wall time; target CPU time from `wait4`). In-kernel: the \
         run_time_ns and run_cnt of spanprof's `{ON_SWITCH}` (tp_btf/sched_switch: runs on every \
         context switch of the machine) and `{ON_SYS_EXIT}` (tp_btf/sys_exit: every system call \
         exit; sends the off-CPU sample of a thread whose blocked interval was sampled), read \
         from the spawned spanprof's own program fds (`kernel.bpf_stats_enabled=1`) once \
         attached, 1 s later with the target still blocked on its gate (the runs for other \
         processes), and when the target exits; summed over the rounds, then divided by the \
         runs.\n\n\
         Run of `cargo xtask bench --only offcpu --rounds {n}` on {}, {perf_version}: target \
         `{OFFCPU_TARGET}` alone {alone_secs:.3} s for {OFFCPU_ROUND_TRIPS} round trips \
         ({:.2} µs each), {alone_cpu:.2} s CPU, {alone_rate:.0} context switches per second of \
         its threads ({vol_per_trip:.2} voluntary and {invol_per_trip:.2} involuntary per round \
         trip) (medians).\n\n\
         | figure | spanprof --event offcpu | perf record -e {PERF_SWITCH_EVENT} -g | goal |\n\
         |---|---|---|---|\n\
         | loop wall time, profiled / alone (median of {n} interleaved rounds) | {sp_wall:.3} | {perf_wall:.3} | |\n\
         | target CPU time, profiled / alone (median) | {sp_cpu:.3} | {perf_cpu:.3} | |\n\
         | wall time added per round trip, profiled − alone (median) | {sp_added:.2} µs | {perf_added:.2} µs | |\n\
         | context switches per second of the target's threads (median; alone {alone_rate:.0}) | {sp_rate:.0} | {perf_rate:.0} | |\n\
         | **in-kernel time per `{ON_SWITCH}` run** while the target ran ({} runs, {machine_switch_rate:.0} switches/s on the machine) | **{}** | n/a | ≤ 1 µs |\n\
         | the same while the target was blocked (other processes' switches, {} runs) | {} | n/a | |\n\
         | in-kernel time per `{ON_SYS_EXIT}` run while the target ran ({} runs) | {} | n/a | |\n\
         | the same while the target was blocked ({} runs) | {} | n/a | |\n\
         | in-kernel time of both programs per round trip, while the target ran | {kernel_per_trip:.2} µs | n/a | |\n\
         | other programs that ran while the target ran | {others} | n/a | |\n\
         | off-CPU time recorded, by reason (folded output, all rounds) | {reasons} | n/a | |\n\
         | recorded per run (summary, last round); samples lost, all rounds | {}; {lost} lost | {perf_samples:.0} records per run (median) | |\n\
         | profiler's own CPU, whole process (median); per round trip | {sp_own_total:.3} s; {sp_own:.2} µs | {perf_own_total:.3} s; {perf_own:.2} µs | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | |\n\
         | bytes written per round trip (perf.data size / round trips, median) | n/a | {perf_bytes:.0} B | |\n\n\
         spanprof's summary (last round): {summary}\n",
        offcpu_cpu(),
        machine(),
        alone_secs * 1e6 / trips,
        switch.runs,
        per_run(switch.ns, switch.runs),
        switch.idle_runs,
        per_run(switch.idle_ns, switch.idle_runs),
        sys_exit.runs,
        per_run(sys_exit.ns, sys_exit.runs),
        sys_exit.idle_runs,
        per_run(sys_exit.idle_ns, sys_exit.idle_runs),
        results
            .last()
            .map_or("", |r| r.spanprof.recorded.as_str()),
        mb(sp_rss),
        mb(perf_rss),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_line_and_offcpu_reasons() {
        let p = parse_pingpong(
            "4242\n{\"round_trips\": 200000, \"seconds\": 1.215983076, \
             \"voluntary_switches\": 233734, \"involuntary_switches\": 166286}\n",
        )
        .unwrap();
        assert_eq!(
            (p.round_trips, p.voluntary, p.involuntary),
            (200000, 233734, 166286)
        );
        assert!((p.switches_per_second() - 400020.0 / 1.215983076).abs() < 1e-6);
        assert!(parse_pingpong("4242\n").is_err());
        assert!(parse_pingpong("{\"round_trips\": 1, \"seconds\": 0}").is_err());

        let dir = std::env::temp_dir().join(format!("xtask-offcpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.folded");
        std::fs::write(
            &path,
            "[off-cpu: io];_start;main;ping_side;read;pipe_read_[k] 7000\n\
             [off-cpu: io];_start;start_thread;pong_side;read 3000\n\
             [off-cpu: lock];_start;main;pthread_join 500\n\
             _start;main;ping_side;write 2004008\n",
        )
        .unwrap();
        let by_reason = offcpu_by_reason(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(by_reason.get("io"), Some(&10000));
        assert_eq!(by_reason.get("lock"), Some(&500));
        assert_eq!(by_reason.get("on-CPU"), Some(&2004008));
        assert_eq!(by_reason.len(), 3);
    }
}
