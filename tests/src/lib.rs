//! Helpers for spanprof's integration tests, which run the real `spanprof`
//! binary as root against the bundled C workloads in `tests/workloads/`.
//!
//! Overview: `cargo xtask test` builds the binary (`SPANPROF_BIN`), the
//! workloads (`SPANPROF_WORKLOADS`) and a Python venv with `protobuf`
//! (`SPANPROF_PYTHON`) for the independent pprof decoder
//! `tests/tools/decode_pprof.py`, then runs `cargo test`. Without those
//! variables the helpers fall back to the paths under `target/`. The Python
//! tests also use py-spy from that venv (`SPANPROF_PYSPY`) and the CPython
//! builds of pyenv (`PYENV_ROOT`, default `/root/.pyenv`).
//!
//! Design constraints: a test whose prerequisites are missing (not root, no
//! binary, no workloads) fails with a message saying what is missing and how
//! to get it; it never passes by skipping. Tests that sample take
//! [`profiling_lock`] so that two sessions in one test binary do not compete
//! for the machine's two CPUs.
//!
//! The helpers are grouped by job and re-exported here, so a test imports them
//! from the crate root: `env` (where things are, prerequisites, the profiling
//! lock), `process` (temporary directories, workloads, spanprof runs, processes
//! in the background), `output` (the summary, pprof through the decoder, SVG
//! titles, file modes), `folded` (folded stacks), `python` (interpreters,
//! py-spy, Python workloads and frames), `spans` (the tracing libraries and the
//! `spans:` line) and `unwind` (`--stats`, the workloads without frame
//! pointers); `daemon`, `golden`, `otlp` and `rootfs` are used by their paths.

/// A `Vec<OsString>` of command-line arguments from anything string- or path-like:
/// `args!["profile", "--pid", pid.to_string(), "-o", &path]`.
#[macro_export]
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        vec![$(::std::ffi::OsString::from(
            ::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$arg),
        )),*]
    };
}

pub mod daemon;
mod env;
mod folded;
pub mod golden;
pub mod otlp;
mod output;
mod process;
mod python;
pub mod rootfs;
mod spans;
mod unwind;

pub use env::*;
pub use folded::*;
pub use output::*;
pub use process::*;
pub use python::*;
pub use spans::*;
pub use unwind::*;
