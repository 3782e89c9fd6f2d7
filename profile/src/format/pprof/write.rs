//! Gzipped pprof `profile.proto`, for `go tool pprof`, pprof-rs tooling and profiling back ends.
//!
//! # Layout
//!
//! - Sample types: by what was profiled ([`Events`], `--event`), one of the [`Shape`]s:
//!
//!   | `--event` | `sample_type` | on-CPU sample | off-CPU sample | default |
//!   |-----------|---------------|---------------|----------------|---------|
//!   | `cpu` (default) | `samples/count`, `cpu/nanoseconds` | `[n, n * period]` | (none) | (unset: the last, `cpu`) |
//!   | `offcpu` | `off_cpu/nanoseconds` | (none) | `[ns]` | (unset: the only one) |
//!   | `cpu,offcpu` | `samples/count`, `cpu/nanoseconds`, `off_cpu/nanoseconds` | `[n, n * period, 0]` | `[0, 0, ns]` | `off_cpu` |
//!   | `wall` | `wall/nanoseconds` | `[n * period]` | `[ns]` | (unset: the only one) |
//!
//!   `n` is the number of perf events that hit the stack, `ns` the nanoseconds the thread was
//!   blocked in it ([`Sample::off_cpu_ns`](crate::profile::Sample::off_cpu_ns)). The period type
//!   of these time shapes is `cpu/nanoseconds`, period `1e9 / frequency`, so a sample's CPU time
//!   is `count * period`. An on-CPU profile stores that time as a second value, as Go's CPU
//!   profiles do, so pprof shows times (`-sample_index=samples` gives the counts); with
//!   `cpu,offcpu`, `cpu` and `off_cpu` compare in one unit (`go tool pprof -sample_index=cpu`).
//!   A profile without a rate (read from folded stacks) has `samples/count` alone, and a file
//!   with `samples/count` alone (spanprof before 2026-12, other tools) reads as `cpu`.
//!
//!   Memory profiles (which never mix with time events) take Go's heap profile types, in Go's
//!   order, the period type `space/bytes` and the period [`Events::alloc_rate`] (the average
//!   number of bytes allocated between two sampled allocations; 1 when every allocation is
//!   recorded), as Go writes its `MemProfileRate`:
//!
//!   | `--event` | `sample_type` | sample | default |
//!   |-----------|---------------|--------|---------|
//!   | `alloc` | `alloc_objects/count`, `alloc_space/bytes` | `[ao, ab]` | `alloc_space` |
//!   | `heap` | `inuse_objects/count`, `inuse_space/bytes` | `[io, ib]` | `inuse_space` |
//!   | `alloc,heap` | `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes` | `[ao, ab, io, ib]` | `inuse_space` |
//!
//!   `ao`, `ab` are the allocations and bytes made in the stack, `io`, `ib` those of them not
//!   freed at the end ([`Sample::alloc`](crate::profile::Sample::alloc),
//!   [`Sample::inuse`](crate::profile::Sample::inuse)): estimates scaled from the sampled
//!   allocations, already in allocations and bytes (no multiplication by the period needed, as
//!   in Go's files). A sample whose values are all 0 is not written (in a `heap` profile, a stack
//!   whose sampled allocations were all freed).
//! - An off-CPU sample's stack starts (at its root) with the pseudo-frame of its reason,
//!   `[off-cpu: lock]`, and it carries the string label [`OFF_CPU_REASON_LABEL`]
//!   (`off_cpu.reason`): `sleep`, `lock`, `io`, `gil`, `asyncio_idle` or `other`
//!   ([`OffCpuReason::name`](crate::profile::OffCpuReason::name)); `go tool pprof -tagfocus
//!   off_cpu.reason=lock` keeps the lock waits.
//! - One pprof sample per [`Sample`](crate::profile::Sample) (a distinct stack on a thread; but
//!   the all-zero memory samples above), with
//!   `location_id` leaf first as pprof requires (the reverse of our root-first frames) and the
//!   labels `thread.id` (num, tid), `thread.name` (str, `comm`) and `process.id` (num, pid), then
//!   `unwind` and `unwind.reason` ([`UNWIND_LABEL`], [`UNWIND_REASON_LABEL`]), then
//!   `off_cpu.reason` for an off-CPU sample.
//! - A sample taken inside a tracing span also carries the span's string labels, after those,
//!   in this order and only those known: `trace_id` and `span_id` (OpenTelemetry, lower-case
//!   hex, 32 and 16 digits; in an OSProfiler point with no OpenTelemetry span, those OSProfiler's
//!   OTLP driver exports it under, followed by `span.ids_from=osprofiler`: see
//!   [`SpanContext::trace_link`](crate::profile::SpanContext::trace_link)), `span.name` (the
//!   OpenTelemetry span's name), `osprofiler.base_id`,
//!   `osprofiler.trace_id` and `osprofiler.parent_id` (OSProfiler, UUIDs `8-4-4-4-12`),
//!   `osprofiler.name` (the trace point's name); see [`crate::profile::labels`]. Names are at
//!   most [`SPAN_NAME_MAX`](crate::profile::SPAN_NAME_MAX) bytes (longer ones keep their
//!   first bytes; names that are not ASCII are not read).
//!   `go tool pprof -tagfocus trace_id=…` or `spanprof report --trace-id …` select one trace.
//! - One mapping per distinct module, ids from 1, `filename` the module path, the first that of
//!   the target's executable when it has frames (pprof prints it as `File:`). Kernel frames all go
//!   in one `[kernel.kallsyms]` mapping (perf's name) whatever their module says, Python frames
//!   in one [`PYTHON_MAPPING`] (`[python]`: pprof tools do not look for a file behind a name in
//!   brackets), which is also how `spanprof report` tells them from native frames. Native frames
//!   without a module (placeholders such as `[truncated]`) have no mapping (`mapping_id` 0).
//!   Location addresses are module-relative (file offsets; absolute for the kernel; 0 for Python
//!   and placeholders), so a mapping spans `[0, highest address + 1)`.
//!   A native mapping has the GNU build id of its file (`build_id`, lower-case hex), when the
//!   file has one, so that pprof finds a copy with symbols by it (`PPROF_BINARY_PATH`, which
//!   it searches for `BUILD_ID/NAME`); two files of one path with different build ids are two
//!   mappings. A file without a GNU build id has none here: pprof would refuse to symbolize
//!   from it with any other id (OTLP also carries the `htlhash`).
//! - One location per distinct frame, with the frame's address and one line
//!   `{function_id, line}` (line 0 when unknown); a native frame followed by the functions
//!   inlined into it ([`FrameKind::Inlined`]) is one location of a line each, the innermost
//!   first and its own last, and its mapping has `has_inline_frames`. A frame that could not
//!   be named (native or kernel) is a location of its address and mapping without a line,
//!   pprof's convention, which tools symbolize later and `pprof -top` shows address by
//!   address; `has_functions` of the mapping stays false while none of its frames is named.
//! - One function per distinct (name, source file, first line). Kernel functions keep their
//!   plain name (no `_[k]`; the mapping says they are kernel code). A Python function's
//!   `start_line` is its `co_firstlineno` (its `def`), 0 where unknown.
//! - `time_nanos` is the session start (Unix time), `duration_nanos` its length. Comments record
//!   the target (`target: …`), when non-zero the number of lost samples (`lost samples: N`),
//!   each process (`process: PID (name)`), and each module that holds a Python interpreter
//!   (`python interpreter: PATH`, the `filename` of its mappings: the frames the Python view
//!   leaves out, [`crate::profile::View`]); `spanprof report` reads them back.
//! - `string_table[0]` is `""`; strings are added in first-use order, so output is deterministic.

