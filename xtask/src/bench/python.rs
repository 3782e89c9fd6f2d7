//! The Python part (`bench-python` block): `bench_py_stack.py` alone, under spanprof and under
//! `py-spy record`; and the sid part (`bench-sid` block): the same stack under Debian sid's
//! CPython 3.14 and 3.15 in a chroot.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::measure::{
    bpf_figures, folded_stacks, machine, mb, median, per_sample_us, rounds, run_alone, secs,
    version, BpfWindow, Target, TargetRun, HZ,
};
use super::profilers::{run_pyspy, run_spanprof, OtherRun, SpanprofRun};
use super::Config;

/// The extra in-kernel measurement on the Python target: rate and number of runs.
pub(super) const HIGH_HZ: u32 = 999;
const HIGH_RUNS: usize = 2;
/// Python frames of every sample of the Python target's work (`<module>` and f0..f48).
pub(super) const PY_DEPTH: usize = 50;
pub(super) const PY_FILE: &str = "bench_py_stack.py";

/// Samples of a folded profile, and those whose stack holds exactly the target's 50 Python
/// frames (the work; the rest are the moment of the release and interpreter exit).
fn python_depth(path: &Path) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let marker = format!("({PY_FILE}:");
    let (mut all, mut whole) = (0, 0);
    for (stack, n) in folded_stacks(&text) {
        all += n;
        if stack.split(';').filter(|f| f.contains(&marker)).count() == PY_DEPTH {
            whole += n;
        }
    }
    Ok((all, whole))
}

#[derive(Debug, Default)]
struct PyRound {
    alone: TargetRun,
    spanprof: SpanprofRun,
    /// (all samples, samples with the whole 50-frame Python stack) of spanprof's folded output.
    spanprof_depth: (u64, u64),
    pyspy: OtherRun,
    pyspy_depth: (u64, u64),
    /// spanprof with `--unwind fp`, for the cost of the default stack copy.
    spanprof_fp: SpanprofRun,
}

/// The gated `bench_py_stack.py` target run by `cfg.python` with `env`, and the versions of
/// that CPython and of py-spy for the headings.
pub(super) fn stack_target(
    root: &Path,
    cfg: &Config,
    env: Vec<(OsString, OsString)>,
) -> Result<(Target, String, String)> {
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    let pyspy_version = version(&cfg.py_spy, &["--version"])?;
    let target = Target {
        program: cfg.python.clone(),
        args: vec![root.join("tests/workloads").join(PY_FILE).into()],
        env,
    };
    Ok((target, python_version, pyspy_version))
}

