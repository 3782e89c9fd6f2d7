//! The dump part (`bench-dump` block): how long `spanprof dump` takes to answer, beside
//! `py-spy dump`, on one Python process of 11 threads (`py_idle_threads.py`: the main thread in
//! `time.sleep`, ten threads waiting on an Event), each tool run `--rounds` times, their order
//! alternating, after one run of each to warm the caches. A run's figure is its wall time, from
//! the command's start to its exit: what an SRE waits for.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::measure::{lowest_highest, machine, median, rounds, version};
use super::Config;

/// The workload, from `tests/workloads`.
const WORKLOAD: &str = "py_idle_threads.py";

/// Wall seconds of one run of `program args…`, which must succeed.
fn timed(program: &Path, args: &[&str]) -> Result<f64> {
    let start = Instant::now();
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("failed to run {}", program.display()))?;
    let wall = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "{} {} failed ({}):\n{}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(wall)
}

/// spanprof dump and py-spy dump of the same process; the markdown of the figures.
pub(super) fn dump(root: &Path, spanprof: &Path, cfg: &Config) -> Result<String> {
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    let pyspy_version = version(&cfg.py_spy, &["--version"])?;
    let mut target = Command::new(&cfg.python)
        .arg(root.join("tests/workloads").join(WORKLOAD))
        .arg("3600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {WORKLOAD}"))?;
    // Killed however the part ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = target.stderr.take().expect("piped");
    let target = Kill(target);
    let mut ready = String::new();
    BufReader::new(stderr)
        .read_line(&mut ready)
        .context("reading the workload's ready line")?;
    if !ready.starts_with("ready ") {
        bail!("{WORKLOAD} did not start: {ready:?}");
    }
    let pid = target.0.id().to_string();
    let spanprof_args = ["dump", "--pid", pid.as_str()];
    let pyspy_args = ["dump", "--pid", pid.as_str()];
    // Warm: the first run of each reads the interpreter's files cold.
    timed(spanprof, &spanprof_args)?;
    timed(&cfg.py_spy, &pyspy_args)?;
    let n = cfg.rounds;
    let results = rounds("dump", n, |i| {
        let (sp, ps) = if i % 2 == 0 {
            let sp = timed(spanprof, &spanprof_args)?;
            (sp, timed(&cfg.py_spy, &pyspy_args)?)
        } else {
            let ps = timed(&cfg.py_spy, &pyspy_args)?;
            (timed(spanprof, &spanprof_args)?, ps)
        };
        Ok((sp, ps))
    })?;
    drop(target);
    let sp: Vec<f64> = results.iter().map(|r| r.0).collect();
    let ps: Vec<f64> = results.iter().map(|r| r.1).collect();
    let ratios: Vec<f64> = results.iter().map(|r| r.0 / r.1).collect();
    let (sp_lo, sp_hi) = lowest_highest(&sp);
    let (ps_lo, ps_hi) = lowest_highest(&ps);
    let (r_lo, r_hi) = lowest_highest(&ratios);
    Ok(format!(
        "Run of `cargo xtask bench --only dump --rounds {n}` on {}: target `{WORKLOAD}` (Python \
         {python_version}, 11 threads, all waiting), `spanprof dump --pid` and `{pyspy_version} \
         dump --pid` in turn, after one warm-up run of each.\n\n\
         | figure | spanprof dump | py-spy dump | goal |\n\
         |---|---|---|---|\n\
         | **wall time of a dump**, median (min to max) of {n} runs | **{:.2} s** ({sp_lo:.2} to {sp_hi:.2}) | {:.2} s ({ps_lo:.2} to {ps_hi:.2}) | ≤ 0.3 s |\n\
         | spanprof / py-spy, median of the per-round ratios (min to max) | {:.1}× ({r_lo:.1} to {r_hi:.1}) | | |\n",
        machine(),
        median(sp),
        median(ps),
        median(ratios),
    ))
}