use std::{
    collections::HashMap,
    io::Write,
    time::{Duration, UNIX_EPOCH},
};

use ::pprof::protos::{
    Function, Label, Line, Location, Mapping, Message, Profile as PprofProfile, Sample, ValueType,
};
use flate2::{write::GzEncoder, Compression};

use crate::format::{validate, OutputError};
use crate::profile::{Events, Frame, FrameKind, Profile};
use symbolizer::build_id::ModuleIds;

/// The mapping that holds every kernel frame.
pub const KERNEL_MAPPING: &str = symbolizer::KERNEL_MODULE;

/// The mapping that holds every Python frame.
pub const PYTHON_MAPPING: &str = "[python]";

/// Prefix of the comment that names what was profiled.
pub const TARGET_COMMENT: &str = "target: ";
/// Prefix of the comment that counts lost samples.
pub const LOST_COMMENT: &str = "lost samples: ";
/// Prefix of the comment that names a process: `process: PID (name)`.
pub const PROCESS_COMMENT: &str = "process: ";
/// Prefix of the comment that names the host the session ran on.
pub const HOST_COMMENT: &str = "host: ";
/// Prefix of the comment that names the commit a CI run built ([`crate::profile::Build`]).
pub const COMMIT_COMMENT: &str = "commit: ";
/// Prefix of the comment that names its branch.
pub const BRANCH_COMMENT: &str = "branch: ";
/// Prefix of the comment that names a module holding a Python interpreter, whose native
/// frames the Python view leaves out ([`crate::profile::View`]): `python interpreter: PATH`, the
/// `filename` of its mappings.
pub const INTERPRETER_COMMENT: &str = "python interpreter: ";
/// Prefix of the comment that lists the labels `--drop-label` left out, comma-separated, so
/// that a profile read back and written again leaves them out too.
pub const DROPPED_COMMENT: &str = "dropped labels: ";

