//! Output sinks: turn one aggregated [`Profile`] into the bytes of a file format.
//!
//! # Overview
//!
//! Every sink reads the same [`Profile`] and renders to memory; the caller picks the [`Format`]
//! (from a `--format` name or the output file's extension) and writes the bytes atomically.
//! Rendering is deterministic: the same profile gives the same bytes, so outputs can be diffed, and
//! the tests compare a re-rendered profile with the session's own output byte for byte.
//!
//! | Format | Extension | Value and unit |
//! |--------|-----------|----------------|
//! | [`Format::Folded`] | `.folded` | [`Profile::weight`] per stack: samples, nanoseconds or bytes |
//! | [`Format::Svg`] | `.svg` | the same (frame width) |
//! | [`Format::Pprof`] | `.pb.gz`, `.pprof` | by events (below), period `cpu/nanoseconds` (`space/bytes` for memory) |
//! | [`Format::Speedscope`] | `.speedscope.json` | weight in `nanoseconds` (CPU, off-CPU or both), or `bytes` |
//!
//! What a weight is depends on what was profiled ([`Events`], `--event`): a plain on-CPU profile
//! counts samples (each worth `1e9 / frequency` ns of CPU); as soon as off-CPU time is in it,
//! every weight is nanoseconds, an on-CPU sample counting `count * period` and an off-CPU one its
//! blocked time ([`Profile::weight`]). pprof keeps them apart in its sample types:
//!
//! | `--event` | pprof sample types | on-CPU sample | off-CPU sample |
//! |-----------|--------------------|---------------|----------------|
//! | `cpu` (default) | `samples/count` | `[n]` | (none) |
//! | `offcpu` | `off_cpu/nanoseconds` | (none) | `[ns]` |
//! | `cpu,offcpu` | `samples/count`, `cpu/nanoseconds`, `off_cpu/nanoseconds` | `[n, n * period, 0]` | `[0, 0, ns]` |
//! | `wall` | `wall/nanoseconds` | `[n * period]` | `[ns]` |
//!
//! Memory profiles (`--event alloc`, `heap`, or both; never with time events) weigh stacks in
//! bytes, estimated from the sampled allocations ([`Sample::alloc`](crate::profile::Sample::alloc),
//! [`Sample::inuse`](crate::profile::Sample::inuse)): the bytes still in use at the end when the
//! heap is in the profile, else the bytes allocated. pprof keeps allocations and bytes, made and
//! in use, in Go's heap profile types ([`pprof`] has the table):
//!
//! | `--event` | pprof sample types | default | folded, SVG, speedscope |
//! |-----------|--------------------|---------|-------------------------|
//! | `alloc` | `alloc_objects/count`, `alloc_space/bytes` | `alloc_space` | bytes allocated |
//! | `heap` | `inuse_objects/count`, `inuse_space/bytes` | `inuse_space` | bytes in use at the end |
//! | `alloc,heap` | the four, in that order | `inuse_space` | bytes in use at the end |
//!
//! Off-CPU samples start with a root pseudo-frame naming why the thread was blocked
//! (`[off-cpu: lock]`, [`OffCpuReason::frame_name`](crate::profile::OffCpuReason::frame_name)),
//! so every format separates the reasons; pprof also gives them the string label
//! [`pprof::OFF_CPU_REASON_LABEL`] (`off_cpu.reason` = `sleep`, `lock`, `io`, `gil`, `asyncio_idle` or `other`).
//!
//! # Formats
//!
//! - **Folded** ([`folded`]): Brendan Gregg's collapsed stacks. One line per distinct stack, frames
//!   root first and `;`-separated, then a space and the weight (the number of samples, or
//!   nanoseconds when off-CPU time is in the profile). Samples with the same
//!   stack on different threads are merged; lines are sorted by stack (byte order). Frame names are
//!   [`Frame::display_name`](crate::profile::Frame::display_name), so kernel frames end in `_[k]`.
//! - **SVG** ([`svg`]): an interactive flame graph drawn by inferno from the folded stacks. The
//!   width of a frame is its weight (samples, or nanoseconds: the title then says of what, e.g.
//!   `spanprof: off-CPU time of …`; bytes: `spanprof: memory allocated by …`, `spanprof: memory
//!   in use at the end in …`); the subtitle gives duration, frequency (or the allocation sampling
//!   rate), total (samples, ms on-CPU and off-CPU, or estimated bytes and allocations) and lost
//!   samples. Colors are a deterministic function of the frame name; kernel frames are orange.
//! - **pprof** ([`pprof`]): gzipped `profile.proto` as read by `go tool pprof` and most profiling
//!   back ends. Sample types by events (tables above); the period type of a time profile is
//!   `cpu/nanoseconds` with period `1e9 / frequency`, so CPU time is `count * period`; that of a
//!   memory profile Go's `space/bytes`, with period the bytes between two sampled allocations
//!   ([`Events::alloc_rate`]). Each sample
//!   carries the labels `thread.id`, `thread.name` and `process.id`, an off-CPU one
//!   `off_cpu.reason`, and, when it was taken inside a tracing span,
//!   the span's ids (`trace_id`, `span_id`, `osprofiler.*`: see [`crate::profile::labels`]).
//!   `spanprof report` reads these files back ([`crate::format::pprof::read`]).
//! - **speedscope** ([`speedscope`]): the JSON file format of <https://www.speedscope.app>. One
//!   sampled profile per thread with weights in nanoseconds: CPU time (`count * period`) plus
//!   off-CPU time; or in bytes for a memory profile.
//!
//! # Grouping
//!
//! [`Profile::grouped`](crate::profile::Profile::grouped) (`--group-by span`) puts every sample
//! under a synthetic root frame named after its span (`[span SPAN trace TRACE]`, `[no span]`),
//! so every format shows one tower per span; sinks need nothing for it.
//!
//! # Units
//!
//! Units follow the project's output conventions: time is always nanoseconds, information
//! bytes, counts are plain sample (or allocation) counts, and a format's unit never changes once
//! released. A plain on-CPU profile is written exactly as before off-CPU profiling existed, and
//! time profiles exactly as before memory profiling.

