//! The span part (`bench-spans` blocks): `bench_py_span.py` under spanprof with span reading
//! and with `--no-spans`, at 99 Hz and at 999 Hz.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::measure::{
    bpf_figures, folded_stacks, lowest_highest, machine, median, percent, rounds, version,
    BpfFigures, BpfWindow, Target, HZ,
};
use super::profilers::{run_spanprof, SpanCounts, SpanprofRun};
use super::python::{HIGH_HZ, PY_DEPTH, PY_FILE};
use super::{Config, SpanKinds};

/// The span target: the same 50-frame work inside an OpenTelemetry span and an OSProfiler trace.
const SPAN_FILE: &str = "bench_py_span.py";

/// Samples of a span-grouped folded profile (`--group-by span`: the root frame names the span
/// context, e.g. `[span … trace … osprofiler …]`, or `[no span]`).
#[derive(Debug, Clone, Copy, Default)]
struct SpanDepth {
    all: u64,
    /// Samples whose stack holds exactly the 50 Python frames of the work.
    whole: u64,
    /// Of those, the samples under a root frame naming an OpenTelemetry span (`[span …]`).
    whole_otel: u64,
    /// Of those, the samples under a root frame naming an OSProfiler trace point.
    whole_osp: u64,
}

fn span_depth(path: &Path) -> Result<SpanDepth> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    // `<module>` is the span target's frame, f0..f48 bench_py_stack.py's (imported from it).
    let markers = [format!("({SPAN_FILE}:"), format!("({PY_FILE}:")];
    let ours = |f: &&str| markers.iter().any(|m| f.contains(m.as_str()));
    let mut d = SpanDepth::default();
    for (stack, n) in folded_stacks(&text) {
        d.all += n;
        if stack.split(';').filter(ours).count() == PY_DEPTH {
            d.whole += n;
            // `[span S trace T]`, `[osprofiler P base B]`, `[span S trace T osprofiler P]`.
            let root = stack.split(';').next().unwrap_or("");
            if root.starts_with("[span ") {
                d.whole_otel += n;
            }
            if root.starts_with("[osprofiler ") || root.contains(" osprofiler ") {
                d.whole_osp += n;
            }
        }
    }
    Ok(d)
}

/// One run of the span target under spanprof, and its span-grouped folded output.
#[derive(Debug, Default)]
struct SpanRun {
    run: SpanprofRun,
    depth: SpanDepth,
}

/// One round of the span part: at each rate ([`HZ`], [`HIGH_HZ`]), spanprof reading spans and
/// spanprof with `--no-spans`.
#[derive(Debug, Default)]
struct SpanRound {
    spans: [SpanRun; 2],
    no_spans: [SpanRun; 2],
}

/// The figures of one configuration (spans read or not) at one rate, over every round.
struct SpanConfigFigures {
    bpf: BpfFigures,
    samples: u64,
    depth: SpanDepth,
    counts: SpanCounts,
}

