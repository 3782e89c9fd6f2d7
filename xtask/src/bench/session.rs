//! The session part (`bench-session` block): what one profiling session costs apart from its
//! samples, and what each sample costs once sampling runs, for spanprof, py-spy record and
//! perf record, by the difference of two session lengths.
//!
//! Every profiler runs on the same gated target, `bench_py_stack.py` with `BENCH_PY_SHALLOW=1`
//! (a 2-frame Python stack: the module calls the work itself), at 99 Hz by `--pid`, once with a
//! short amount of work and once with a long one, the six runs of a round interleaved. A
//! profiler's own CPU time (user + system, from `wait4`) is `fixed + per_sample × samples`: the
//! long run less the short one, over their difference in samples, prices a sample in steady
//! state; the short run less its samples at that price is the session's fixed cost (start-up,
//! loading, attaching, symbolizing and writing the output). Each figure is the median of the
//! per-round figures.
//!
//! Each round then runs four more long spanprof sessions, their order rotated: the whole
//! program, `--no-spans`, `--unwind fp` and both. The whole program's in-kernel time per sample
//! less each other's, round by round, prices the span context lookup, and the user stack copy
//! less the kernel's frame-pointer walk that replaces it, on this target.

use std::path::Path;

use anyhow::{Context, Result};

use super::measure::{bpf_figures, lowest_highest, machine, median, rounds, secs, BpfWindow, HZ};
use super::profilers::{run_perf, run_pyspy, run_spanprof, OtherRun, SpanprofRun};
use super::python::{stack_target, PY_FILE};
use super::Config;

/// The short and long sessions' work, as fractions of `--py-work`.
const SHORT: f64 = 0.4;
const LONG: f64 = 2.0;

/// A profiler's own CPU time and samples in one run.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    cpu_s: f64,
    samples: u64,
}

impl From<&SpanprofRun> for Cost {
    fn from(r: &SpanprofRun) -> Self {
        Cost {
            cpu_s: secs(r.own.cpu),
            samples: r.samples,
        }
    }
}

impl From<&OtherRun> for Cost {
    fn from(r: &OtherRun) -> Self {
        Cost {
            cpu_s: secs(r.own.cpu),
            samples: r.samples,
        }
    }
}

/// (fixed cost in ms, cost per sample in µs) from a short and a long run; `None` when the long
/// run has no more samples than the short one.
fn split(short: Cost, long: Cost) -> Option<(f64, f64)> {
    let more = long.samples.checked_sub(short.samples).filter(|&n| n > 0)? as f64;
    let per_sample = (long.cpu_s - short.cpu_s) / more;
    Some((
        (short.cpu_s - per_sample * short.samples as f64) * 1e3,
        per_sample * 1e6,
    ))
}

#[derive(Debug, Default)]
struct SessionRound {
    spanprof: [Cost; 2],
    pyspy: [Cost; 2],
    perf: [Cost; 2],
    /// The long spanprof run's in-kernel counters.
    bpf: Option<BpfWindow>,
    /// spanprof's own figure for its sampling loop, long run.
    loop_us: f64,
    /// spanprof's own figure for its setup, short run.
    setup_ms: f64,
    /// Instructions verified in its sampling program.
    verified_insns: Option<u64>,
    /// The in-kernel counters of long spanprof runs with parts of the program left out
    /// ([`PARTS`]).
    parts: [Option<BpfWindow>; PARTS.len()],
}

/// Long spanprof runs for the in-kernel figure's breakdown, their order rotated from round to
/// round: the whole program (the reference, first), then runs with a part of its work left out
/// or swapped: (flags, what the run changes).
const PARTS: [(&[&str], &str); 4] = [
    (&[], "the whole program (the reference of this table)"),
    (&["--no-spans"], "no span context lookup"),
    (
        &["--unwind", "fp"],
        "no user stack copy; the kernel follows frame pointers instead",
    ),
    (&["--no-spans", "--unwind", "fp"], "both"),
];

