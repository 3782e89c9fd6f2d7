//! `cargo xtask demo`: spanprof's first impression. A small Python service traced with
//! OpenTelemetry (`examples/demo/service.py`: three endpoints, each request in a span named
//! after it) is profiled with no change to its code; the flame graph has one tower per
//! endpoint (`--group-by span-name`) and the report names the service's Python functions.
//! `cargo xtask test` makes the same files in `target/demo`, which `tests/tests/demo.rs` checks.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::deps::{pyenv_python, Env};
use crate::run::{step, Cmd};

/// CPU seconds the service runs for.
const SECONDS: &str = "4";

/// What the demo wrote.
pub struct Demo {
    pub svg: PathBuf,
    pub pprof: PathBuf,
    /// spanprof's end-of-session summary (its stderr), also in `demo-summary.txt`.
    pub summary: String,
    /// `spanprof report demo.pb.gz --top 10`, also in `demo-report.txt`.
    pub report: String,
}

/// The pyenv CPython with tracing libraries installed by `deps` (3.11 first), and their
/// directory.
fn python(env: &Env) -> Result<(PathBuf, PathBuf)> {
    for minor in [11, 12, 13, 10, 9, 8] {
        let libs = env.span_libs.join(format!("3.{minor}"));
        if let (Some(python), true) = (pyenv_python(minor), libs.is_dir()) {
            return Ok((python, libs));
        }
    }
    bail!(
        "no pyenv CPython 3.8-3.13 with its tracing libraries in {}: run `cargo xtask deps`",
        env.span_libs.display()
    )
}

/// Profiles the demo service with `bin` into `dir` (demo.svg, demo.pb.gz, demo-summary.txt,
/// demo-report.txt).
pub fn run(root: &Path, bin: &Path, env: &Env, dir: &Path) -> Result<Demo> {
    let (python, libs) = python(env)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let svg = dir.join("demo.svg");
    let pprof = dir.join("demo.pb.gz");
    step(&format!(
        "profiling examples/demo/service.py ({}) for {SECONDS} s of its CPU time",
        python.display()
    ));
    let out = Cmd::new(bin)
        .current_dir(root)
        .env("PYTHONPATH", &libs)
        .args(["profile", "-F", "499", "--group-by", "span-name", "-o"])
        .arg(&svg)
        .arg("-o")
        .arg(&pprof)
        .arg("--")
        .arg(&python)
        .arg(root.join("examples/demo/service.py"))
        .arg(SECONDS)
        .output()?;
    let summary = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!("the demo profile failed ({}):\n{summary}", out.status);
    }
    let out = Cmd::new(bin)
        .args(["report", "--top", "10"])
        .arg(&pprof)
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "spanprof report failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(dir.join("demo-summary.txt"), &summary)?;
    std::fs::write(dir.join("demo-report.txt"), &report)?;
    Ok(Demo {
        svg,
        pprof,
        summary,
        report,
    })
}