/// Sample label: how the native user stack was unwound ([`symbolizer::unwind::UnwindStatus::kind`]).
pub const UNWIND_LABEL: &str = "unwind";
/// Sample label: why it is not complete ([`symbolizer::unwind::UnwindStatus::reason`]).
pub const UNWIND_REASON_LABEL: &str = "unwind.reason";
/// Sample label of an off-CPU sample: why the thread was blocked
/// ([`OffCpuReason::name`](crate::profile::OffCpuReason::name)).
pub const OFF_CPU_REASON_LABEL: &str = "off_cpu.reason";

/// Sample type: on-CPU perf events.
pub const SAMPLES_TYPE: (&str, &str) = ("samples", "count");
/// Sample type (and the period type): CPU time.
pub const CPU_TYPE: (&str, &str) = ("cpu", "nanoseconds");
/// Sample type: time blocked.
pub const OFF_CPU_TYPE: (&str, &str) = ("off_cpu", "nanoseconds");
/// Sample type: CPU and blocked time in one value.
pub const WALL_TYPE: (&str, &str) = ("wall", "nanoseconds");
/// Sample type: allocations made (`--event alloc`).
pub const ALLOC_OBJECTS_TYPE: (&str, &str) = ("alloc_objects", "count");
/// Sample type: bytes allocated (`--event alloc`).
pub const ALLOC_SPACE_TYPE: (&str, &str) = ("alloc_space", "bytes");
/// Sample type: allocations not freed at the end (`--event heap`).
pub const INUSE_OBJECTS_TYPE: (&str, &str) = ("inuse_objects", "count");
/// Sample type: bytes not freed at the end (`--event heap`).
pub const INUSE_SPACE_TYPE: (&str, &str) = ("inuse_space", "bytes");
/// The period type of a memory profile, as Go writes it: the period is the average number of
/// bytes allocated between two sampled allocations ([`Events::alloc_rate`]).
pub const SPACE_TYPE: (&str, &str) = ("space", "bytes");

