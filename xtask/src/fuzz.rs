//! `cargo xtask fuzz`: builds the fuzz targets of `fuzz/` with libFuzzer's coverage
//! instrumentation on stable Rust and runs each for a bounded time from its committed seeds.
//!
//! The flags are cargo-fuzz's with `--sanitizer none` (which needs no nightly): SanitizerCoverage
//! through LLVM passes, and the fuzz profile's overflow checks and debug assertions. `--target`
//! is given so that the flags reach only the target's code, not build scripts and proc macros.
//! A run ends at the time limit or at the first crash, which libFuzzer writes as an artifact;
//! the crash fails the task with the target, the artifact and the log named. Fixed crashes are
//! kept as regression cases beside the seeds in `fuzz/corpus/<target>/`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::cache;
use crate::run::{cargo, step};

/// Every fuzz target (`fuzz/Cargo.toml`'s binaries).
pub const TARGETS: [&str; 8] = [
    "pprof_profile",
    "folded_profile",
    "otlp_profile",
    "otel_process_ctx",
    "otel_thread_ctx_elf",
    "python_line_table",
    "python_memory",
    "recording",
];

/// Seconds each target runs in `cargo xtask test`.
pub const TEST_SECONDS: u64 = 20;

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

const RUSTFLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing";

/// Builds the targets in the cache's `fuzz-target` (`cache.rs`), else in `target/fuzz`, and
/// copies the binaries to `target/fuzz/bin`, which it returns.
pub fn build(root: &Path) -> Result<PathBuf> {
    step("building the fuzz targets (libFuzzer, coverage instrumentation, stable Rust)");
    // NB: the cache's target directory keeps the instrumented dependencies of every checkout;
    // its `release/` holds the binaries of the last build, whichever checkout's, so they are
    // copied out before another build can replace them.
    let _lock = cache::lock("fuzz-target");
    let target_dir = cache::target_dir("fuzz-target", root.join("target/fuzz"));
    cargo(root)
        .args([
            "build",
            "--release",
            "--locked",
            "--bins",
            "--target",
            TRIPLE,
        ])
        .arg("--manifest-path")
        .arg(root.join("fuzz/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", RUSTFLAGS)
        .run()?;
    let built = target_dir.join(TRIPLE).join("release");
    let bins = root.join("target/fuzz/bin");
    std::fs::create_dir_all(&bins).with_context(|| format!("creating {}", bins.display()))?;
    for target in TARGETS {
        let (from, to) = (built.join(target), bins.join(target));
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(bins)
}

/// How many fuzz targets run at once (one a CPU of CI's two).
const AT_ONCE: usize = 2;

/// Runs each of `targets` for `seconds` from its seeds, [`AT_ONCE`] at a time; fails naming
/// every target that crashed, hung or ran out of memory.
pub fn run(root: &Path, bins: &Path, targets: &[&str], seconds: u64) -> Result<()> {
    let mut failed = Vec::new();
    for batch in targets.chunks(AT_ONCE) {
        let mut running = Vec::new();
        for &target in batch {
            match start(root, bins, target, seconds) {
                Ok(child) => running.push((target, child)),
                // NB: counted as failed, and the others still run.
                Err(err) => {
                    eprintln!("xtask: {err:#}");
                    failed.push(target);
                }
            }
        }
        for (target, (mut child, log, artifacts)) in running {
            let status = child
                .wait()
                .with_context(|| format!("failed to wait for the fuzz target {target}"))?;
            if !report(target, status, &log, &artifacts) {
                failed.push(target);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("fuzz targets failed: {}", failed.join(", "))
    }
}

/// Starts the fuzz target `target` for `seconds` from its seeds: its process, its log and its
/// artifacts' directory.
fn start(
    root: &Path,
    bins: &Path,
    target: &str,
    seconds: u64,
) -> Result<(std::process::Child, PathBuf, PathBuf)> {
    let seeds = root.join("fuzz/corpus").join(target);
    let work = root.join("target/fuzz/corpus").join(target);
    let artifacts = root.join("target/fuzz/artifacts").join(target);
    let log = root.join("target/fuzz/logs").join(format!("{target}.log"));
    for dir in [&work, &artifacts, &seeds] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
    }
    std::fs::create_dir_all(log.parent().expect("the log has a directory"))?;
    let seed_count = std::fs::read_dir(&seeds)?.count();
    if seed_count == 0 {
        bail!("{}: no seeds", seeds.display());
    }
    step(&format!(
        "fuzzing {target} for {seconds} s from {seed_count} seeds (log: {})",
        log.display()
    ));
    let out = File::create(&log).with_context(|| format!("failed to create {}", log.display()))?;
    // NB: libFuzzer adds what it finds to the first directory only: the seeds stay as
    // committed.
    let child = Command::new(bins.join(target))
        .arg(format!("-max_total_time={seconds}"))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&work)
        .arg(&seeds)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("failed to start the fuzz target {target}"))?;
    Ok((child, log, artifacts))
}

/// Says how the fuzz target `target` ended (its runs and coverage, or its log's end);
/// whether it passed.
fn report(target: &str, status: std::process::ExitStatus, log: &Path, artifacts: &Path) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let runs = text
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .map_or("?".to_string(), |n| n.trim().to_string());
    let coverage = text
        .lines()
        .rev()
        .find(|l| l.contains(" cov: "))
        .and_then(|l| l.split(" cov: ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("?");
    if status.success() {
        step(&format!(
            "{target}: {runs} runs, coverage {coverage} edges, no crash"
        ));
        return true;
    }
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    eprintln!(
        "xtask: {target} failed ({status}); artifacts in {}; end of its log:",
        artifacts.display()
    );
    for line in tail.into_iter().rev() {
        eprintln!("  {line}");
    }
    false
}

/// `fuzz [--seconds N] [TARGET…]`.
pub fn task(root: &Path, args: &[String]) -> Result<()> {
    let mut seconds = 60;
    let mut targets: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                let value = it.next().context("`--seconds` needs a value")?;
                seconds = value
                    .parse()
                    .ok()
                    .filter(|&s| (1..=86_400).contains(&s))
                    .with_context(|| format!("invalid --seconds `{value}` (1 to 86400)"))?;
            }
            name => match TARGETS.iter().find(|&&t| t == name) {
                Some(&t) => targets.push(t),
                None => bail!(
                    "unknown fuzz target `{name}` (one of {})",
                    TARGETS.join(", ")
                ),
            },
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let bins = build(root)?;
    run(root, &bins, &targets, seconds)
}
