//! What every span test here uses: the workload and the bounds, the label keys, the
//! interpreters under test (pyenv's, Debian's, sid's in a container) and the prerequisites.

use std::path::PathBuf;

use spanprof_tests::rootfs::rootfs;
use spanprof_tests::{
    pyenv_python, require_root, require_span_libs, span_libs, spanprof_bin, system_python,
};

/// The workload of every test here.
pub(super) const WORKLOAD: &str = "py_span_workload.py";

/// Sampling frequency of the sessions.
pub(super) const FREQUENCY: u32 = 199;

/// At least this share (weighted) of the samples in a span must carry exactly its ids.
pub(super) const MIN_RIGHT: f64 = 0.98;

/// At most this share of the samples outside any span may carry span ids.
pub(super) const MAX_OUTSIDE_LABELLED: f64 = 0.01;

/// Samples needed for the shares to mean something.
pub(super) const MIN_SPAN_SAMPLES: i64 = 100;

pub(super) const MIN_OUTSIDE_SAMPLES: i64 = 30;

/// With the publisher installed, at least this share of the samples with span labels must have
/// been read from the thread context the process publishes.
pub(super) const MIN_PUBLISHED: f64 = 0.98;

pub(super) const OTEL_KEYS: [&str; 2] = ["trace_id", "span_id"];

pub(super) const OSPROFILER_KEYS: [&str; 3] = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
];

/// The ids and the name, where names are read (the span contexts read from the interpreter).
pub(super) const OTEL_NAMED_KEYS: [&str; 3] = ["trace_id", "span_id", SPAN_NAME];

pub(super) const OSPROFILER_NAMED_KEYS: [&str; 4] = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
    OSP_NAME,
];

/// Name labels, and what spanprof keeps of a name: at most this many bytes, of ASCII only.
pub(super) const SPAN_NAME: &str = "span.name";

pub(super) const OSP_NAME: &str = "osprofiler.name";

pub(super) const NAME_MAX: usize = 64;

/// A CPython interpreter under test and its tracing libraries.
pub(super) struct Interp {
    pub(super) path: PathBuf,
    pub(super) libs: PathBuf,
    pub(super) label: String,
    /// Run in a container of the Debian sid rootfs: `path` and `libs` are its paths.
    pub(super) container: bool,
}

impl Interp {
    #[track_caller]
    pub(super) fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let libs = span_libs(minor);
        let label = format!("pyenv {}", path.display());
        Self {
            path,
            libs,
            label,
            container: false,
        }
    }

    /// Debian sid's python3.`minor` in a container (`tests/src/rootfs.rs`), with the libraries
    /// `cargo xtask rootfs` installs in its `/opt/span-libs/3.X`.
    pub(super) fn sid_container(minor: u8) -> Self {
        Self {
            path: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            libs: PathBuf::from(format!("/opt/span-libs/3.{minor}")),
            label: format!("Debian sid python3.{minor} in a container"),
            container: true,
        }
    }

    /// Debian's python3.11 with the libraries pip installed for pyenv's 3.11 (same ABI).
    #[track_caller]
    pub(super) fn debian_3_11() -> Self {
        let path = system_python("/usr/bin/python3.11", "python3.11");
        Self {
            path,
            libs: span_libs(11),
            label: "Debian /usr/bin/python3.11".into(),
            container: false,
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
pub(super) fn require_span_profiling(interp: &Interp) {
    require_root();
    spanprof_bin();
    if interp.container {
        // The workload's import of the libraries fails it otherwise.
        rootfs();
    } else {
        require_span_libs(&interp.path, &interp.libs);
    }
}