/// The sample types of a profile, chosen by its [`Events`] (see the module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `--event cpu`: `[samples/count, cpu/nanoseconds]`.
    Cpu,
    /// `--event offcpu`: `[off_cpu/nanoseconds]`, each value [`Profile::weight`].
    OffCpu,
    /// `--event cpu,offcpu`: `[samples/count, cpu/nanoseconds, off_cpu/nanoseconds]`.
    CpuAndOffCpu,
    /// `--event wall`: `[wall/nanoseconds]`, each value [`Profile::weight`].
    Wall,
    /// `--event alloc`: `[alloc_objects/count, alloc_space/bytes]`.
    Alloc,
    /// `--event heap`: `[inuse_objects/count, inuse_space/bytes]`.
    Heap,
    /// `--event alloc,heap`: `[alloc_objects/count, alloc_space/bytes, inuse_objects/count,
    /// inuse_space/bytes]`, the order of Go's heap profiles.
    AllocAndHeap,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 7] = [
        Shape::Cpu,
        Shape::OffCpu,
        Shape::CpuAndOffCpu,
        Shape::Wall,
        Shape::Alloc,
        Shape::Heap,
        Shape::AllocAndHeap,
    ];

    /// The shape that holds a profile of these events: memory events win over time events (they
    /// do not combine: [`Profile::weight`] is bytes then), `wall` over the other time events.
    pub fn of(events: Events) -> Shape {
        match events {
            Events {
                alloc: true,
                heap: true,
                ..
            } => Shape::AllocAndHeap,
            Events { heap: true, .. } => Shape::Heap,
            Events { alloc: true, .. } => Shape::Alloc,
            Events { wall: true, .. } => Shape::Wall,
            Events {
                cpu: true,
                off_cpu: true,
                ..
            } => Shape::CpuAndOffCpu,
            Events { off_cpu: true, .. } => Shape::OffCpu,
            _ => Shape::Cpu,
        }
    }

    /// The events of a profile read back from a file of this shape (`wall` implies both). A
    /// memory shape gives the default [`Events::alloc_rate`]: the file's period says which.
    pub fn events(self) -> Events {
        let (cpu, off_cpu, wall) = match self {
            Shape::Cpu => (true, false, false),
            Shape::OffCpu => (false, true, false),
            Shape::CpuAndOffCpu => (true, true, false),
            Shape::Wall => (true, true, true),
            Shape::Alloc | Shape::Heap | Shape::AllocAndHeap => (false, false, false),
        };
        Events {
            cpu,
            off_cpu,
            wall,
            alloc: matches!(self, Shape::Alloc | Shape::AllocAndHeap),
            heap: matches!(self, Shape::Heap | Shape::AllocAndHeap),
            ..Events::default()
        }
    }

    /// Whether the values are allocations and bytes (`--event alloc`, `heap`).
    pub fn is_memory(self) -> bool {
        matches!(self, Shape::Alloc | Shape::Heap | Shape::AllocAndHeap)
    }

    /// The period type: [`SPACE_TYPE`] for a memory shape, else [`CPU_TYPE`].
    pub fn period_type(self) -> (&'static str, &'static str) {
        if self.is_memory() {
            SPACE_TYPE
        } else {
            CPU_TYPE
        }
    }

    /// The period: [`Events::alloc_rate`] bytes for a memory shape (at least 1), else `1e9 /
    /// frequency` nanoseconds.
    pub fn period(self, profile: &Profile) -> u64 {
        if self.is_memory() {
            profile.meta.events.alloc_rate.max(1)
        } else {
            profile.meta.period_ns()
        }
    }

    /// The `(type, unit)` of each sample value, in order.
    pub fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Shape::Cpu => &[SAMPLES_TYPE, CPU_TYPE],
            Shape::OffCpu => &[OFF_CPU_TYPE],
            Shape::CpuAndOffCpu => &[SAMPLES_TYPE, CPU_TYPE, OFF_CPU_TYPE],
            Shape::Wall => &[WALL_TYPE],
            Shape::Alloc => &[ALLOC_OBJECTS_TYPE, ALLOC_SPACE_TYPE],
            Shape::Heap => &[INUSE_OBJECTS_TYPE, INUSE_SPACE_TYPE],
            Shape::AllocAndHeap => &[
                ALLOC_OBJECTS_TYPE,
                ALLOC_SPACE_TYPE,
                INUSE_OBJECTS_TYPE,
                INUSE_SPACE_TYPE,
            ],
        }
    }

    /// The shape with exactly these sample types, in any order; `samples/count` alone is
    /// [`Shape::Cpu`] (as spanprof wrote it before the `cpu/nanoseconds` value).
    pub fn from_sample_types(types: &[(&str, &str)]) -> Option<Shape> {
        if types == [SAMPLES_TYPE] {
            return Some(Shape::Cpu);
        }
        let mut types = types.to_vec();
        types.sort_unstable();
        Shape::ALL.into_iter().find(|shape| {
            let mut own = shape.sample_types().to_vec();
            own.sort_unstable();
            own == types
        })
    }

    /// The type whose name `default_sample_type` gives, if any.
    ///
    /// NB: with one value there is nothing to choose. With `cpu,offcpu` the user asked for the
    /// off-CPU time on top of the default on-CPU profile, so that is what they want to see first
    /// (`-sample_index=cpu` gives the CPU time in the same unit); it is also the last type, the
    /// one that clients ignoring the field show, so every tool opens the same view.
    ///
    /// A memory profile opens on bytes: `inuse_space` when the heap is in it (what `go tool
    /// pprof` shows of a Go heap profile), else `alloc_space`; again the last type.
    pub fn default_sample_type(self) -> Option<&'static str> {
        match self {
            Shape::CpuAndOffCpu => Some(OFF_CPU_TYPE.0),
            Shape::Alloc => Some(ALLOC_SPACE_TYPE.0),
            Shape::Heap | Shape::AllocAndHeap => Some(INUSE_SPACE_TYPE.0),
            Shape::Cpu | Shape::OffCpu | Shape::Wall => None,
        }
    }

    /// The values of one sample, in [`Shape::sample_types`] order.
    fn values(self, profile: &Profile, sample: &crate::profile::Sample) -> Vec<i64> {
        match self {
            Shape::Cpu => vec![
                saturating_i64(sample.count),
                saturating_i64(sample.count.saturating_mul(profile.meta.period_ns())),
            ],
            Shape::CpuAndOffCpu => vec![
                saturating_i64(sample.count),
                saturating_i64(sample.count.saturating_mul(profile.meta.period_ns())),
                saturating_i64(sample.off_cpu_ns),
            ],
            Shape::OffCpu | Shape::Wall => vec![saturating_i64(profile.weight(sample))],
            Shape::Alloc => vec![
                saturating_i64(sample.alloc.objects),
                saturating_i64(sample.alloc.bytes),
            ],
            Shape::Heap => vec![
                saturating_i64(sample.inuse.objects),
                saturating_i64(sample.inuse.bytes),
            ],
            Shape::AllocAndHeap => vec![
                saturating_i64(sample.alloc.objects),
                saturating_i64(sample.alloc.bytes),
                saturating_i64(sample.inuse.objects),
                saturating_i64(sample.inuse.bytes),
            ],
        }
    }
}