use std::{fmt, io, path::Path};

use crate::profile::Profile;

pub mod folded;
pub mod otlp;
pub mod pprof;
pub mod speedscope;
pub mod svg;

/// Why a file could not be read back as a spanprof profile (by [`pprof::read_pprof`],
/// [`folded::read_folded`] or [`otlp::read_otlp`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file starts like gzip but does not decompress.
    #[error("not a pprof profile: bad gzip data")]
    Gzip(#[source] io::Error),
    /// The bytes are not a `profile.proto` message.
    #[error("not a pprof profile")]
    Decode(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A pprof profile, but not one spanprof wrote.
    #[error("not a spanprof profile: {0}")]
    Foreign(String),
    /// A spanprof profile with an inconsistent table or label.
    #[error("damaged spanprof profile: {0}")]
    Damaged(String),
    /// Folded stacks with a line that is not `FRAME;FRAME… COUNT`.
    #[error("not folded stacks: {0}")]
    Folded(String),
    /// Not an OTLP profiles request: bad gzip data or protobuf.
    #[error("not an OTLP profiles request")]
    NotOtlp(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A file format a [`Profile`] can be rendered to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Interactive flame graph (SVG with JavaScript), drawn by inferno.
    Svg,
    /// Folded (collapsed) stacks: `root;child;leaf COUNT` lines.
    Folded,
    /// Gzipped pprof `profile.proto`.
    Pprof,
    /// speedscope JSON file format.
    Speedscope,
    /// OTLP profiles: a protobuf `ExportProfilesServiceRequest` (proto v1.10.0).
    Otlp,
}

impl Format {
    /// Every format, in the order they are listed in help texts.
    pub const ALL: [Format; 5] = [
        Format::Svg,
        Format::Folded,
        Format::Pprof,
        Format::Speedscope,
        Format::Otlp,
    ];

    /// Guesses the format from a file name's extension.
    ///
    /// Recognizes `.svg`, `.folded`, `.pb.gz`, `.pprof`, `.speedscope.json` and `.otlp`, ignoring ASCII
    /// case. Returns `None` for anything else (including a plain `.json`, which could be another
    /// tool's format).
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        // NB: the double extensions are checked before their last component could match.
        const SUFFIXES: [(&str, Format); 6] = [
            (".speedscope.json", Format::Speedscope),
            (".pb.gz", Format::Pprof),
            (".pprof", Format::Pprof),
            (".svg", Format::Svg),
            (".folded", Format::Folded),
            (".otlp", Format::Otlp),
        ];
        SUFFIXES
            .iter()
            .find(|(suffix, _)| name.ends_with(suffix))
            .map(|&(_, format)| format)
    }

    /// Parses a format name as given on the command line: `svg`, `folded`, `pprof` or
    /// `speedscope` (ASCII case ignored).
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL
            .into_iter()
            .find(|format| format.name().eq_ignore_ascii_case(name))
    }

    /// The format's name, the inverse of [`Format::from_name`].
    pub fn name(self) -> &'static str {
        match self {
            Format::Svg => "svg",
            Format::Folded => "folded",
            Format::Pprof => "pprof",
            Format::Speedscope => "speedscope",
            Format::Otlp => "otlp",
        }
    }

    /// The canonical file extension, without the leading dot (e.g. `pb.gz`), for default output
    /// file names.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Svg => "svg",
            Format::Folded => "folded",
            Format::Pprof => "pb.gz",
            Format::Speedscope => "speedscope.json",
            Format::Otlp => "otlp",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a profile could not be rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// A sample points past the end of [`Profile::frames`].
    #[error("sample {sample} refers to frame {frame}, but the profile has {frames} frames")]
    FrameOutOfRange {
        /// Index of the sample in [`Profile::samples`].
        sample: usize,
        /// The frame index it holds.
        frame: u32,
        /// Length of [`Profile::frames`].
        frames: usize,
    },
    /// A sample points past the end of [`Profile::threads`].
    #[error("sample {sample} refers to thread {thread}, but the profile has {threads} threads")]
    ThreadOutOfRange {
        /// Index of the sample in [`Profile::samples`].
        sample: usize,
        /// The thread index it holds.
        thread: u32,
        /// Length of [`Profile::threads`].
        threads: usize,
    },
    /// A sample points past the end of [`Profile::spans`].
    #[error("sample {sample} refers to span {span}, but the profile has {spans} spans")]
    SpanOutOfRange {
        /// Index of the sample in [`Profile::samples`].
        sample: usize,
        /// The span index it holds.
        span: u32,
        /// Length of [`Profile::spans`].
        spans: usize,
    },
    /// inferno failed to write the SVG.
    #[error("failed to draw the flame graph")]
    Svg(#[source] io::Error),
    /// Compressing the pprof profile failed.
    #[error("failed to gzip the pprof profile")]
    Gzip(#[source] io::Error),
    /// Serializing the speedscope file failed.
    #[error("failed to serialize the speedscope profile")]
    Json(#[source] serde_json::Error),
}

/// Renders `profile` in `format` to memory.
///
/// Fails only on an inconsistent profile (an index out of range) or an encoder error.
pub fn render(profile: &Profile, format: Format) -> Result<Vec<u8>, OutputError> {
    match format {
        Format::Svg => svg::render(profile),
        Format::Folded => folded::render(profile),
        Format::Pprof => pprof::render(profile),
        Format::Speedscope => speedscope::render(profile),
        Format::Otlp => {
            validate(profile)?;
            Ok(otlp::render(profile))
        }
    }
}

/// Checks that every sample's frame, thread and span indexes are in range, so sinks can index
/// the tables directly.
fn validate(profile: &Profile) -> Result<(), OutputError> {
    let frames = profile.frames.len();
    let threads = profile.threads.len();
    let spans = profile.spans.len();
    for (i, sample) in profile.samples.iter().enumerate() {
        if let Some(span) = sample.span.filter(|&s| s as usize >= spans) {
            return Err(OutputError::SpanOutOfRange {
                sample: i,
                span,
                spans,
            });
        }
        if sample.thread as usize >= threads {
            return Err(OutputError::ThreadOutOfRange {
                sample: i,
                thread: sample.thread,
                threads,
            });
        }
        if let Some(&frame) = sample.frames.iter().find(|&&f| f as usize >= frames) {
            return Err(OutputError::FrameOutOfRange {
                sample: i,
                frame,
                frames,
            });
        }
    }
    Ok(())
}

/// A small hand-built profile shared by the sinks' tests (and, with the `fixture` feature, by
/// the unit tests of the crates above).
#[cfg(any(test, feature = "fixture"))]
pub mod fixture {
    use std::time::{Duration, SystemTime};

    use crate::profile::OffCpuReason;
    use crate::profile::{
        Events, Frame, FrameKind, Memory, Meta, OsProfilerIds, Process, Profile, Sample,
        SpanContext, SpanName, Thread,
    };

    fn native(function: &str, address: u64, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Native,
            function: Some(function.to_string()),
            module: Some("/usr/bin/app".to_string()),
            address,
            file: Some("src/app.c".to_string()),
            line: Some(line),
            unknown_reason: None,
        }
    }

    /// Two threads of pid 100; frames: 0 `main`, 1 `compute` (line 42), 2 an unknown frame in
    /// libfoo, 3 a kernel frame, 4 `compute` again at another address and line.
    ///
    /// Folded: `main;compute 8`, `main;compute;do_syscall_64_[k] 2`,
    /// `main;[unknown] (libfoo.so+0x1234) 1`; 11 samples, 4 lost, 100 Hz.
    pub fn profile() -> Profile {
        Profile {
            meta: Meta {
                target: "pid 100 (app)".to_string(),
                start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                duration: Duration::from_millis(2500),
                frequency: 100,
                events: Default::default(),
                lost_samples: 4,
                python: Default::default(),
                host: None,
                build: Default::default(),
                dropped_labels: Vec::new(),
            },
            frames: vec![
                native("main", 0x1000, 10),
                native("compute", 0x1200, 42),
                Frame {
                    kind: FrameKind::Native,
                    function: None,
                    module: Some("/usr/lib/libfoo.so".to_string()),
                    address: 0x1234,
                    file: None,
                    line: None,
                    unknown_reason: Some("no symbol".to_string()),
                },
                Frame {
                    kind: FrameKind::Kernel,
                    function: Some("do_syscall_64".to_string()),
                    module: Some("[kernel]".to_string()),
                    address: 0xffff_ffff_8100_0000,
                    file: None,
                    line: None,
                    unknown_reason: None,
                },
                native("compute", 0x1210, 43),
            ],
            threads: vec![
                Thread {
                    pid: 100,
                    tid: 100,
                    name: "app".to_string(),
                },
                Thread {
                    pid: 100,
                    tid: 101,
                    name: "worker".to_string(),
                },
            ],
            processes: vec![Process {
                pid: 100,
                name: "app".to_string(),
                info: Default::default(),
            }],
            samples: vec![
                Sample {
                    frames: vec![0, 1],
                    thread: 0,
                    count: 5,
                    off_cpu_ns: 0,
                    off_cpu: None,
                    alloc: Default::default(),
                    inuse: Default::default(),
                    span: None,
                    unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                    times: Vec::new(),
                    inuse_times: Vec::new(),
                },
                Sample {
                    frames: vec![0, 4],
                    thread: 1,
                    count: 3,
                    off_cpu_ns: 0,
                    off_cpu: None,
                    alloc: Default::default(),
                    inuse: Default::default(),
                    span: None,
                    unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                    times: Vec::new(),
                    inuse_times: Vec::new(),
                },
                Sample {
                    frames: vec![0, 1, 3],
                    thread: 0,
                    count: 2,
                    off_cpu_ns: 0,
                    off_cpu: None,
                    alloc: Default::default(),
                    inuse: Default::default(),
                    span: None,
                    unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                    times: Vec::new(),
                    inuse_times: Vec::new(),
                },
                Sample {
                    frames: vec![0, 2],
                    thread: 1,
                    count: 1,
                    off_cpu_ns: 0,
                    off_cpu: None,
                    alloc: Default::default(),
                    inuse: Default::default(),
                    span: None,
                    unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                    times: Vec::new(),
                    inuse_times: Vec::new(),
                },
            ],
            spans: vec![],
        }
    }

    /// OpenTelemetry trace id of [`with_spans`]' spans.
    pub const TRACE: [u8; 16] = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    /// OSProfiler base id of [`with_spans`]' spans.
    pub const BASE: [u8; 16] = [0x11; 16];
    /// Name of [`with_spans`]' first OpenTelemetry span.
    pub const SPAN_NAME: &str = "GET /servers/{server_id}";
    /// Name of [`with_spans`]' first OSProfiler trace point.
    pub const OSP_NAME: &str = "wsgi";
    /// Name of its second trace point: the longest a name is kept ([`crate::profile::SPAN_NAME_MAX`]).
    pub const LONG_NAME: &str = "db.SELECT instances.uuid FROM instances WHERE instances.host = ?";

    /// [`profile`] with span contexts: sample 0 in an OpenTelemetry span (`00f067aa0ba902b7`),
    /// sample 1 in an OSProfiler trace point (`22…`, base `11…`), sample 2 in both (span
    /// `00f067aa0ba902b8`, trace point `33…` under `22…`), sample 3 in none. The first span and
    /// trace point have names ([`SPAN_NAME`], [`OSP_NAME`]), the span of sample 2 none (a span
    /// of the API alone), its trace point [`LONG_NAME`].
    pub fn with_spans() -> Profile {
        let mut p = profile();
        p.spans = vec![
            SpanContext {
                trace_id: Some(TRACE),
                span_id: Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]),
                osprofiler: None,
                span_name: SpanName::new(SPAN_NAME),
                osprofiler_name: None,
            },
            SpanContext {
                trace_id: None,
                span_id: None,
                osprofiler: Some(OsProfilerIds {
                    base_id: BASE,
                    trace_id: [0x22; 16],
                    parent_id: None,
                }),
                span_name: None,
                osprofiler_name: SpanName::new(OSP_NAME),
            },
            SpanContext {
                trace_id: Some(TRACE),
                span_id: Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb8]),
                osprofiler: Some(OsProfilerIds {
                    base_id: BASE,
                    trace_id: [0x33; 16],
                    parent_id: Some([0x22; 16]),
                }),
                span_name: None,
                osprofiler_name: SpanName::new(LONG_NAME),
            },
        ];
        for (sample, span) in p.samples.iter_mut().zip([Some(0), Some(1), Some(2), None]) {
            sample.span = span;
        }
        p
    }

    /// Nanoseconds thread 0 was blocked on a lock in `main;compute;do_syscall_64`, in span 0.
    pub const LOCK_NS: u64 = 30_000_000;
    /// Nanoseconds thread 1 slept in `main`, in no span.
    pub const SLEEP_NS: u64 = 250_000_000;
    /// Nanoseconds thread 1 was blocked on a lock in `main;compute` (frame 4), in span 1.
    pub const LOCK2_NS: u64 = 15_500_000;

    /// [`with_spans`] profiled with `--event cpu,offcpu`: its 4 on-CPU samples (11 at 100 Hz,
    /// 110 ms), then 3 off-CPU samples under the pseudo-frames 5 `[off-cpu: lock]` and 6
    /// `[off-cpu: sleep]`: [`LOCK_NS`] (thread 0, span 0), [`SLEEP_NS`] (thread 1, no span),
    /// [`LOCK2_NS`] (thread 1, span 1); 295.5 ms off-CPU in all.
    pub fn off_cpu() -> Profile {
        let mut p = with_spans();
        p.meta.events = Events {
            cpu: true,
            off_cpu: true,
            wall: false,
            ..Events::default()
        };
        for reason in [OffCpuReason::Lock, OffCpuReason::Sleep] {
            p.frames.push(Frame {
                kind: FrameKind::Native,
                function: Some(reason.frame_name()),
                module: None,
                address: 0,
                file: None,
                line: None,
                unknown_reason: None,
            });
        }
        let blocked = |frames: Vec<u32>, thread, ns, reason, span| Sample {
            frames,
            thread,
            count: 0,
            off_cpu_ns: ns,
            off_cpu: Some(reason),
            alloc: Default::default(),
            inuse: Default::default(),
            span,
            unwind: symbolizer::unwind::UnwindStatus::Complete,
            times: Vec::new(),
            inuse_times: Vec::new(),
        };
        p.samples.extend([
            blocked(vec![5, 0, 1, 3], 0, LOCK_NS, OffCpuReason::Lock, Some(0)),
            blocked(vec![6, 0], 1, SLEEP_NS, OffCpuReason::Sleep, None),
            blocked(vec![5, 0, 4], 1, LOCK2_NS, OffCpuReason::Lock, Some(1)),
        ]);
        p
    }

    /// [`off_cpu`] profiled with `--event offcpu`: its off-CPU samples alone.
    pub fn off_cpu_only() -> Profile {
        let mut p = off_cpu();
        p.meta.events = Events {
            cpu: false,
            off_cpu: true,
            wall: false,
            ..Events::default()
        };
        p.retain_samples(|_, s| s.off_cpu.is_some());
        p
    }

    /// [`with_spans`] profiled with `--event alloc,heap` at the default rate (512 KiB): no
    /// on-CPU counts; per sample (allocations, bytes) made and still in use at the end:
    ///
    /// | sample | stack | thread, span | allocated | in use |
    /// |--------|-------|--------------|-----------|--------|
    /// | 0 | `main;compute` | 0, 0 | 34,000, 1,200,000,000 | 1,000, 800,000,000 |
    /// | 1 | `main;compute` (frame 4) | 1, 1 | 500, 50,000,000 | 0, 0 |
    /// | 2 | `main;compute;do_syscall_64` | 0, 2 | 60, 30,000,000 | 30, 20,000,000 |
    /// | 3 | `main;[unknown] (libfoo.so+0x1234)` | 1, none | 7, 3,500,000 | 7, 3,500,000 |
    ///
    /// In all 34,567 allocations of 1,283,500,000 bytes (1.2 GiB), 1,037 of 823,500,000 bytes
    /// (785.4 MiB) in use at the end.
    pub fn memory() -> Profile {
        let mut p = with_spans();
        p.meta.events = Events {
            cpu: false,
            alloc: true,
            heap: true,
            ..Events::default()
        };
        let values = [
            ((34_000, 1_200_000_000), (1_000, 800_000_000)),
            ((500, 50_000_000), (0, 0)),
            ((60, 30_000_000), (30, 20_000_000)),
            ((7, 3_500_000), (7, 3_500_000)),
        ];
        for (s, (alloc, inuse)) in p.samples.iter_mut().zip(values) {
            s.count = 0;
            s.alloc = Memory {
                objects: alloc.0,
                bytes: alloc.1,
            };
            s.inuse = Memory {
                objects: inuse.0,
                bytes: inuse.1,
            };
        }
        p
    }

    /// [`memory`] profiled with `--event alloc`: nothing in use is tracked.
    pub fn alloc_only() -> Profile {
        let mut p = memory();
        p.meta.events.heap = false;
        for s in &mut p.samples {
            s.inuse = Memory::default();
        }
        p
    }

    /// [`memory`] profiled with `--event heap`: the samples still carry what was allocated (the
    /// heap is tracked from the sampled allocations), which the outputs do not show.
    pub fn heap_only() -> Profile {
        let mut p = memory();
        p.meta.events.alloc = false;
        p
    }

    /// [`off_cpu`] profiled with `--event wall`.
    pub fn wall() -> Profile {
        let mut p = off_cpu();
        p.meta.events = Events {
            cpu: true,
            off_cpu: true,
            wall: true,
            ..Events::default()
        };
        p
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::profile::Memory;
    use crate::wording::*;

    #[test]
    fn format_from_path() {
        let cases = [
            ("out.svg", Some(Format::Svg)),
            ("/tmp/OUT.SVG", Some(Format::Svg)),
            ("a.folded", Some(Format::Folded)),
            ("profile.pb.gz", Some(Format::Pprof)),
            ("profile.pprof", Some(Format::Pprof)),
            ("x.speedscope.json", Some(Format::Speedscope)),
            ("x.json", None),
            ("x.gz", None),
            ("svg", None),
            ("", None),
        ];
        for (path, want) in cases {
            assert_eq!(Format::from_path(Path::new(path)), want, "{path}");
        }
    }

    #[test]
    fn format_names_round_trip() {
        for format in Format::ALL {
            assert_eq!(Format::from_name(format.name()), Some(format));
            assert_eq!(format.to_string(), format.name());
            let file = format!("out.{}", format.extension());
            assert_eq!(Format::from_path(Path::new(&file)), Some(format));
        }
        assert_eq!(Format::from_name("PPROF"), Some(Format::Pprof));
        assert_eq!(Format::from_name("json"), None);
    }

    #[test]
    fn render_rejects_bad_indexes() {
        let mut profile = fixture::profile();
        profile.samples[1].frames.push(99);
        for format in Format::ALL {
            let err = render(&profile, format).unwrap_err();
            assert!(
                matches!(
                    err,
                    OutputError::FrameOutOfRange {
                        sample: 1,
                        frame: 99,
                        frames: 5
                    }
                ),
                "{format}: {err}"
            );
        }
        let mut profile = fixture::profile();
        profile.samples[0].thread = 7;
        assert!(matches!(
            render(&profile, Format::Folded),
            Err(OutputError::ThreadOutOfRange { thread: 7, .. })
        ));
        let mut profile = fixture::with_spans();
        profile.samples[2].span = Some(3);
        for format in Format::ALL {
            let err = render(&profile, format).unwrap_err();
            assert!(
                matches!(
                    err,
                    OutputError::SpanOutOfRange {
                        sample: 2,
                        span: 3,
                        spans: 3
                    }
                ),
                "{format}: {err}"
            );
        }
    }

    #[test]
    fn osprofiler_links_are_derived_again_not_read_as_opentelemetry_ids() {
        let profile = fixture::with_spans();
        let link = profile.spans[1]
            .trace_link(true)
            .expect("an OSProfiler point links");
        assert_eq!(
            (link.trace_id, link.span_id, link.from_osprofiler),
            (fixture::BASE, [0x22; 8], true)
        );
        let own = profile.spans[2]
            .trace_link(true)
            .expect("an OpenTelemetry span links");
        assert!(!own.from_osprofiler && own.trace_id == fixture::TRACE);
        // Before a request's first point: in the parent it came with, or with none in no span.
        let mut before = profile.spans[1];
        before.osprofiler = Some(crate::profile::OsProfilerIds {
            base_id: fixture::BASE,
            trace_id: fixture::BASE,
            parent_id: Some(fixture::BASE),
        });
        assert_eq!(before.trace_link(true), None);
        // `--drop-label trace_id`, `span_id` or `span.ids_from`: nothing derived.
        let mut dropped = fixture::with_spans();
        for label in ["trace_id", "span_id", "span.ids_from"] {
            dropped.meta.dropped_labels = vec![label.to_string()];
            assert!(!dropped.meta.derives_links());
            assert_eq!(dropped.spans[1].trace_link(false), None);
            assert!(dropped.spans[1]
                .labels(false)
                .iter()
                .all(|(k, _)| { !matches!(*k, "trace_id" | "span_id" | "span.ids_from") }));
        }
        dropped.meta.dropped_labels = vec!["span.ids_from".to_string()];
        let bytes = render(&dropped, Format::Otlp).unwrap();
        let back = otlp::read::read_otlp(&bytes).unwrap();
        let point = back
            .spans
            .iter()
            .find(|s| s.osprofiler.is_some_and(|o| o.trace_id == [0x22; 16]))
            .expect("the OSProfiler point read back");
        assert_eq!((point.trace_id, point.span_id), (None, None));
        assert!(!before
            .labels(true)
            .iter()
            .any(|(k, _)| k.starts_with("trace_id")));
        for format in [Format::Pprof, Format::Otlp] {
            let bytes = render(&profile, format).unwrap();
            let back = match format {
                Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
                _ => otlp::read::read_otlp(&bytes).unwrap(),
            };
            let mut spans = back.spans.clone();
            spans.sort();
            let mut expected = profile.spans.clone();
            expected.sort();
            assert_eq!(spans, expected, "{format:?}");
        }
    }

    #[test]
    fn sizes_counts_and_rates() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (823_500_000, "785.4 MiB"),
            (1_283_500_000, "1.2 GiB"),
            (3 << 40, "3.0 TiB"),
            (u64::MAX, "16384.0 PiB"),
        ];
        for (bytes, text) in cases {
            assert_eq!(size(bytes), text, "{bytes}");
        }
        for (n, text) in [(0, "0"), (999, "999"), (1000, "1,000"), (34_567, "34,567")] {
            assert_eq!(thousands(n), text);
        }
        assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
        let mut meta = fixture::memory().meta;
        assert_eq!(sampling(&meta), "at 1 sample per 512 KiB");
        for (rate, text) in [
            (1, "recording every allocation"),
            (0, "recording every allocation"),
            (100, "at 1 sample per 100 B"),
            (3 << 20, "at 1 sample per 3 MiB"),
            (1_000_000, "at 1 sample per 976.6 KiB"),
        ] {
            meta.events.alloc_rate = rate;
            assert_eq!(sampling(&meta), text, "{rate}");
            assert_eq!(estimated(meta.events), rate > 1);
        }
        assert_eq!(sampling(&fixture::profile().meta), "at 100 Hz");
    }

    #[test]
    fn memory_words() {
        let both = fixture::memory();
        assert_eq!(
            memory_text(&both),
            "1.2 GiB allocated in 34,567 allocations, 785.4 MiB in use at the end in 1,037"
        );
        assert_eq!(
            memory_text(&fixture::alloc_only()),
            "1.2 GiB allocated in 34,567 allocations"
        );
        let mut heap = fixture::heap_only();
        assert_eq!(
            memory_text(&heap),
            "785.4 MiB in use at the end in 1,037 allocations"
        );
        heap.retain_samples(|_, s| s.thread == 1);
        heap.samples.pop();
        heap.samples[0].inuse = Memory {
            objects: 1,
            bytes: 100,
        };
        assert_eq!(
            memory_text(&heap),
            "100 B in use at the end in 1 allocation"
        );
        assert_eq!(
            shown(&both.meta),
            "memory in use at the end in pid 100 (app)"
        );
        assert_eq!(
            shown(&fixture::alloc_only().meta),
            "memory allocated by pid 100 (app)"
        );
        assert_eq!(shown(&fixture::profile().meta), "pid 100 (app)");
        assert_eq!(
            shown(&fixture::off_cpu().meta),
            "CPU + off-CPU time of pid 100 (app)"
        );
        assert_eq!(
            memory_totals(&both),
            (
                Memory {
                    objects: 34_567,
                    bytes: 1_283_500_000
                },
                Memory {
                    objects: 1_037,
                    bytes: 823_500_000
                }
            )
        );
    }

    #[test]
    fn empty_profile() {
        let mut profile = fixture::profile();
        profile.samples.clear();
        assert!(render(&profile, Format::Folded).unwrap().is_empty());
        let svg = String::from_utf8(render(&profile, Format::Svg).unwrap()).unwrap();
        assert!(
            svg.contains("no samples") && svg.contains("</svg>"),
            "{svg}"
        );
        assert!(!render(&profile, Format::Pprof).unwrap().is_empty());
        assert!(!render(&profile, Format::Speedscope).unwrap().is_empty());

        for (mut profile, text) in [
            (
                fixture::alloc_only(),
                "no samples: no allocation of the target was sampled while profiled",
            ),
            (
                fixture::heap_only(),
                "no samples: no sampled allocation of the target was still in use at the end",
            ),
        ] {
            profile.samples.clear();
            assert_eq!(no_samples_text(profile.meta.events), text);
            let svg = String::from_utf8(render(&profile, Format::Svg).unwrap()).unwrap();
            assert!(svg.contains(text), "{svg}");
            assert!(render(&profile, Format::Folded).unwrap().is_empty());
        }
    }
}