/// bench_py_stack.py alone, under spanprof and under py-spy record; then spanprof alone at a
/// higher rate for the in-kernel cost; the markdown of its figures.
pub(super) fn python(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    let (target, python_version, pyspy_version) = stack_target(root, cfg, Vec::new())?;
    let (work, n) = (cfg.py_work, cfg.rounds);
    let sp_out = out_dir.join("bench_py.folded");
    let pyspy_out = out_dir.join("bench_py.pyspy.txt");
    let spanprof_run = |r: &mut PyRound| -> Result<()> {
        r.spanprof = run_spanprof(spanprof, &target, work, HZ, &[], &sp_out)?;
        r.spanprof_depth = python_depth(&sp_out)?;
        Ok(())
    };
    let pyspy_run = |r: &mut PyRound| -> Result<()> {
        r.pyspy = run_pyspy(&cfg.py_spy, &target, work, &pyspy_out)?;
        r.pyspy_depth = python_depth(&pyspy_out)?;
        Ok(())
    };
    let fp_out = out_dir.join("bench_py_fp.folded");
    let fp_run = |r: &mut PyRound| -> Result<()> {
        r.spanprof_fp = run_spanprof(spanprof, &target, work, HZ, &["--unwind", "fp"], &fp_out)?;
        Ok(())
    };
    let results = rounds("python", n, |i| {
        let mut r = PyRound::default();
        if i % 2 == 0 {
            r.alone = run_alone(&target, work)?;
            spanprof_run(&mut r)?;
            pyspy_run(&mut r)?;
            fp_run(&mut r)?;
        } else {
            fp_run(&mut r)?;
            pyspy_run(&mut r)?;
            spanprof_run(&mut r)?;
            r.alone = run_alone(&target, work)?;
        }
        Ok(r)
    })?;
    // At the higher rate, the default and --unwind fp alternate.
    let high = rounds(&format!("python at {HIGH_HZ} Hz"), 2 * HIGH_RUNS, |i| {
        let out = out_dir.join("bench_py_high.folded");
        let extra: &[&str] = if i % 2 == 0 { &[] } else { &["--unwind", "fp"] };
        let run = run_spanprof(spanprof, &target, work, HIGH_HZ, extra, &out)?;
        Ok((run, python_depth(&out)?))
    })?;
    std::fs::write(
        out_dir.join("python_rounds.txt"),
        format!("{results:#?}\n{high:#?}\n"),
    )?;

    let med = |f: &dyn Fn(&PyRound) -> f64| median(results.iter().map(f).collect());
    let sp_ratio = med(&|r| secs(r.spanprof.target.cpu) / secs(r.alone.cpu));
    let ps_ratio = med(&|r| secs(r.pyspy.target.cpu) / secs(r.alone.cpu));
    let sp_us = med(&|r| per_sample_us(r.spanprof.own.cpu, r.spanprof.samples));
    let ps_us = med(&|r| per_sample_us(r.pyspy.own.cpu, r.pyspy.samples));
    let sp_loop_us = med(&|r| r.spanprof.loop_us);
    let sp_rss = results.iter().map(|r| r.spanprof.own.max_rss_kib).max();
    let ps_rss = results.iter().map(|r| r.pyspy.own.max_rss_kib).max();
    let alone = med(&|r| secs(r.alone.cpu));
    let alone_wall = med(&|r| secs(r.alone.wall));
    let sp_samples = med(&|r| r.spanprof.samples as f64);
    let ps_samples = med(&|r| r.pyspy.samples as f64);
    let share = |d: &dyn Fn(&PyRound) -> (u64, u64)| {
        let (all, whole) = results
            .iter()
            .map(d)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        100.0 * whole as f64 / all.max(1) as f64
    };
    let sp_whole = share(&|r| r.spanprof_depth);
    let ps_whole = share(&|r| r.pyspy_depth);
    let windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof.bpf).collect();
    let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
    let fp_windows: Vec<BpfWindow> = results.iter().filter_map(|r| r.spanprof_fp.bpf).collect();
    let fp_bpf = bpf_figures(&fp_windows).context("no in-kernel statistics were read")?;
    let fp_loop_us = med(&|r| r.spanprof_fp.loop_us);
    let high_windows: Vec<BpfWindow> = high.iter().step_by(2).filter_map(|(r, _)| r.bpf).collect();
    let high_bpf = bpf_figures(&high_windows).context("no in-kernel statistics were read")?;
    let high_fp_windows: Vec<BpfWindow> = high
        .iter()
        .skip(1)
        .step_by(2)
        .filter_map(|(r, _)| r.bpf)
        .collect();
    let high_fp_bpf = bpf_figures(&high_fp_windows).context("no in-kernel statistics were read")?;
    let high_default: Vec<&(SpanprofRun, (u64, u64))> = high.iter().step_by(2).collect();
    let (high_all, high_whole) = high_default
        .iter()
        .fold((0, 0), |a, (_, d)| (a.0 + d.0, a.1 + d.1));
    let high_whole = 100.0 * high_whole as f64 / high_all.max(1) as f64;

    Ok(format!(
        "Run of `cargo xtask bench --rounds {n} --py-work {work}` on {}: target `{PY_FILE}` \
         (CPython {python_version}, {PY_DEPTH} Python frames) alone {alone:.2} s CPU in {alone_wall:.2} s (medians); \
         {sp_samples:.0} samples per spanprof run, {ps_samples:.0} per py-spy run \
         (both at {HZ} Hz; spanprof samples the target's CPU time, py-spy wall-clock time). \
         {pyspy_version} in its default mode, which pauses the target for each sample.\n\n\
         | figure | spanprof | py-spy record | goal |\n\
         |---|---|---|---|\n\
         | target CPU time, profiled / alone (median of {n} interleaved rounds) | {sp_ratio:.4} | {ps_ratio:.4} | ≤ 1.005 |\n\
         | samples holding all {PY_DEPTH} Python frames | {sp_whole:.1}% | {ps_whole:.1}% | |\n\
         | profiler's own CPU per sample, whole process (median) | {sp_us:.1} µs | {ps_us:.1} µs | ≤ 20 µs |\n\
         | spanprof's own CPU per sample in its sampling loop, as it reports it (median) | {sp_loop_us:.1} µs | n/a | |\n\
         | profiler's peak RSS (max) | {:.1} MB | {:.1} MB | ≤ 64 MB |\n\
         | in-kernel time per sampling-program run, all runs while the target ran ({} runs) | {:.2} µs | n/a | |\n\
         | in-kernel time per run for other processes (target blocked, 1 s per run) | {:.2} µs | n/a | |\n\
         | in-kernel time per target sample, all runs charged to the target ({} samples) | {:.2} µs | n/a | |\n\
         | **in-kernel time per target sample**, net of the runs for other processes | **{:.2} µs** | n/a | ≤ 10 µs |\n\
         | the same at {HIGH_HZ} Hz ({HIGH_RUNS} runs, {} samples, {high_whole:.1}% with all {PY_DEPTH} frames) | {:.2} µs | n/a | ≤ 10 µs |\n\
         | the same with `--unwind fp` (frame-pointer walk instead of the {STACK_COPY_BYTES}-byte stack copy: this interpreter has no frame pointers, so its native frames are cut), same rounds, at {HZ} Hz; at {HIGH_HZ} Hz | {:.2} µs; {:.2} µs | n/a | |\n\
         | spanprof's own CPU per sample in its sampling loop with `--unwind fp` (median) | {fp_loop_us:.1} µs | n/a | |\n",
        machine(),
        mb(sp_rss.unwrap_or(0)),
        mb(ps_rss.unwrap_or(0)),
        bpf.runs,
        bpf.per_run_ns / 1000.0,
        bpf.other_run_ns / 1000.0,
        bpf.target_samples,
        bpf.gross_ns / 1000.0,
        bpf.net_ns / 1000.0,
        high_bpf.target_samples,
        high_bpf.net_ns / 1000.0,
        fp_bpf.net_ns / 1000.0,
        high_fp_bpf.net_ns / 1000.0,
    ))
}

