//! What every allocation test here uses: the rates and sample types, the interpreters under
//! test and the prerequisites.

use std::path::PathBuf;

use spanprof_tests::{pyenv_python, require_root, spanprof_bin, system_python};

/// The default `--alloc-rate`: one sample per 512 KiB allocated on average.
pub(super) const DEFAULT_RATE: u64 = 524_288;

/// A bound must be at least this many σ of the estimate it bounds.
pub(super) const MIN_SIGMAS: f64 = 4.5;

/// The sample types of each kind of memory profile (Go's order when both).
pub(super) const ALLOC_TYPES: [&str; 2] = ["alloc_objects/count", "alloc_space/bytes"];

pub(super) const HEAP_TYPES: [&str; 2] = ["inuse_objects/count", "inuse_space/bytes"];

pub(super) const BOTH_TYPES: [&str; 4] = [
    "alloc_objects/count",
    "alloc_space/bytes",
    "inuse_objects/count",
    "inuse_space/bytes",
];

/// A CPython interpreter under test.
pub(super) struct Interp {
    pub(super) path: PathBuf,
    pub(super) minor: u8,
    pub(super) label: String,
}

impl Interp {
    #[track_caller]
    pub(super) fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self { path, minor, label }
    }

    #[track_caller]
    pub(super) fn debian_3_11() -> Self {
        Self {
            path: system_python("/usr/bin/python3.11", "python3.11"),
            minor: 11,
            label: "Debian /usr/bin/python3.11".into(),
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
pub(super) fn require_alloc_profiling() {
    require_root();
    spanprof_bin();
}

pub(super) fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}