#[cfg(test)]
mod inlined_tests {
    use super::*;
    use crate::profile::{Frame, FrameKind};

    /// `fixture::profile` with a sample in `deflate` of libz at 0x4a26, into which
    /// `fill_window` and then `read_buf` were inlined, and one at another address of it.
    fn with_inlined() -> Profile {
        let mut profile = fixture::profile();
        let at = |kind, function: &str, address, line| Frame {
            kind,
            function: Some(function.to_string()),
            module: Some("/usr/lib/libz.so.1".to_string()),
            address,
            file: Some("/src/zlib/deflate.c".to_string()),
            line: Some(line),
            unknown_reason: None,
        };
        let first = profile.frames.len() as u32;
        profile.frames.extend([
            at(FrameKind::Native, "deflate", 0x4a26, 100),
            at(FrameKind::Inlined, "fill_window", 0x4a26, 50),
            at(FrameKind::Inlined, "read_buf", 0x4a26, 20),
            at(FrameKind::Native, "deflate", 0x4b00, 130),
        ]);
        let mut sample = profile.samples[0].clone();
        sample.frames = vec![0, first, first + 1, first + 2];
        profile.samples.push(sample);
        let mut sample = profile.samples[0].clone();
        sample.frames = vec![0, first + 3];
        sample.count = 1;
        profile.samples.push(sample);
        profile
    }