/// `bench_py_stack.py` under Debian sid's stripped python3.14 and python3.15 (run by `chroot`
/// into `target/sid-rootfs`, which execs the interpreter: the pid is the interpreter's),
/// spanprof alone at [`HZ`] and [`HIGH_HZ`], `cfg.rounds` runs each: the in-kernel time per
/// target sample, net of the runs for other processes, and the samples holding all
/// [`PY_DEPTH`] frames; the markdown of the figures.
pub(super) fn sid_pythons(
    root: &Path,
    spanprof: &Path,
    out_dir: &Path,
    cfg: &Config,
) -> Result<String> {
    let rootfs = crate::rootfs::ensure(root, &cfg.venv_python)?;
    let inside = PathBuf::from("/tmp/spanprof-bench");
    let host_dir = rootfs.join("tmp/spanprof-bench");
    std::fs::create_dir_all(&host_dir)?;
    std::fs::copy(
        root.join("tests/workloads").join(PY_FILE),
        host_dir.join(PY_FILE),
    )?;
    let mut rows = String::new();
    // The host's interpreter (`--python`, pyenv's 3.12 by default) first, in the same run, as
    // the reference the sid rows compare with.
    let mut targets: Vec<(String, Target)> = Vec::new();
    let host_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    targets.push((
        format!("{host_version} (`{}`, the reference)", cfg.python.display()),
        Target {
            program: cfg.python.clone(),
            args: vec![root.join("tests/workloads").join(PY_FILE).into()],
            env: Vec::new(),
        },
    ));
    for minor in [14u8, 15] {
        let python = format!("/usr/bin/python3.{minor}");
        let out = Command::new("chroot")
            .arg(&rootfs)
            .args([
                python.as_str(),
                "-c",
                "import platform; print(platform.python_version())",
            ])
            .output()
            .context("failed to run chroot")?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        targets.push((
            format!("Debian sid {version} (`{python}`, stripped, in a chroot)"),
            Target {
                program: PathBuf::from("chroot"),
                args: vec![
                    rootfs.clone().into(),
                    python.clone().into(),
                    inside.join(PY_FILE).into(),
                ],
                env: Vec::new(),
            },
        ));
    }
    for (i, (label, target)) in targets.iter().enumerate() {
        let mut cells = Vec::new();
        for hz in [HZ, HIGH_HZ] {
            let folded = out_dir.join(format!("bench_sid_{i}_{hz}.folded"));
            let runs = rounds(&format!("{label} at {hz} Hz"), cfg.rounds, |_| {
                let run = run_spanprof(spanprof, target, cfg.py_work, hz, &[], &folded)?;
                Ok((run, python_depth(&folded)?))
            })?;
            let windows: Vec<BpfWindow> = runs.iter().filter_map(|(r, _)| r.bpf).collect();
            let bpf = bpf_figures(&windows).context("no in-kernel statistics were read")?;
            let (all, whole) = runs.iter().fold((0, 0), |a, (_, d)| (a.0 + d.0, a.1 + d.1));
            cells.push(format!(
                "{:.2} µs ({} samples, {:.1}% with all {PY_DEPTH} frames)",
                bpf.net_ns / 1000.0,
                bpf.target_samples,
                100.0 * whole as f64 / all.max(1) as f64
            ));
        }
        rows.push_str(&format!("| {label} | {} | {} |\n", cells[0], cells[1]));
    }
    let _ = std::fs::remove_dir_all(&host_dir);
    Ok(format!(
        "Run of `cargo xtask bench --only sid --rounds {} --py-work {}` on {}: target `{PY_FILE}` \
         ({PY_DEPTH} Python frames) run by `chroot target/sid-rootfs python3.X`, and by the \
         host's interpreter as the reference, spanprof alone (default `--unwind dwarf`), the \
         interpreters one after the other. In-kernel time per target sample, net of the runs for \
         other processes, over every round:\n\n\
         | interpreter | at {HZ} Hz | at {HIGH_HZ} Hz |\n\
         |---|---|---|\n{rows}",
        cfg.rounds,
        cfg.py_work,
        machine()
    ))
}

/// spanprof's default `--stack-copy`.
const STACK_COPY_BYTES: u32 = 16384;