/// Renders the profile as a gzipped `profile.proto`.
pub fn render(profile: &Profile) -> Result<Vec<u8>, OutputError> {
    let encoded = build(profile)?.encode_to_vec();
    let mut gz = GzEncoder::new(
        Vec::with_capacity(encoded.len() / 4),
        Compression::default(),
    );
    gz.write_all(&encoded).map_err(OutputError::Gzip)?;
    gz.finish().map_err(OutputError::Gzip)
}

/// Builds the (uncompressed) pprof message for the profile.
pub fn build(profile: &Profile) -> Result<PprofProfile, OutputError> {
    validate(profile)?;
    let meta = &profile.meta;
    let mut b = Builder::default();
    // NB: profile.proto requires string_table[0] == "", and index 0 means "unset" everywhere.
    b.strings.intern("");

    let shape = Shape::of(meta.events);
    // A profile without a rate (read from folded stacks) has counts but no times.
    let types = match shape {
        Shape::Cpu if meta.frequency == 0 => &[SAMPLES_TYPE][..],
        _ => shape.sample_types(),
    };
    let sample_type: Vec<ValueType> = types
        .iter()
        .map(|&(ty, unit)| ValueType {
            ty: b.strings.intern(ty),
            unit: b.strings.intern(unit),
        })
        .collect();
    let default_sample_type = shape
        .default_sample_type()
        .map_or(0, |ty| b.strings.intern(ty));
    // NB: every time shape keeps the on-CPU period, so counts convert to time in any of them; a
    // memory shape has Go's `space/bytes`, its period the bytes between two sampled allocations.
    let (period_ty, period_unit) = shape.period_type();
    let period_type = Some(ValueType {
        ty: b.strings.intern(period_ty),
        unit: b.strings.intern(period_unit),
    });
    let thread_id = b.strings.intern("thread.id");
    let thread_name = b.strings.intern("thread.name");
    let process_id = b.strings.intern("process.id");

    let mut comment = vec![b
        .strings
        .intern(&format!("{TARGET_COMMENT}{}", meta.target))];
    if meta.lost_samples > 0 {
        comment.push(
            b.strings
                .intern(&format!("{LOST_COMMENT}{}", meta.lost_samples)),
        );
    }
    let facts = [
        (HOST_COMMENT, meta.host.as_ref().map(|h| h.name.as_str())),
        (COMMIT_COMMENT, meta.build.commit.as_deref()),
        (BRANCH_COMMENT, meta.build.branch.as_deref()),
    ];
    for (prefix, value) in facts {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            comment.push(b.strings.intern(&format!("{prefix}{v}")));
        }
    }
    for p in &profile.processes {
        comment.push(
            b.strings
                .intern(&format!("{PROCESS_COMMENT}{} ({})", p.pid, p.name)),
        );
    }
    if !meta.dropped_labels.is_empty() {
        comment.push(b.strings.intern(&format!(
            "{DROPPED_COMMENT}{}",
            meta.dropped_labels.join(", ")
        )));
    }
    for module in profile.interpreter_modules() {
        comment.push(b.strings.intern(&format!("{INTERPRETER_COMMENT}{module}")));
    }

    // The target's executable is the first mapping, which pprof prints as the profile's
    // `File:`: that of the first process whose executable has a frame in the profile.
    let exe_frame = profile.processes.iter().find_map(|process| {
        // NB: /proc/PID/exe of a replaced binary ends in ` (deleted)`; module paths do not.
        let exe = process.info.exe_path.as_deref()?;
        let exe = exe.strip_suffix(" (deleted)").unwrap_or(exe);
        profile
            .frames
            .iter()
            .find(|f| f.kind == FrameKind::Native && f.module.as_deref() == Some(exe))
    });
    if let Some(frame) = exe_frame {
        b.mapping(frame);
    }
    let mut location_of_frame: Vec<Option<u64>> = vec![None; profile.frames.len()];
    let mut location_of_group: HashMap<Box<[u32]>, u64> = HashMap::new();
    let mut samples = Vec::with_capacity(profile.samples.len());
    for sample in &profile.samples {
        let mut value = shape.values(profile, sample);
        value.truncate(types.len());
        // NB: a memory sample with nothing in this file's types (in a heap-only profile, a stack
        // whose sampled allocations were all freed) is left out; time samples are all written,
        // as they always were.
        if shape.is_memory() && value.iter().all(|&v| v == 0) {
            continue;
        }
        let thread = &profile.threads[sample.thread as usize];
        // Leaf first, as pprof wants them (and as locations were always numbered).
        let groups: Vec<&[u32]> = profile.inline_groups(&sample.frames).collect();
        let mut location_id = Vec::with_capacity(groups.len());
        for &group in groups.iter().rev() {
            let frame = |id: &u32| &profile.frames[*id as usize];
            let id = match group {
                &[one] => *location_of_frame[one as usize]
                    .get_or_insert_with(|| b.location(&[frame(&one)])),
                // Keyed by the whole group: a folded file's frames have no address that
                // would tell two call sites apart.
                _ => match location_of_group.get(group) {
                    Some(&id) => id,
                    None => {
                        let id = b.location(&group.iter().map(frame).collect::<Vec<_>>());
                        location_of_group.insert(group.into(), id);
                        id
                    }
                },
            };
            location_id.push(id);
        }
        let mut label = vec![
            Label {
                key: thread_id,
                num: i64::from(thread.tid),
                ..Label::default()
            },
            Label {
                key: thread_name,
                str: b.strings.intern(&thread.name),
                ..Label::default()
            },
            Label {
                key: process_id,
                num: i64::from(thread.pid),
                ..Label::default()
            },
        ];
        // How the native stack was unwound: `unwind` = complete | truncated | failed | unchecked,
        // and `unwind.reason` when it is not complete.
        label.push(Label {
            key: b.strings.intern(UNWIND_LABEL),
            str: b.strings.intern(sample.unwind.kind()),
            ..Label::default()
        });
        if let Some(reason) = sample.unwind.reason() {
            label.push(Label {
                key: b.strings.intern(UNWIND_REASON_LABEL),
                str: b.strings.intern(reason),
                ..Label::default()
            });
        }
        if let Some(reason) = sample.off_cpu {
            label.push(Label {
                key: b.strings.intern(OFF_CPU_REASON_LABEL),
                str: b.strings.intern(reason.name()),
                ..Label::default()
            });
        }
        if let Some(span) = profile.span_of(sample) {
            for (key, value) in span.labels(meta.derives_links()) {
                label.push(Label {
                    key: b.strings.intern(key),
                    str: b.strings.intern(&value),
                    ..Label::default()
                });
            }
        }
        if !meta.dropped_labels.is_empty() {
            let strings = &b.strings.strings;
            label.retain(|l| {
                let key = usize::try_from(l.key).ok().and_then(|k| strings.get(k));
                !key.is_some_and(|k| meta.dropped_labels.contains(k))
            });
        }
        samples.push(Sample {
            location_id,
            value,
            label,
        });
    }

    Ok(PprofProfile {
        sample_type,
        sample: samples,
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: nanos(
            meta.start
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO),
        ),
        duration_nanos: nanos(meta.duration),
        period_type,
        period: saturating_i64(shape.period(profile)),
        comment,
        default_sample_type,
    })
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// `profile.proto`'s string table: index 0 is `""`, every string appears once.
#[derive(Debug, Default)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The interned tables of a pprof profile under construction.
#[derive(Debug, Default)]
struct Builder {
    strings: StringTable,
    mappings: Vec<Mapping>,
    /// Mapping filename and build id (string indexes) to index in `mappings`.
    mapping_index: HashMap<(i64, i64), usize>,
    functions: Vec<Function>,
    /// (name, filename) string indexes and start line to function id.
    function_ids: HashMap<(i64, i64, i64), u64>,
    locations: Vec<Location>,
}

