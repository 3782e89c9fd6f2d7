//! `spanprof replay` writes what the live session wrote: each golden session
//! ([`golden::SESSIONS`]: native, Python, spans, off-CPU, allocations) is profiled with
//! `--record` and every output format, its recording replayed, and the outputs compared
//! (folded, SVG, speedscope byte for byte; pprof and OTLP decoded). The recording is created
//! with mode 0600.
//!
//! With `SPANPROF_GOLDEN_RECORD=1` (`cargo xtask golden`), the recordings and outputs replace
//! the committed ones in `tests/golden/`.

use spanprof_tests::golden::{
    self, compare_outputs, copy_files, golden_root, record_command, replay, OUTPUTS, RECORDING,
};
use spanprof_tests::{
    assert_private_output, profiling_lock, require_profiling, run_with_timeout, TempDir,
    RUN_TIMEOUT,
};

fn session(name: &str) {
    require_profiling();
    let _lock = profiling_lock();
    let live = TempDir::new(&format!("replay-live-{name}"));
    let out = run_with_timeout(record_command(name, live.path()), RUN_TIMEOUT);
    out.assert_success();
    assert!(out.stderr.contains("(recording)"), "{out}");
    assert_private_output(&live.join(RECORDING));
    let replayed = TempDir::new(&format!("replay-of-{name}"));
    replay(&live.join(RECORDING), replayed.path());
    let problems = compare_outputs(live.path(), replayed.path());
    assert!(
        problems.is_empty(),
        "the replay of {name} differs from its live session:\n{}",
        problems.join("\n")
    );
    if std::env::var_os("SPANPROF_GOLDEN_RECORD").is_some_and(|v| v == "1") {
        let mut files = vec![RECORDING];
        files.extend(OUTPUTS);
        copy_files(live.path(), &golden_root().join(name), &files);
        eprintln!("recorded {}", golden_root().join(name).display());
    }
}

#[test]
fn native() {
    session(golden::SESSIONS[0]);
}

#[test]
fn python() {
    session(golden::SESSIONS[1]);
}

#[test]
fn spans() {
    session(golden::SESSIONS[2]);
}

#[test]
fn offcpu() {
    session(golden::SESSIONS[3]);
}

#[test]
fn alloc() {
    session(golden::SESSIONS[4]);
}