/// The three profilers on the shallow target, short and long sessions; the markdown of the
/// figures.
pub(super) fn session(
    root: &Path,
    spanprof: &Path,
    out_dir: &Path,
    cfg: &Config,
) -> Result<String> {
    let (target, python_version, pyspy_version) =
        stack_target(root, cfg, vec![("BENCH_PY_SHALLOW".into(), "1".into())])?;
    let n = cfg.rounds;
    let work = [
        ((cfg.py_work as f64 * SHORT) as u64).max(1),
        ((cfg.py_work as f64 * LONG) as u64).max(2),
    ];
    let sp_out = out_dir.join("bench_session.folded");
    let pyspy_out = out_dir.join("bench_session.pyspy.txt");
    let perf_out = out_dir.join("bench_session.perf.data");
    let results = rounds("session", n, |i| {
        let mut r = SessionRound::default();
        // Half the rounds run the long sessions first, and the profilers in reverse order.
        let order: [usize; 2] = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for len in order {
            let mut run = |which: usize| -> Result<()> {
                match which {
                    0 => {
                        let run = run_spanprof(spanprof, &target, work[len], HZ, &[], &sp_out)?;
                        if len == 1 {
                            r.bpf = run.bpf;
                            r.loop_us = run.loop_us;
                        } else {
                            r.setup_ms = run.setup_ms;
                            r.verified_insns = run.verified_insns;
                        }
                        r.spanprof[len] = Cost::from(&run);
                    }
                    1 => {
                        let run = run_pyspy(&cfg.py_spy, &target, work[len], &pyspy_out)?;
                        r.pyspy[len] = Cost::from(&run);
                    }
                    _ => {
                        let run = run_perf(&target, work[len], HZ, &["-g"], &perf_out)?;
                        r.perf[len] = Cost::from(&run);
                    }
                }
                Ok(())
            };
            let profilers: [usize; 3] = if i % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for which in profilers {
                run(which)?;
            }
        }
        for j in 0..PARTS.len() {
            let k = (i + j) % PARTS.len();
            let run = run_spanprof(spanprof, &target, work[1], HZ, PARTS[k].0, &sp_out)?;
            r.parts[k] = run.bpf;
        }
        Ok(r)
    })?;
    std::fs::write(
        out_dir.join("session_rounds.txt"),
        format!("{results:#?}\n"),
    )?;

    // Median (min to max) of one figure over the rounds where it could be computed.
    let figure = |costs: &dyn Fn(&SessionRound) -> [Cost; 2], part: fn((f64, f64)) -> f64| {
        let all: Vec<f64> = results
            .iter()
            .filter_map(|r| {
                let [short, long] = costs(r);
                split(short, long).map(part)
            })
            .collect();
        let (lo, hi) = lowest_highest(&all);
        (median(all.clone()), lo, hi, all.len())
    };
    let fixed = |r: (f64, f64)| r.0;
    let per = |r: (f64, f64)| r.1;
    let sp_fixed = figure(&|r| r.spanprof, fixed);
    let ps_fixed = figure(&|r| r.pyspy, fixed);
    let pf_fixed = figure(&|r| r.perf, fixed);
    let sp_per = figure(&|r| r.spanprof, per);
    let ps_per = figure(&|r| r.pyspy, per);
    let pf_per = figure(&|r| r.perf, per);
    let samples =
        |f: &dyn Fn(&SessionRound) -> u64| median(results.iter().map(|r| f(r) as f64).collect());
    let sp_samples = [
        samples(&|r| r.spanprof[0].samples),
        samples(&|r| r.spanprof[1].samples),
    ];
    let loop_us = median(results.iter().map(|r| r.loop_us).collect());
    let setup_ms = median(results.iter().map(|r| r.setup_ms).collect());
    let verified = results
        .iter()
        .filter_map(|r| r.verified_insns)
        .max()
        .map_or("n/a".to_string(), |n| n.to_string());
    let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
    // Each run's figure in each round; then the reference less the run, round by round.
    let net_us =
        |w: &Option<BpfWindow>| w.and_then(|w| bpf_figures(&[w])).map(|f| f.net_ns / 1000.0);
    let mut breakdown = String::new();
    for (k, (flags, what)) in PARTS.iter().enumerate() {
        let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.parts[k]).collect();
        let part = bpf_figures(&windows).context("no in-kernel statistics were read")?;
        let paired: Vec<f64> = results
            .iter()
            .filter_map(|r| Some(net_us(&r.parts[0])? - net_us(&r.parts[k])?))
            .collect();
        let (lo, hi) = lowest_highest(&paired);
        let difference = if k == 0 || paired.is_empty() {
            String::new()
        } else {
            format!("{:+.2} µs ({lo:+.2} to {hi:+.2})", median(paired))
        };
        breakdown.push_str(&format!(
            "| `spanprof profile{}{}`: {what} | {:.2} µs ({} samples) | {difference} |\n",
            if flags.is_empty() { "" } else { " " },
            flags.join(" "),
            part.net_ns / 1000.0,
            part.target_samples,
        ));
    }
    let cell = |f: (f64, f64, f64, usize), unit: &str, digits: usize| {
        if f.3 == 0 {
            "n/a".to_string()
        } else {
            format!(
                "{:.*} {unit} ({:.*} to {:.*})",
                digits, f.0, digits, f.1, digits, f.2
            )
        }
    };
    Ok(format!(
        "Run of `cargo xtask bench --only session --rounds {n} --py-work {}` on {}: target \
         `{PY_FILE}` with `BENCH_PY_SHALLOW=1` (Python {python_version}, a 2-frame stack), \
         {} and {} units of work per session, each profiler at {HZ} Hz by `--pid`; spanprof \
         took {:.0} and {:.0} samples (medians); {pyspy_version}.\n\n\
         | figure | spanprof | py-spy record | perf record -g | goal |\n\
         |---|---|---|---|---|\n\
         | **fixed CPU of a session** (start-up, loading, attaching, symbolizing, writing), median (min to max) of {n} rounds | **{}** | {} | {} | ≤ 100 ms |\n\
         | **own CPU per sample in steady state** (the difference of the two sessions) | **{}** | {} | {} | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median, long sessions) | {loop_us:.1} µs | n/a | n/a | |\n\
         | spanprof's own CPU before its first sample (loading, verifying, attaching), as it reports it (median, short sessions) | {setup_ms:.1} ms | n/a | n/a | |\n\
         | instructions the kernel's verifier checked in the sampling program `on_cpu_sample` (`verified_insns` of its fdinfo) | {verified} | n/a | n/a | |\n\
         | **in-kernel time per target sample, shallow Python stack** (BPF statistics, net of the runs for other processes; long sessions, {} samples) | **{:.2} µs** | n/a | n/a | ≤ 6 µs |\n\n\
         What the in-kernel time is made of: four more long spanprof sessions in each round, \
         their order rotated, the first with the whole program (same figure, all rounds pooled; \
         the difference is the median, with its range, of the per-round differences).\n\n\
         | spanprof run | in-kernel time per target sample | the whole program less this run |\n\
         |---|---|---|\n\
         {breakdown}",
        cfg.py_work,
        machine(),
        work[0],
        work[1],
        sp_samples[0],
        sp_samples[1],
        cell(sp_fixed, "ms", 0),
        cell(ps_fixed, "ms", 0),
        cell(pf_fixed, "ms", 0),
        cell(sp_per, "µs", 1),
        cell(ps_per, "µs", 1),
        cell(pf_per, "µs", 1),
        bpf.target_samples,
        bpf.net_ns / 1000.0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_lengths_split_fixed_and_per_sample_cost() {
        // 0.3 s + 40 µs per sample: 200 and 1200 samples.
        let short = Cost {
            cpu_s: 0.3 + 200.0 * 40e-6,
            samples: 200,
        };
        let long = Cost {
            cpu_s: 0.3 + 1200.0 * 40e-6,
            samples: 1200,
        };
        let (fixed_ms, per_us) = split(short, long).unwrap();
        assert!((fixed_ms - 300.0).abs() < 1e-6, "{fixed_ms}");
        assert!((per_us - 40.0).abs() < 1e-6, "{per_us}");
        assert!(split(long, short).is_none());
        assert!(split(short, short).is_none());
    }
}
