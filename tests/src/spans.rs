//! Trace correlation: the tracing libraries (OpenTelemetry's SDK, OSProfiler) the span
//! workloads import, the workloads run with them, the summary's `spans:` line, and the
//! `spanprof-context` package.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{
    missing_prerequisite, path_from_env, py_workload_source, run_with_timeout, start_ready,
    workspace_root, Background,
};

/// What a span workload imports, checked before it runs.
const SPAN_LIBS_PROBE: &str =
    "import opentelemetry.sdk.trace, opentelemetry.trace, osprofiler.profiler";

/// The directory of the tracing libraries for CPython 3.`minor`:
/// `<SPANPROF_SPAN_LIBS>/3.<minor>`, else `target/span-libs/3.<minor>`
/// (`cargo xtask deps` fills it with `pip install --target`).
#[track_caller]
pub fn span_libs(minor: u8) -> PathBuf {
    let dir = path_from_env("SPANPROF_SPAN_LIBS", "target/span-libs").join(format!("3.{minor}"));
    if !dir.join("spanprof-stamp").is_file() {
        missing_prerequisite(
            &format!(
                "the tracing libraries (opentelemetry-sdk, osprofiler) for CPython 3.{minor} in {}",
                dir.display()
            ),
            "`cargo xtask deps` (pip-installs them per pyenv CPython into target/span-libs/3.X)",
        );
    }
    dir
}

/// Fails unless `python` imports OpenTelemetry's SDK and OSProfiler from `libs`.
#[track_caller]
pub fn require_span_libs(python: &Path, libs: &Path) {
    let mut cmd = Command::new(python);
    cmd.args(["-c", SPAN_LIBS_PROBE])
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "{} cannot import the tracing libraries from {}:\n{out}",
                python.display(),
                libs.display()
            ),
            "`cargo xtask deps` (reinstalls target/span-libs/3.X when its import check fails)",
        );
    }
}

/// Fails unless `python` imports eventlet, gevent and greenlet from `libs` (`cargo xtask deps`
/// installs them for CPython 3.11 and 3.13).
#[track_caller]
pub fn require_green_libs(python: &Path, libs: &Path) {
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "import eventlet.corolocal, gevent.local, greenlet._greenlet",
    ])
    .env("PYTHONPATH", libs)
    .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "{} cannot import eventlet, gevent and greenlet from {}:\n{out}",
                python.display(),
                libs.display()
            ),
            "`cargo xtask deps` (installs them into target/span-libs/3.11 and 3.13)",
        );
    }
}

/// Like [`start_py_workload`], with `PYTHONPATH=libs` (and no user site-packages): a span
/// workload that imports the tracing libraries.
#[track_caller]
pub fn start_py_workload_with_libs(
    python: &Path,
    libs: &Path,
    script: &str,
    args: &[&str],
) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script))
        .args(args)
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    start_ready(cmd, script)
}

/// The `spans: …` line of spanprof's end-of-session summary, if any.
pub fn spans_summary_line(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.starts_with("spans: "))
}

/// The number of samples whose span context spanprof read from the thread context the process
/// publishes (OTEP 4947): the `N` of the `spans:` line's ending
/// `; N read from the thread context the process publishes`, 0 when the line has no such
/// ending; `Err` when there is no `spans:` line or `N` is not a number.
pub fn published_span_samples(stderr: &str) -> Result<u64, String> {
    const ENDING: &str = " read from the thread context the process publishes";
    let line = spans_summary_line(stderr).ok_or("no `spans: …` line in the summary")?;
    let Some(rest) = line.strip_suffix(ENDING) else {
        return Ok(0);
    };
    let (_, n) = rest
        .rsplit_once("; ")
        .ok_or_else(|| format!("spans line {line:?}: no `; N` before {ENDING:?}"))?;
    n.parse()
        .map_err(|_| format!("spans line {line:?}: {n:?} is not a number"))
}

/// The `spanprof-context` package's source (`python/spanprof-context`), the opt-in publisher of
/// the OTEP 4947/4719 contexts (`cargo xtask deps` installs it into `target/span-libs/3.X`).
pub fn spanprof_context_dir() -> PathBuf {
    workspace_root().join("python/spanprof-context")
}

/// Fails unless `python` imports `spanprof_context` and its C extension from `libs`.
#[track_caller]
pub fn require_spanprof_context(python: &Path, libs: &Path) {
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import spanprof_context, spanprof_context._native"])
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "{} cannot import spanprof_context (python/spanprof-context) from {}:\n{out}",
                python.display(),
                libs.display()
            ),
            "`cargo xtask deps` (builds and installs it into target/span-libs/3.X)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_published_span_count() {
        let with =
            "spanprof: 990 samples, 0 lost, from 1 process in 5.0 s at 199 Hz: pid 7 (python3)\n\
                    spans: 700 of 990 samples in 120 OpenTelemetry spans (80 traces), 0 in \
                    OSProfiler traces; 695 read from the thread context the process publishes\n";
        assert_eq!(published_span_samples(with), Ok(695));
        let without = "spans: 3 of 9 samples in 1 OpenTelemetry span (1 trace), 6 in 2 \
                       OSProfiler traces (4 trace points)\n";
        assert_eq!(published_span_samples(without), Ok(0));
        assert!(published_span_samples("spanprof: 9 samples, 0 lost, from 1 process").is_err());
        assert!(published_span_samples(
            "spans: 1 of 2 samples in 1 OpenTelemetry span (1 trace), 0 in OSProfiler traces; \
             x read from the thread context the process publishes"
        )
        .is_err());
    }
}