impl Builder {
    /// Adds a location for `group` and returns its id: a frame, or a native frame and the
    /// functions inlined into it ([`FrameKind::Inlined`], outermost first), as one location
    /// of several lines, the innermost first and the frame they were inlined into last.
    fn location(&mut self, group: &[&Frame]) -> u64 {
        let holder = group[0];
        let mapping_id = self.mapping(holder);
        if group.len() > 1 && mapping_id != 0 {
            // NB: ids are indexes + 1.
            self.mappings[mapping_id as usize - 1].has_inline_frames = true;
        }
        // An address that could not be named is left as that, an address in its mapping and
        // no line, for pprof tools to symbolize from a file with symbols (found by the
        // mapping's build id or name): a made-up function would be taken as its name.
        let unnamed =
            group.len() == 1 && holder.function.is_none() && holder.kind != FrameKind::Python;
        let line = if unnamed {
            Vec::new()
        } else {
            group
                .iter()
                .rev()
                .map(|frame| Line {
                    function_id: self.function(frame),
                    line: frame.line.map_or(0, i64::from),
                })
                .collect()
        };
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id,
            address: holder.address,
            line,
            is_folded: false,
        });
        id
    }

    /// The id of `frame`'s function (its name, file and first line).
    fn function(&mut self, frame: &Frame) -> u64 {
        let name = match &frame.function {
            Some(function) => self.strings.intern(function),
            None => self.strings.intern(&frame.base_name()),
        };
        let filename = match &frame.file {
            Some(file) => self.strings.intern(file),
            None => 0,
        };
        let start_line = frame.start_line.map_or(0, i64::from);
        let next_id = self.functions.len() as u64 + 1;
        let function_id = *self
            .function_ids
            .entry((name, filename, start_line))
            .or_insert(next_id);
        if function_id == next_id {
            self.functions.push(Function {
                id: function_id,
                name,
                // NB: only the demangled name is known; pprof shows `name` by default.
                system_name: name,
                filename,
                start_line,
            });
        }
        function_id
    }

    /// The id of the mapping `frame` belongs to, 0 when it has no module.
    fn mapping(&mut self, frame: &Frame) -> u64 {
        let module = match (frame.kind, &frame.module) {
            (FrameKind::Kernel, _) => KERNEL_MAPPING,
            (FrameKind::Python, _) => PYTHON_MAPPING,
            (FrameKind::Native | FrameKind::Inlined, Some(module)) => module.as_str(),
            (FrameKind::Native | FrameKind::Inlined, None) => return 0,
        };
        let filename = self.strings.intern(module);
        // NB: two files of one path (a container's library and the host's) are two mappings,
        // told apart by their build ids.
        let build_id = match (frame.kind, frame.ids.as_deref()) {
            (FrameKind::Native | FrameKind::Inlined, Some(ModuleIds { gnu: Some(id), .. })) => {
                self.strings.intern(id)
            }
            _ => 0,
        };
        let index = *self
            .mapping_index
            .entry((filename, build_id))
            .or_insert_with(|| {
                self.mappings.push(Mapping {
                    id: self.mappings.len() as u64 + 1,
                    filename,
                    build_id,
                    ..Mapping::default()
                });
                self.mappings.len() - 1
            });
        let mapping = &mut self.mappings[index];
        // Addresses are module-relative, so the mapping spans [0, highest address].
        mapping.memory_limit = mapping.memory_limit.max(frame.address.saturating_add(1));
        // Only symbolized names count: a mapping whose frames are all unknown may still be
        // symbolized later by pprof tools from a binary with symbols.
        mapping.has_functions |= frame.function.is_some();
        mapping.has_filenames |= frame.file.is_some();
        mapping.has_line_numbers |= frame.line.is_some();
        mapping.id
    }
}

#[cfg(test)]
mod tests;