fn span_config(runs: &[&SpanRun]) -> Result<SpanConfigFigures> {
    let windows: Vec<BpfWindow> = runs.iter().filter_map(|r| r.run.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
    let mut f = SpanConfigFigures {
        bpf,
        samples: 0,
        depth: SpanDepth::default(),
        counts: SpanCounts::default(),
    };
    for r in runs {
        f.samples += r.run.samples;
        f.depth.all += r.depth.all;
        f.depth.whole += r.depth.whole;
        f.depth.whole_otel += r.depth.whole_otel;
        f.depth.whole_osp += r.depth.whole_osp;
        let c = r.run.spans.unwrap_or_default();
        f.counts.otel += c.otel;
        f.counts.osp += c.osp;
        f.counts.published += c.published;
    }
    Ok(f)
}

/// bench_py_span.py under spanprof with and without span reading, at 99 and 999 Hz,
/// interleaved; the markdown of the in-kernel figures and the difference.
pub(super) fn spans(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let script = root.join("tests/workloads").join(SPAN_FILE);
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    let minor = python_version
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    let libs = cfg.span_libs.join(&minor);
    if !libs.is_dir() {
        bail!(
            "no tracing libraries for CPython {minor} in {} (`cargo xtask deps` installs them \
             for pyenv's 3.8-3.13)",
            libs.display()
        );
    }
    let env = vec![
        (OsString::from("PYTHONPATH"), libs.clone().into_os_string()),
        (OsString::from("PYTHONNOUSERSITE"), OsString::from("1")),
        (
            OsString::from("BENCH_SPAN_KINDS"),
            OsString::from(cfg.span_kinds.name()),
        ),
    ];
    // The versions of the packages in `libs`, "?" for one that is missing.
    let lib_version = |package: &str| {
        Command::new(&cfg.python)
            .args([
                "-c",
                &format!("import importlib.metadata as m; print(m.version('{package}'))"),
            ])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "?".to_string())
    };
    let otel_version = lib_version("opentelemetry-sdk");
    let osp_version = lib_version("osprofiler");
    let inside = match cfg.span_kinds {
        SpanKinds::Both => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} and an \
             OSProfiler {osp_version} trace"
        ),
        SpanKinds::Otel => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} only, \
             `--span-kinds otel`"
        ),
        SpanKinds::Osprofiler => {
            format!("inside an OSProfiler {osp_version} trace only, `--span-kinds osprofiler`")
        }
        SpanKinds::Published => format!(
            "inside an OpenTelemetry span of opentelemetry-sdk {otel_version} and an \
             OSProfiler {osp_version} trace published by spanprof-context {}'s `install()` as \
             an OTEP 4947 thread context, `--span-kinds published`",
            lib_version("spanprof-context")
        ),
    };
    let target = Target {
        program: cfg.python.clone(),
        args: vec![script.into()],
        env,
    };
    let (work, n) = (cfg.py_work, cfg.rounds);
    let rates = [HZ, HIGH_HZ];
    let one = |rate: usize, read_spans: bool| -> Result<SpanRun> {
        let out = out_dir.join(format!(
            "bench_span_{}{}.folded",
            rates[rate],
            if read_spans { "" } else { "_nospans" }
        ));
        let mut extra = vec!["--group-by", "span"];
        if !read_spans {
            extra.push("--no-spans");
        }
        let run = run_spanprof(spanprof, &target, work, rates[rate], &extra, &out)?;
        Ok(SpanRun {
            run,
            depth: span_depth(&out)?,
        })
    };
    let results = rounds("spans", n, |i| {
        let mut r = SpanRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            for rate in 0..rates.len() {
                r.spans[rate] = one(rate, true)?;
                r.no_spans[rate] = one(rate, false)?;
            }
        } else {
            for rate in (0..rates.len()).rev() {
                r.no_spans[rate] = one(rate, false)?;
                r.spans[rate] = one(rate, true)?;
            }
        }
        Ok(r)
    })?;
    let rounds_file = match cfg.span_kinds {
        SpanKinds::Both => "spans_rounds.txt".to_string(),
        k => format!("spans_{}_rounds.txt", k.name()),
    };
    std::fs::write(out_dir.join(rounds_file), format!("{results:#?}\n"))?;

    let published = cfg.span_kinds == SpanKinds::Published;
    let mut rows: Vec<[String; 2]> = vec![Default::default(); 11];
    for rate in 0..rates.len() {
        let with = span_config(&results.iter().map(|r| &r.spans[rate]).collect::<Vec<_>>())?;
        let without = span_config(
            &results
                .iter()
                .map(|r| &r.no_spans[rate])
                .collect::<Vec<_>>(),
        )?;
        // The same difference round by round (each pair of runs on its own), for its spread.
        let paired: Vec<f64> = results
            .iter()
            .filter_map(|r| {
                let a = bpf_figures(&[r.spans[rate].run.bpf?])?;
                let b = bpf_figures(&[r.no_spans[rate].run.bpf?])?;
                Some((a.net_ns - b.net_ns) / 1000.0)
            })
            .collect();
        let (lo, hi) = lowest_highest(&paired);
        let us = |ns: f64| ns / 1000.0;
        let diff = us(with.bpf.net_ns - without.bpf.net_ns);
        let col = [
            format!("{:.2} µs", us(with.bpf.net_ns)),
            format!("{:.2} µs", us(without.bpf.net_ns)),
            format!("**{diff:.2} µs**"),
            format!("{:.2} µs ({lo:.2} to {hi:.2})", median(paired.clone())),
            format!(
                "{} / {}",
                with.bpf.target_samples, without.bpf.target_samples
            ),
            format!(
                "{:.2} / {:.2} µs",
                us(with.bpf.other_run_ns),
                us(without.bpf.other_run_ns)
            ),
            format!(
                "{:.1}% / {:.1}%",
                percent(with.counts.otel, with.samples),
                percent(with.counts.osp, with.samples)
            ),
            format!(
                "{:.1}% / {:.1}% (of {})",
                percent(with.depth.whole_otel, with.depth.whole),
                percent(with.depth.whole_osp, with.depth.whole),
                with.depth.whole
            ),
            format!(
                "{:.1}% / {:.1}%",
                percent(with.depth.whole, with.depth.all),
                percent(without.depth.whole, without.depth.all)
            ),
            format!(
                "{} / {}",
                without.counts.otel + without.counts.osp,
                without.depth.whole_otel + without.depth.whole_osp
            ),
            format!(
                "{:.1}% / {:.1}% ({} / {} / {})",
                percent(with.counts.published, with.samples),
                percent(with.counts.published, with.depth.whole),
                with.counts.published,
                with.samples,
                with.depth.whole
            ),
        ];
        for (row, cell) in rows.iter_mut().zip(col) {
            row[rate] = cell;
        }
    }
    let labels = [
        "in-kernel time per target sample, spans read (net of the runs for other processes)",
        "the same with `--no-spans`",
        "**span reading per sample** (the difference)",
        "median (min to max) of the per-round differences",
        "target samples, spans read / `--no-spans` (all rounds)",
        "in-kernel time per run for other processes, spans read / `--no-spans`",
        "samples with an OpenTelemetry span / in an OSProfiler trace (`spans:` line)",
        "samples of the work (all 50 frames) with an OpenTelemetry span / an OSProfiler trace",
        "samples holding all 50 Python frames, spans read / `--no-spans`",
        "samples with a span context under `--no-spans` (`spans:` line / span-grouped output)",
        "samples read from the thread context the process publishes (`spans:` line), share of \
         all samples / of the work's samples (read / all / work)",
    ];
    let goals = ["", "", "≤ 5 µs", "", "", "", "", "", "", "", ""];
    let mut table = String::new();
    for (i, ((label, row), goal)) in labels.iter().zip(&rows).zip(goals).enumerate() {
        // The published share is a figure of `--span-kinds published` only (0 otherwise).
        if i == labels.len() - 1 && !published {
            continue;
        }
        table += &format!("| {label} | {} | {} | {goal} |\n", row[0], row[1]);
    }
    let kinds_arg = match cfg.span_kinds {
        SpanKinds::Both => String::new(),
        k => format!(" --span-kinds {}", k.name()),
    };
    Ok(format!(
        "Run of `cargo xtask bench --only spans{kinds_arg} --rounds {n} --py-work {work}` on {}: target \
         `{SPAN_FILE}` (CPython {python_version}, {PY_DEPTH} Python frames, {inside}), spanprof reading spans and with `--no-spans`, at {HZ} Hz and at {HIGH_HZ} Hz, \
         the four runs interleaved in each of {n} rounds.\n\n\
         | figure | {HZ} Hz | {HIGH_HZ} Hz | goal |\n\
         |---|---|---|---|\n\
         {table}",
        machine(),
    ))
}