    fn folded(profile: &Profile) -> String {
        String::from_utf8(render(profile, Format::Folded).unwrap()).unwrap()
    }

    #[test]
    fn inlined_functions_are_lines_of_one_location_and_frames_of_their_own() {
        let profile = with_inlined();
        let text = folded(&profile);
        assert!(
            text.contains(
                "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 5"
            ),
            "{text}"
        );
        // pprof, decoded by the pprof crate's own types: one location, innermost line first.
        let bytes = render(&profile, Format::Pprof).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw)
            .unwrap();
        let p = <::pprof::protos::Profile as ::pprof::protos::Message>::decode(&raw[..]).unwrap();
        let name = |id: u64| {
            let f = p.function.iter().find(|f| f.id == id).unwrap();
            p.string_table[f.name as usize].clone()
        };
        let loc = p.location.iter().find(|l| l.address == 0x4a26).unwrap();
        let lines: Vec<(String, i64)> = loc
            .line
            .iter()
            .map(|l| (name(l.function_id), l.line))
            .collect();
        assert_eq!(
            lines,
            [
                ("read_buf".to_string(), 20),
                ("fill_window".to_string(), 50),
                ("deflate".to_string(), 100)
            ]
        );
        assert_eq!(p.location.iter().filter(|l| l.address == 0x4b00).count(), 1);
        let libz = p.mapping.iter().find(|m| m.id == loc.mapping_id).unwrap();
        assert!(libz.has_inline_frames && libz.has_line_numbers);
        assert!(p
            .mapping
            .iter()
            .filter(|m| m.id != libz.id)
            .all(|m| !m.has_inline_frames));
        // Read back from pprof, OTLP and folded stacks, the same stacks.
        for format in [Format::Pprof, Format::Otlp, Format::Folded] {
            let bytes = render(&profile, format).unwrap();
            let back = match format {
                Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
                Format::Otlp => otlp::read::read_otlp(&bytes).unwrap(),
                _ => folded::read_folded(&bytes).unwrap(),
            };
            assert_eq!(folded(&back), text, "{format:?}");
            let inlined: Vec<&Frame> = back
                .frames
                .iter()
                .filter(|f| f.kind == FrameKind::Inlined)
                .collect();
            assert_eq!(inlined.len(), 2, "{format:?}: {:?}", back.frames);
            assert!(inlined.iter().all(|f| f.line.is_some()), "{format:?}");
        }
    }

    #[test]
    fn chains_that_share_their_ends_stay_apart_and_inlined_frames_need_a_native_one() {
        // Read from folded stacks, frames have no address: two chains of one function that
        // start and end alike are still two locations.
        let text =
            "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 3\n\
                    main;deflate;read_buf (deflate.c:20, inlined) 2\n\
                    main;run (app.py:3);read_buf (deflate.c:20, inlined) 1\n";
        let profile = folded::read_folded(text.as_bytes()).unwrap();
        for format in [Format::Pprof, Format::Otlp] {
            let bytes = render(&profile, format).unwrap();
            let back = match format {
                Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
                _ => otlp::read::read_otlp(&bytes).unwrap(),
            };
            let mut lines: Vec<String> = folded(&back).lines().map(str::to_string).collect();
            lines.sort();
            // An inlined frame after a Python one is a location of its own (read back as
            // native: nothing it was inlined into is known).
            assert_eq!(
                lines,
                [
                    "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 3",
                    "main;deflate;read_buf (deflate.c:20, inlined) 2",
                    "main;run (app.py:3);read_buf 1",
                ],
                "{format:?}"
            );
        }
    }
}
