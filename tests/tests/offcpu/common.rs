//! What every off-CPU test here uses: the sampling rate and reasons, the interpreters under
//! test and the prerequisites.

use std::path::PathBuf;

use spanprof_tests::{pyenv_python, require_root, spanprof_bin, system_python};

/// Sampling rate of every session here: a 2 ms period, for on-CPU figures within a few %.
pub(super) const FREQUENCY: u32 = 499;

/// Rounds of each workload.
pub(super) const ROUNDS: u32 = 5;

/// The reasons spanprof names.
pub(super) const REASONS: [&str; 6] = ["sleep", "lock", "io", "gil", "asyncio_idle", "other"];

/// The label of an off-CPU sample's reason.
pub(super) const REASON_LABEL: &str = "off_cpu.reason";

/// A CPython interpreter under test.
pub(super) struct Interp {
    pub(super) path: PathBuf,
    pub(super) label: String,
    /// Run by `chroot` into this Debian sid rootfs (`path` is the rootfs's).
    pub(super) chroot: Option<PathBuf>,
}

impl Interp {
    #[track_caller]
    pub(super) fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self {
            path,
            label,
            chroot: None,
        }
    }

    /// Debian sid's stripped python3.`minor`, in a chroot of the rootfs.
    #[track_caller]
    pub(super) fn sid_chroot(minor: u8) -> Self {
        Self {
            path: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            label: format!("Debian sid python3.{minor} in a chroot"),
            chroot: Some(spanprof_tests::rootfs::rootfs()),
        }
    }

    #[track_caller]
    pub(super) fn debian_3_11() -> Self {
        Self {
            path: system_python("/usr/bin/python3.11", "python3.11"),
            label: "Debian /usr/bin/python3.11".into(),
            chroot: None,
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
pub(super) fn require_offcpu_profiling() {
    require_root();
    spanprof_bin();
}

/// The pseudo-frame at the root of an off-CPU stack.
pub(super) fn reason_frame(reason: &str) -> String {
    format!("[off-cpu: {reason}]")
}

pub(super) fn ms(ns: f64) -> f64 {
    ns / 1e6
}
