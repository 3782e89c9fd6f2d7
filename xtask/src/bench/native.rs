//! The native part (`bench` block): `fixed_work` alone, under spanprof and under
//! `perf record -g`.

use std::path::Path;

use anyhow::{Context, Result};

use super::measure::{
    bpf_figures, machine, mb, median, per_sample_us, rounds, run_alone, secs, BpfWindow, Target,
    TargetRun, HZ,
};
use super::profilers::{run_perf, run_spanprof, OtherRun, SpanprofRun};
use super::Config;

#[derive(Debug, Default)]
struct NativeRound {
    alone: TargetRun,
    spanprof: SpanprofRun,
    perf: OtherRun,
}

/// fixed_work alone, under spanprof and under perf record; the markdown of its figures.
pub(super) fn native(
    spanprof: &Path,
    workloads: &Path,
    out_dir: &Path,
    cfg: &Config,
) -> Result<String> {
    let target = Target {
        program: workloads.join("fixed_work"),
        args: Vec::new(),
        env: Vec::new(),
    };
    let (work, n) = (cfg.work, cfg.rounds);
    let sp_out = out_dir.join("bench.pb.gz");
    let perf_out = out_dir.join("perf.data");
    let results = rounds("native", n, |i| {
        let mut r = NativeRound::default();
        // Alternate the order so drift in the machine's speed does not favour one configuration.
        if i % 2 == 0 {
            r.alone = run_alone(&target, work)?;
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &sp_out)?;
            r.perf = run_perf(&target, work, HZ, &["-g"], &perf_out)?;
        } else {
            r.perf = run_perf(&target, work, HZ, &["-g"], &perf_out)?;
            r.spanprof = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &sp_out)?;
            r.alone = run_alone(&target, work)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("native_rounds.txt"), format!("{results:#?}\n"))?;

    // The median over rounds of one figure of each round.
    let med = |f: &dyn Fn(&NativeRound) -> f64| median(results.iter().map(f).collect());
    let sp_ratio = med(&|r| secs(r.spanprof.target.cpu) / secs(r.alone.cpu));
    let perf_ratio = med(&|r| secs(r.perf.target.cpu) / secs(r.alone.cpu));
    let sp_us = med(&|r| per_sample_us(r.spanprof.own.cpu, r.spanprof.samples));
    let sp_loop_us = med(&|r| r.spanprof.loop_us);
    let perf_us = med(&|r| per_sample_us(r.perf.own.cpu, r.perf.samples));
    let sp_rss = results.iter().map(|r| r.spanprof.own.max_rss_kib).max();
    let perf_rss = results.iter().map(|r| r.perf.own.max_rss_kib).max();
    let alone = med(&|r| secs(r.alone.cpu));
    let alone_wall = med(&|r| secs(r.alone.wall));
    let samples = med(&|r| r.spanprof.samples as f64);
    let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;

    Ok(format!(
        "Run of `cargo xtask bench --rounds {n} --work {work}` on {}: \
         target `fixed_work` alone {alone:.2} s CPU in {alone_wall:.2} s (medians), {samples:.0} samples per spanprof run.\n\n\
         | figure | spanprof --unwind fp | perf record -g | goal |\n\
         |---|---|---|---|\n\
         | target CPU time, profiled / alone (median of {n} interleaved rounds) | {sp_ratio:.4} | {perf_ratio:.4} | ≤ 1.005 |\n\
         | profiler's own CPU per sample, whole process (median) | {sp_us:.1} µs | {perf_us:.1} µs | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median) | {sp_loop_us:.1} µs | n/a | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | ≤ 64 MB |\n\
         | in-kernel time per sampling-program run, all runs while the target ran ({} runs) | {:.2} µs | n/a | |\n\
         | in-kernel time per target sample, net of the runs for other processes ({} samples) | {:.2} µs | n/a | |\n",
        machine(),
        mb(sp_rss.unwrap_or(0)),
        mb(perf_rss.unwrap_or(0)),
        bpf.runs,
        bpf.per_run_ns / 1000.0,
        bpf.target_samples,
        bpf.net_ns / 1000.0,
    ))
}
