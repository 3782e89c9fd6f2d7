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
//! | `cpu` (default) | `samples/count`, `cpu/nanoseconds` | `[n, n * period]` | (none) |
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

pub mod budget;
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
    /// Reading it would take more memory than a file of its size may ([`budget`]).
    #[error("{0}")]
    TooBig(String),
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

    /// Whether the format keeps every frame whatever the view ([`crate::profile::View`]): pprof
    /// and OTLP do, marking the interpreter's, so that one file serves every view; folded
    /// stacks, SVG and speedscope are written in the view asked for.
    pub fn keeps_every_frame(self) -> bool {
        matches!(self, Format::Pprof | Format::Otlp)
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
            ids: None,
            start_line: None,
            interpreter: false,
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
                    ids: None,
                    start_line: None,
                    interpreter: false,
                },
                Frame {
                    kind: FrameKind::Kernel,
                    function: Some("do_syscall_64".to_string()),
                    module: Some("[kernel]".to_string()),
                    address: 0xffff_ffff_8100_0000,
                    file: None,
                    line: None,
                    unknown_reason: None,
                    ids: None,
                    start_line: None,
                    interpreter: false,
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
                ids: None,
                start_line: None,
                interpreter: false,
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
mod tests;

#[cfg(test)]
mod inlined_tests;
