//! Where the tests find what they run (the spanprof binary, the workloads, the venv's
//! interpreter, Chromium), the prerequisites they check, and the lock that keeps sampling
//! tests from competing for the CPUs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// The workspace root (the parent of this crate), from the `CARGO_MANIFEST_DIR` that `cargo
/// test` gives the running test, else the one it was built with: `cargo xtask test` shares its
/// build directory between clones, and a test binary built in one clone and found fresh in
/// another must read the files (and run the spanprof) of the clone it runs in.
pub fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// True when running in CI (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Fails the test with a message about a missing prerequisite. Missing
/// prerequisites are failures everywhere; in CI the message says the CI
/// machine itself is broken.
#[track_caller]
pub fn missing_prerequisite(what: &str, fix: &str) -> ! {
    let context = if in_ci() {
        "CI=true: the CI run must provide this; failing instead of skipping"
    } else {
        "failing instead of skipping"
    };
    panic!("spanprof integration test prerequisite missing: {what}\n  fix: {fix}\n  ({context})");
}

pub(crate) fn path_from_env(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => workspace_root().join(fallback),
    }
}

/// `target/demo` (or `$SPANPROF_DEMO`): what `cargo xtask demo`'s run in `cargo xtask test`
/// wrote; the file `name` of it (a missing one fails the test).
pub fn demo_file(name: &str) -> PathBuf {
    let file = path_from_env("SPANPROF_DEMO", "target/demo").join(name);
    if !file.is_file() {
        missing_prerequisite(
            &format!("the demo's {}", file.display()),
            "`cargo xtask test` runs the demo into target/demo before the tests",
        );
    }
    file
}

/// `target/dist` (or `$SPANPROF_DIST`): the tarball and package `cargo xtask dist` made; the
/// file of it whose name ends in `suffix` (a missing one fails the test).
pub fn dist_file(suffix: &str) -> PathBuf {
    let dir = path_from_env("SPANPROF_DIST", "target/dist");
    let found = std::fs::read_dir(&dir).ok().and_then(|entries| {
        entries
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_str().is_some_and(|n| n.ends_with(suffix)))
    });
    found.unwrap_or_else(|| {
        missing_prerequisite(
            &format!("a *{suffix} in {}", dir.display()),
            "run `cargo xtask dist`",
        )
    })
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails unless running as root: loading eBPF needs CAP_BPF and CAP_PERFMON.
#[track_caller]
pub fn require_root() {
    if !is_root() {
        missing_prerequisite(
            "root (the tests load eBPF programs and drop privileges with setpriv)",
            "run the tests as root: `cargo xtask test` as root",
        );
    }
}

/// The spanprof binary: `SPANPROF_BIN`, else `target/release/spanprof`.
#[track_caller]
pub fn spanprof_bin() -> PathBuf {
    let bin = path_from_env("SPANPROF_BIN", "target/release/spanprof");
    if !bin.is_file() {
        missing_prerequisite(
            &format!("the spanprof binary at {}", bin.display()),
            "`cargo build --release -p spanprof`, or `cargo xtask test` which builds it",
        );
    }
    bin
}

/// Google's pprof built from Debian's source: `SPANPROF_GOOGLE_PPROF`, else
/// `target/tools/pprof` (both made by `cargo xtask deps`).
#[track_caller]
pub fn google_pprof() -> PathBuf {
    let bin = path_from_env("SPANPROF_GOOGLE_PPROF", "target/tools/pprof");
    if !bin.is_file() {
        missing_prerequisite(
            &format!("Google's pprof at {}", bin.display()),
            "`cargo xtask deps` (builds it from Debian's golang-github-google-pprof-dev)",
        );
    }
    bin
}

/// The directory of the built workloads: `SPANPROF_WORKLOADS`, else `target/workloads`.
pub fn workloads_dir() -> PathBuf {
    path_from_env("SPANPROF_WORKLOADS", "target/workloads")
}

/// The path of one built workload (`cpu_split`, `syscall_heavy`, `forker`).
#[track_caller]
pub fn workload_path(name: &str) -> PathBuf {
    let path = workloads_dir().join(name);
    if !path.is_file() {
        missing_prerequisite(
            &format!("the workload {}", path.display()),
            "`cargo xtask workloads` (or `cargo xtask test`)",
        );
    }
    path
}

/// The Python with `protobuf` and `grpcio-tools`: `SPANPROF_PYTHON`, else `target/venv/bin/python`.
#[track_caller]
pub fn python() -> PathBuf {
    let python = path_from_env("SPANPROF_PYTHON", "target/venv/bin/python");
    if !python.is_file() {
        missing_prerequisite(
            &format!("the Python venv interpreter {}", python.display()),
            "`cargo xtask deps` (creates target/venv with protobuf and grpcio-tools)",
        );
    }
    python
}

/// Checks everything a test that runs spanprof against a workload needs.
#[track_caller]
pub fn require_profiling() {
    require_root();
    spanprof_bin();
    for name in ["cpu_split", "syscall_heavy", "forker"] {
        workload_path(name);
    }
}

static PROFILING: Mutex<()> = Mutex::new(());

/// Serializes the tests of one test binary that sample (cargo runs test
/// binaries one after another, and the tests inside one in parallel threads).
pub fn profiling_lock() -> MutexGuard<'static, ()> {
    PROFILING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Debian's Chromium; a missing prerequisite without it.
pub fn chromium() -> &'static str {
    let path = "/usr/bin/chromium";
    if !Path::new(path).is_file() {
        missing_prerequisite(
            "Debian's chromium (/usr/bin/chromium)",
            "`cargo xtask deps` as root",
        );
    }
    path
}

/// A headless Chromium command with its profile in `profile_dir`, no network chatter and no
/// sandbox (the tests run as root).
pub fn chromium_command(profile_dir: &Path) -> Command {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile_dir.display()));
    cmd
}
