//! The profile and its files: what `spanprof` has measured once the pipeline is done, and every
//! format it is written in and read back from.
//!
//! # Overview
//! - [`profile`]: the model ([`profile::Profile`]: samples of interned frames with their
//!   thread, span context, unwind status and off-CPU reason; the run's metadata), and the
//!   transformations every output shares (grouping by span, retaining samples).
//! - [`format`](mod@format): one module per format, each reading and writing it (pprof, OTLP, folded
//!   stacks; SVG flame graphs and speedscope are written only).
//! - [`wording`]: what every output, the summary and the reports say, in one place.
//! - [`privacy`]: path redaction and label dropping before a profile is written or exported.
//! - [`resource`]: who the samples belong to (the OpenTelemetry resource of processes and host).
//! - [`write`](mod@write): putting output files in place atomically with mode 0600.
//!
//! Nothing here loads eBPF or reads a live process's stacks: the crate builds without clang and
//! runs without privileges, which the fuzz targets of `fuzz/` rely on.
pub mod format;
pub mod privacy;
pub mod profile;
pub mod resource;
pub mod wording;
pub mod write;
