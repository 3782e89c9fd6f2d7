//! `spanprof report`: a profile read back from a pprof file spanprof wrote, and filtered by span.
//!
//! # Overview
//!
//! [`read_pprof`] turns the bytes of a `.pb.gz` (or plain `profile.proto`) that
//! [`crate::output::pprof`] wrote back into the [`Profile`] it came from, so every sink of
//! [`crate::output`] can render it again: a replayed file feeds the same sinks as a live session.
//! [`Filter`] then keeps the samples of one trace or span, one measure ([`EventFilter`]) or some
//! threads ([`Profile::retain_samples`]).
//!
//! What comes back, from what the writer put in the file:
//!
//! - frames from locations: the function's name, file and line, the location's address; the
//!   mapping tells the kind (`[kernel.kallsyms]`: kernel, `[python]`: Python, another file: a
//!   native frame of that module, none: a native placeholder such as `[truncated]`). A function
//!   named `[unknown] (libfoo.so+0x1234)` that matches its mapping and address is an unknown
//!   frame again (no function name), so it reads the same everywhere;
//! - threads from the `thread.id`, `thread.name` and `process.id` labels, processes from the
//!   `process: PID (name)` comments (from the threads for files without them), span contexts from
//!   the span labels ([`crate::profile::labels`]);
//! - what was profiled ([`Meta::events`]) from the sample types, by name ([`Shape`], in any
//!   order): `samples/count` alone is an on-CPU profile (every file written before off-CPU
//!   profiling), `off_cpu/nanoseconds` alone `--event offcpu`, `samples/count`,
//!   `cpu/nanoseconds`, `off_cpu/nanoseconds` `--event cpu,offcpu`, `wall/nanoseconds` alone
//!   `--event wall` (which implies both); `alloc_objects/count`, `alloc_space/bytes`
//!   `--event alloc`, `inuse_objects/count`, `inuse_space/bytes` `--event heap`, all four
//!   `--event alloc,heap` (see [`crate::output::pprof`]);
//! - each sample's count and off-CPU nanoseconds from its values, and why it was off CPU from
//!   its `off_cpu.reason` label ([`OFF_CPU_REASON_LABEL`]): a sample with the label is off-CPU,
//!   one without on-CPU. A single `…/nanoseconds` value is the sample's [`Profile::weight`]:
//!   blocked time for an off-CPU sample, `count * period` for an on-CPU one. A reason this
//!   version does not know reads as [`OffCpuReason::Other`], as an unknown `unwind` label reads
//!   as unchecked: the stack's `[off-cpu: …]` root frame still names it;
//! - a memory sample's allocations and bytes ([`Sample::alloc`], [`Sample::inuse`]) from its
//!   values, those of the types in the file (the others stay 0: a `heap` file does not say
//!   what was allocated in all); its count and off-CPU time are 0;
//! - the session's target, lost samples, host name, commit and branch from the comments, its
//!   start and length from `time_nanos` and `duration_nanos`, the frequency from the period
//!   (`1e9 / period`, rounded: exact for 1–10000 Hz); a memory profile's sampling rate
//!   ([`Events::alloc_rate`](crate::profile::Events::alloc_rate)) from its period (`space/bytes`).
//!
//! Not in the file, so not back: why an unknown frame is unknown, the Python walker's counts,
//! and a memory profile's frequency (sampled by bytes, it reads back as 0; no output shows it).
//!
//! # Design constraints
//!
//! A file spanprof did not write (another profiler's pprof, any other file) is refused with a
//! one-line reason rather than half read: the sample types must be one of the [`Shape`]s, the
//! period type `cpu/nanoseconds` (`space/bytes` for a memory shape), and a `target:` comment
//! must be there. Values that contradict each other are refused as damaged: a `cpu/nanoseconds`
//! value other than `count * period`, an off-CPU sample with on-CPU samples, off-CPU time
//! without a reason, on-CPU time that is not a whole number of periods, bytes without
//! allocations, an off-CPU reason in a memory profile.

use std::{
    collections::HashMap,
    fmt,
    io::{self, Read},
    time::{Duration, UNIX_EPOCH},
};

use ::pprof::protos::{Message, Profile as PprofProfile};
use flate2::read::GzDecoder;

use symbolizer::unwind::UnwindStatus;

use crate::offcpu::OffCpuReason;
use crate::output::pprof::{
    Shape, ALLOC_OBJECTS_TYPE, ALLOC_SPACE_TYPE, BRANCH_COMMENT, COMMIT_COMMENT, CPU_TYPE,
    DROPPED_COMMENT, HOST_COMMENT, INUSE_OBJECTS_TYPE, INUSE_SPACE_TYPE, KERNEL_MAPPING,
    LOST_COMMENT, OFF_CPU_REASON_LABEL, OFF_CPU_TYPE, PROCESS_COMMENT, PYTHON_MAPPING,
    SAMPLES_TYPE, TARGET_COMMENT, UNWIND_LABEL, UNWIND_REASON_LABEL,
};
use crate::profile::{
    hex, labels, uuid, Frame, FrameKind, Memory, Meta, OsProfilerIds, Process, Profile,
    PythonStats, Sample, SpanContext, SpanName, Thread,
};

/// Why a file could not be read back as a spanprof profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
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

/// Largest uncompressed profile read.
const MAX_PROFILE: u64 = 1 << 30;

/// Reads a pprof profile that spanprof wrote, gzipped or not, back into a [`Profile`].
pub fn read_pprof(bytes: &[u8]) -> Result<Profile, ReportError> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        // A bound against a gzip bomb: spanprof's profiles are far smaller.
        let mut raw = Vec::new();
        GzDecoder::new(bytes)
            .take(MAX_PROFILE + 1)
            .read_to_end(&mut raw)
            .map_err(ReportError::Gzip)?;
        if raw.len() as u64 > MAX_PROFILE {
            return Err(ReportError::Damaged(format!(
                "more than {} MiB uncompressed",
                MAX_PROFILE >> 20
            )));
        }
        raw
    } else {
        bytes.to_vec()
    };
    let p = PprofProfile::decode(raw.as_slice()).map_err(|e| ReportError::Decode(Box::new(e)))?;
    Reader { p: &p }.profile()
}

/// Most lines read from a folded file (a distinct stack each, as written).
const MAX_FOLDED_LINES: usize = 1 << 22;

/// Reads folded stacks (`root;…;leaf COUNT` per line, as spanprof, inferno, py-spy and
/// `stackcollapse-perf.pl` write them) into an on-CPU [`Profile`] of one unnamed thread, each
/// line's count its samples. Frame names are parsed as spanprof writes them: `name_[k]` is a
/// kernel frame, `qualname (file.py:LINE)` a Python one, anything else native. The file says
/// nothing of the sampling rate: the profile's frequency is 0 (shares compare, times do not).
pub fn read_folded(bytes: &[u8]) -> Result<Profile, ReportError> {
    let bad = |msg: String| ReportError::Folded(msg);
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8 text ({e})")))?;
    let mut frames: Vec<Frame> = Vec::new();
    let mut ids: HashMap<Frame, u32> = HashMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut total = 0u64;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if samples.len() >= MAX_FOLDED_LINES {
            return Err(bad(format!("more than {MAX_FOLDED_LINES} stacks")));
        }
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| bad(format!("line {}: no count after the stack", n + 1)))?;
        let count: u64 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("line {}: {count:?} is not a count", n + 1)))?;
        if stack.is_empty() {
            return Err(bad(format!("line {}: an empty stack", n + 1)));
        }
        total = total
            .checked_add(count)
            .ok_or_else(|| bad(format!("line {}: the counts add up past 2^64", n + 1)))?;
        let mut of_line = Vec::new();
        for name in stack.split(';') {
            let frame = folded_frame(name);
            let index = *ids.entry(frame).or_insert_with_key(|f| {
                frames.push(f.clone());
                frames.len() as u32 - 1
            });
            of_line.push(index);
        }
        samples.push(Sample {
            frames: of_line,
            thread: 0,
            count,
            off_cpu_ns: 0,
            off_cpu: None,
            alloc: Memory::default(),
            inuse: Memory::default(),
            span: None,
            unwind: UnwindStatus::Unchecked,
            times: Vec::new(),
            inuse_times: Vec::new(),
        });
    }
    Ok(Profile {
        meta: Meta {
            target: "folded stacks".to_string(),
            start: UNIX_EPOCH,
            duration: Duration::ZERO,
            frequency: 0,
            events: crate::profile::Events::default(),
            lost_samples: 0,
            python: PythonStats::default(),
            host: None,
            build: crate::profile::Build::default(),
            dropped_labels: Vec::new(),
        },
        frames,
        threads: vec![Thread {
            pid: 0,
            tid: 0,
            name: String::new(),
        }],
        processes: Vec::new(),
        samples,
        spans: Vec::new(),
    })
}

/// One folded frame name as a [`Frame`] (see [`read_folded`]).
fn folded_frame(name: &str) -> Frame {
    let frame = |kind, function: &str| Frame {
        kind,
        function: Some(function.to_string()),
        module: None,
        address: 0,
        file: None,
        line: None,
        unknown_reason: None,
    };
    if let Some(kernel) = name.strip_suffix("_[k]") {
        return Frame {
            module: Some(KERNEL_MAPPING.to_string()),
            ..frame(FrameKind::Kernel, kernel)
        };
    }
    // `qualname (file.py:LINE)` or `qualname (file.py)`.
    if let Some((qualname, rest)) = name.strip_suffix(')').and_then(|n| n.rsplit_once(" (")) {
        let (file, line) = match rest.rsplit_once(':') {
            Some((file, line)) => match line.parse::<u32>() {
                Ok(line) => (file, Some(line)),
                Err(_) => (rest, None),
            },
            None => (rest, None),
        };
        if file.ends_with(".py") && !qualname.is_empty() {
            return Frame {
                file: Some(file.to_string()),
                line,
                module: Some(PYTHON_MAPPING.to_string()),
                ..frame(FrameKind::Python, qualname)
            };
        }
    }
    frame(FrameKind::Native, name)
}

/// The decoded message, with string and table lookups that fail as [`ReportError::Damaged`].
struct Reader<'a> {
    p: &'a PprofProfile,
}

fn damaged(msg: impl Into<String>) -> ReportError {
    ReportError::Damaged(msg.into())
}

impl Reader<'_> {
    fn string(&self, i: i64) -> Result<&str, ReportError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| damaged(format!("string {i} is not in the string table")))
    }

    fn profile(&self) -> Result<Profile, ReportError> {
        let p = self.p;
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| Ok((self.string(t.ty)?, self.string(t.unit)?)))
            .collect::<Result<_, ReportError>>()?;
        let shape = Shape::from_sample_types(&types).ok_or_else(|| {
            let known: Vec<String> = Shape::ALL
                .iter()
                .map(|s| {
                    let types: Vec<String> = s
                        .sample_types()
                        .iter()
                        .map(|(t, u)| format!("{t}/{u}"))
                        .collect();
                    types.join(", ")
                })
                .collect();
            ReportError::Foreign(format!(
                "its sample types are {types:?}, not one of: {}",
                known.join("; ")
            ))
        })?;
        // Where each value is, by the type's name.
        let index = |ty: (&str, &str)| types.iter().position(|&t| t == ty);
        let period_type = match &p.period_type {
            Some(t) => (self.string(t.ty)?, self.string(t.unit)?),
            None => ("", ""),
        };
        if period_type != shape.period_type() || p.period <= 0 {
            let (ty, unit) = shape.period_type();
            return Err(ReportError::Foreign(format!(
                "its period is not in {ty}/{unit}"
            )));
        }
        let comments: Vec<&str> = p
            .comment
            .iter()
            .map(|&c| self.string(c))
            .collect::<Result<_, _>>()?;
        let target = comments
            .iter()
            .find_map(|c| c.strip_prefix(TARGET_COMMENT))
            .ok_or_else(|| ReportError::Foreign("no `target:` comment".to_string()))?;
        let lost_samples = comments
            .iter()
            .find_map(|c| c.strip_prefix(LOST_COMMENT))
            .map(|n| {
                n.parse()
                    .map_err(|_| damaged(format!("bad lost samples comment {n:?}")))
            })
            .transpose()?
            .unwrap_or(0);
        let comment = |prefix: &str| {
            comments
                .iter()
                .find_map(|c| c.strip_prefix(prefix))
                .map(str::to_string)
        };
        let host = comment(HOST_COMMENT).map(|name| crate::resource::HostInfo { name, id: None });
        let build = crate::profile::Build {
            commit: comment(COMMIT_COMMENT),
            branch: comment(BRANCH_COMMENT),
        };
        let dropped_labels: Vec<String> = comment(DROPPED_COMMENT)
            .map(|list| {
                list.split(", ")
                    .filter(|k| crate::privacy::DROPPABLE.contains(k))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let mut processes = comments
            .iter()
            .filter_map(|c| c.strip_prefix(PROCESS_COMMENT))
            .map(|c| {
                let (pid, name) = c
                    .split_once(" (")
                    .and_then(|(pid, rest)| Some((pid.parse().ok()?, rest.strip_suffix(')')?)))
                    .ok_or_else(|| damaged(format!("bad process comment {c:?}")))?;
                Ok(Process {
                    pid,
                    name: name.to_string(),
                    info: Default::default(),
                })
            })
            .collect::<Result<Vec<_>, ReportError>>()?;

        let period = u64::try_from(p.period).unwrap_or(1);
        let mut events = shape.events();
        // NB: a memory profile is sampled by bytes, not by time: its period is the rate, and the
        // frequency is in no output, so not in the file.
        let frequency = if shape.is_memory() {
            events.alloc_rate = period;
            0
        } else {
            ((1e9 / period as f64).round() as u64).max(1)
        };
        let meta = Meta {
            target: target.to_string(),
            start: UNIX_EPOCH + Duration::from_nanos(u64::try_from(p.time_nanos).unwrap_or(0)),
            duration: Duration::from_nanos(u64::try_from(p.duration_nanos).unwrap_or(0)),
            frequency,
            events,
            lost_samples,
            python: PythonStats::default(),
            host,
            build,
            dropped_labels,
        };

        let (frames, frame_of_location) = self.frames()?;
        let mut threads: Vec<Thread> = Vec::new();
        let mut thread_ids: HashMap<Thread, u32> = HashMap::new();
        let mut spans: Vec<SpanContext> = Vec::new();
        let mut span_ids: HashMap<SpanContext, u32> = HashMap::new();
        let mut samples = Vec::with_capacity(p.sample.len());
        for (i, s) in p.sample.iter().enumerate() {
            let mut frames_of = s
                .location_id
                .iter()
                .map(|id| {
                    frame_of_location.get(id).copied().ok_or_else(|| {
                        damaged(format!("sample {i} refers to missing location {id}"))
                    })
                })
                .collect::<Result<Vec<u32>, _>>()?;
            // pprof stacks are leaf first, ours root first.
            frames_of.reverse();
            let SampleLabels {
                thread,
                span,
                unwind,
                off_cpu,
            } = self.labels(i, s, &meta.dropped_labels)?;
            let thread = *thread_ids.entry(thread).or_insert_with_key(|t| {
                threads.push(t.clone());
                threads.len() as u32 - 1
            });
            let span = span.map(|span| {
                *span_ids.entry(span).or_insert_with_key(|s| {
                    spans.push(*s);
                    spans.len() as u32 - 1
                })
            });
            if s.value.len() != types.len() {
                return Err(damaged(format!(
                    "sample {i} has {} values for {} sample types",
                    s.value.len(),
                    types.len()
                )));
            }
            let value = |ty| -> Result<u64, ReportError> {
                let v = index(ty).map_or(0, |k| s.value[k]);
                u64::try_from(v).map_err(|_| damaged(format!("sample {i} has a negative value")))
            };
            let memory = |objects, bytes| -> Result<Memory, ReportError> {
                let m = Memory {
                    objects: value(objects)?,
                    bytes: value(bytes)?,
                };
                // NB: every sampled allocation counts at least once, so bytes come with
                // allocations (an allocation of 0 bytes may come without bytes).
                if m.bytes > 0 && m.objects == 0 {
                    return Err(damaged(format!(
                        "sample {i}: its {}/{} has bytes but its {}/{} no allocations",
                        bytes.0, bytes.1, objects.0, objects.1
                    )));
                }
                Ok(m)
            };
            let (alloc, inuse) = match shape {
                Shape::Alloc | Shape::AllocAndHeap => (
                    memory(ALLOC_OBJECTS_TYPE, ALLOC_SPACE_TYPE)?,
                    if shape == Shape::AllocAndHeap {
                        memory(INUSE_OBJECTS_TYPE, INUSE_SPACE_TYPE)?
                    } else {
                        Memory::default()
                    },
                ),
                Shape::Heap => (
                    Memory::default(),
                    memory(INUSE_OBJECTS_TYPE, INUSE_SPACE_TYPE)?,
                ),
                Shape::Cpu | Shape::OffCpu | Shape::CpuAndOffCpu | Shape::Wall => {
                    (Memory::default(), Memory::default())
                }
            };
            if shape.is_memory() && off_cpu.is_some() {
                return Err(damaged(format!(
                    "sample {i} has an {OFF_CPU_REASON_LABEL} label in a memory profile"
                )));
            }
            let (count, off_cpu_ns) = match shape {
                // Memory profiles count no time.
                Shape::Alloc | Shape::Heap | Shape::AllocAndHeap => (0, 0),
                Shape::Cpu => (value(SAMPLES_TYPE)?, 0),
                Shape::CpuAndOffCpu => {
                    let count = value(SAMPLES_TYPE)?;
                    if value(CPU_TYPE)? != count.saturating_mul(period) {
                        return Err(damaged(format!(
                            "sample {i}: its cpu/nanoseconds is not its count times the period"
                        )));
                    }
                    (count, value(OFF_CPU_TYPE)?)
                }
                // One value, the sample's weight: blocked time, or count * period on CPU.
                Shape::OffCpu | Shape::Wall => {
                    let ns = u64::try_from(s.value[0])
                        .map_err(|_| damaged(format!("sample {i} has a negative value")))?;
                    match off_cpu {
                        Some(_) => (0, ns),
                        None if ns % period == 0 => (ns / period, 0),
                        None => {
                            return Err(damaged(format!(
                                "sample {i}: {ns} ns on CPU is not a whole number of periods \
                                 ({period} ns)"
                            )))
                        }
                    }
                }
            };
            match off_cpu {
                Some(_) if count > 0 => {
                    return Err(damaged(format!(
                        "sample {i} has an {OFF_CPU_REASON_LABEL} label and on-CPU samples"
                    )))
                }
                None if off_cpu_ns > 0 => {
                    return Err(damaged(format!(
                        "sample {i} has off-CPU time but no {OFF_CPU_REASON_LABEL} label"
                    )))
                }
                _ => {}
            }
            samples.push(Sample {
                frames: frames_of,
                thread,
                count,
                off_cpu_ns,
                off_cpu,
                alloc,
                inuse,
                span,
                unwind,
                times: Vec::new(),
                inuse_times: Vec::new(),
            });
        }
        if processes.is_empty() {
            // Files without process comments: a process is named after its main thread, else
            // after the first of its threads.
            for t in &threads {
                match processes.iter_mut().find(|p| p.pid == t.pid) {
                    Some(p) if t.tid == t.pid => p.name = t.name.clone(),
                    Some(_) => {}
                    None => processes.push(Process {
                        pid: t.pid,
                        name: t.name.clone(),
                        info: Default::default(),
                    }),
                }
            }
            processes.sort_by_key(|p| p.pid);
        }
        Ok(Profile {
            meta,
            frames,
            threads,
            processes,
            samples,
            spans,
        })
    }

    /// One frame per location, and the frame index of each location id.
    fn frames(&self) -> Result<(Vec<Frame>, HashMap<u64, u32>), ReportError> {
        let p = self.p;
        let mappings: HashMap<u64, &str> = p
            .mapping
            .iter()
            .map(|m| Ok((m.id, self.string(m.filename)?)))
            .collect::<Result<_, ReportError>>()?;
        let functions: HashMap<u64, (&str, &str)> = p
            .function
            .iter()
            .map(|f| Ok((f.id, (self.string(f.name)?, self.string(f.filename)?))))
            .collect::<Result<_, ReportError>>()?;
        let mut frames: Vec<Frame> = Vec::with_capacity(p.location.len());
        let mut ids: HashMap<Frame, u32> = HashMap::new();
        let mut of_location = HashMap::with_capacity(p.location.len());
        for loc in &p.location {
            let [line] = loc.line.as_slice() else {
                return Err(damaged(format!(
                    "location {} has {} lines, not one",
                    loc.id,
                    loc.line.len()
                )));
            };
            let &(name, file) = functions.get(&line.function_id).ok_or_else(|| {
                damaged(format!(
                    "location {} refers to missing function {}",
                    loc.id, line.function_id
                ))
            })?;
            let mapping = match loc.mapping_id {
                0 => None,
                id => Some(*mappings.get(&id).ok_or_else(|| {
                    damaged(format!(
                        "location {} refers to missing mapping {id}",
                        loc.id
                    ))
                })?),
            };
            let (kind, module) = match mapping {
                Some(KERNEL_MAPPING) => (FrameKind::Kernel, Some(KERNEL_MAPPING)),
                Some(PYTHON_MAPPING) => (FrameKind::Python, None),
                module => (FrameKind::Native, module),
            };
            let mut frame = Frame {
                kind,
                function: None,
                module: module.map(str::to_string),
                address: loc.address,
                file: (!file.is_empty()).then(|| file.to_string()),
                line: u32::try_from(line.line).ok().filter(|&l| l != 0),
                unknown_reason: None,
            };
            // The writer names unknown frames `[unknown] (module+0x…)`: the same frame without a
            // function gives that name back.
            if kind == FrameKind::Python || frame.base_name() != name {
                frame.function = Some(name.to_string());
            } else {
                frame.unknown_reason = Some("no function name in the pprof file".to_string());
            }
            let index = *ids.entry(frame).or_insert_with_key(|f| {
                frames.push(f.clone());
                frames.len() as u32 - 1
            });
            of_location.insert(loc.id, index);
        }
        Ok((frames, of_location))
    }

    /// What the labels of sample `i` say.
    fn labels(
        &self,
        i: usize,
        s: &::pprof::protos::Sample,
        dropped_labels: &[String],
    ) -> Result<SampleLabels, ReportError> {
        let (mut tid, mut pid, mut name) = (None, None, None);
        let (mut unwind, mut unwind_reason) = (None, None);
        let mut off_cpu = None;
        let mut span = SpanContext::default();
        let mut osp: [Option<[u8; 16]>; 3] = [None; 3];
        for l in &s.label {
            let key = self.string(l.key)?;
            let value = || self.string(l.str);
            let bad = |what: &str| damaged(format!("sample {i}: bad {key} label: {what}"));
            let id = |v: i64| u32::try_from(v).map_err(|_| bad("not a 32-bit id"));
            match key {
                "thread.id" => tid = Some(id(l.num)?),
                "process.id" => pid = Some(id(l.num)?),
                "thread.name" => name = Some(value()?.to_string()),
                UNWIND_LABEL => unwind = Some(value()?),
                UNWIND_REASON_LABEL => unwind_reason = Some(value()?),
                // NB: a reason this version does not know is still off-CPU time, and its
                // `[off-cpu: …]` root frame names it; like `unwind`, it is not refused.
                OFF_CPU_REASON_LABEL => {
                    off_cpu = Some(OffCpuReason::from_name(value()?).unwrap_or(OffCpuReason::Other))
                }
                labels::TRACE_ID => {
                    span.trace_id = Some(parse_hex(value()?).ok_or_else(|| bad("not 32 hex"))?)
                }
                labels::SPAN_ID => {
                    span.span_id = Some(parse_hex(value()?).ok_or_else(|| bad("not 16 hex"))?)
                }
                // Cut as spanprof cuts names, so a longer name of another writer reads back
                // the way spanprof would have written it.
                labels::SPAN_NAME => span.span_name = SpanName::new(value()?),
                labels::OSP_NAME => span.osprofiler_name = SpanName::new(value()?),
                labels::OSP_BASE_ID | labels::OSP_TRACE_ID | labels::OSP_PARENT_ID => {
                    let slot = match key {
                        labels::OSP_BASE_ID => 0,
                        labels::OSP_TRACE_ID => 1,
                        _ => 2,
                    };
                    osp[slot] = Some(parse_uuid(value()?).ok_or_else(|| bad("not a UUID"))?);
                }
                // Labels of newer or other writers are not ours to refuse.
                _ => {}
            }
        }
        // A label `--drop-label` left out reads as unknown (0, no name); one missing otherwise
        // means the file is not spanprof's.
        let dropped = |label: &str| dropped_labels.iter().any(|d| d == label);
        let missing = |label: &str| damaged(format!("sample {i} has no {label} label"));
        let thread = Thread {
            pid: pid.map_or_else(
                || {
                    dropped("process.id")
                        .then_some(0)
                        .ok_or_else(|| missing("process.id"))
                },
                Ok,
            )?,
            tid: tid.map_or_else(
                || {
                    dropped("thread.id")
                        .then_some(0)
                        .ok_or_else(|| missing("thread.id"))
                },
                Ok,
            )?,
            name: name.map_or_else(
                || {
                    dropped("thread.name")
                        .then(String::new)
                        .ok_or_else(|| missing("thread.name"))
                },
                Ok,
            )?,
        };
        span.osprofiler = match osp {
            [Some(base_id), Some(trace_id), parent_id] => Some(OsProfilerIds {
                base_id,
                trace_id,
                parent_id,
            }),
            [None, None, None] => None,
            _ => {
                return Err(damaged(format!(
                    "sample {i} has OSProfiler labels without both {} and {}",
                    labels::OSP_BASE_ID,
                    labels::OSP_TRACE_ID
                )))
            }
        };
        // Files written before the label, by other writers, or with a reason this version does
        // not know: not checked by this version.
        let unwind = unwind
            .and_then(|kind| UnwindStatus::from_label(kind, unwind_reason))
            .unwrap_or(UnwindStatus::Unchecked);
        Ok(SampleLabels {
            thread,
            span: (!span.is_empty()).then_some(span),
            unwind,
            off_cpu,
        })
    }
}

/// What a sample's labels say.
struct SampleLabels {
    thread: Thread,
    /// The span context, if any.
    span: Option<SpanContext>,
    /// How the native stack was unwound.
    unwind: UnwindStatus,
    /// Why the thread was off CPU, for an off-CPU sample.
    off_cpu: Option<OffCpuReason>,
}

/// Parses exactly `2 * N` hex digits (either case) into bytes.
pub fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Parses a UUID, `8-4-4-4-12` or 32 hex digits (either case).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let dashed = s.len() == 36
        && s.char_indices()
            .all(|(i, c)| matches!(i, 8 | 13 | 18 | 23) == (c == '-'));
    if dashed {
        parse_hex(&s.replace('-', ""))
    } else {
        parse_hex(s)
    }
}

/// `--event` of `report`, `diff` and `check`: which of a profile's measures to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFilter {
    /// On-CPU samples only (of a `cpu,offcpu` or `wall` profile: then weighed in samples).
    Cpu,
    /// Off-CPU samples only.
    OffCpu,
    /// The allocations of an `alloc,heap` profile (weighed in bytes allocated).
    Alloc,
    /// The memory in use at the end of an `alloc,heap` profile.
    Heap,
}

impl EventFilter {
    /// Parses `cpu`, `offcpu`, `alloc` or `heap`.
    pub fn from_name(name: &str) -> Option<EventFilter> {
        Some(match name {
            "cpu" => EventFilter::Cpu,
            "offcpu" | "off-cpu" => EventFilter::OffCpu,
            "alloc" => EventFilter::Alloc,
            "heap" => EventFilter::Heap,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            EventFilter::Cpu => "cpu",
            EventFilter::OffCpu => "offcpu",
            EventFilter::Alloc => "alloc",
            EventFilter::Heap => "heap",
        }
    }

    /// Keeps that measure of `profile`; an error when the profile does not have it.
    fn apply(self, profile: &mut Profile) -> Result<(), String> {
        let e = &mut profile.meta.events;
        let has = match self {
            EventFilter::Cpu => e.cpu,
            EventFilter::OffCpu => e.off_cpu,
            EventFilter::Alloc => e.alloc,
            EventFilter::Heap => e.heap,
        };
        if !has {
            return Err(format!(
                "--event {}: the profile has no such samples (it was profiled with --event {})",
                self.name(),
                crate::analysis::event_names(profile).join(",")
            ));
        }
        match self {
            EventFilter::Cpu => {
                (e.off_cpu, e.wall) = (false, false);
                profile.retain_samples(|_, s| s.off_cpu.is_none());
            }
            EventFilter::OffCpu => {
                (e.cpu, e.wall) = (false, false);
                profile.retain_samples(|_, s| s.off_cpu.is_some());
            }
            EventFilter::Alloc => {
                e.heap = false;
                profile.retain_samples(|_, s| !s.alloc.is_empty());
            }
            EventFilter::Heap => {
                e.alloc = false;
                profile.retain_samples(|_, s| !s.inuse.is_empty());
            }
        }
        Ok(())
    }
}

/// Which samples `spanprof report` keeps: those of the threads and measure asked for, whose
/// span context has every id given and a name matching one of the `--span` globs (if any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `--event`: one measure of the profile.
    pub event: Option<EventFilter>,
    /// `--thread`: thread names or ids; a sample of any of them is kept.
    pub threads: Vec<String>,
    /// `--trace-id`: the OpenTelemetry trace id.
    pub trace_id: Option<[u8; 16]>,
    /// `--span-id`: the OpenTelemetry span id.
    pub span_id: Option<[u8; 8]>,
    /// `--base-id`: the OSProfiler base id (the whole request).
    pub base_id: Option<[u8; 16]>,
    /// `--osprofiler-id`: the OSProfiler trace point the thread was in (not its parents).
    pub osprofiler_id: Option<[u8; 16]>,
    /// `--span`: globs of span names (OpenTelemetry) or trace point names (OSProfiler); a
    /// sample in a span of any of them is kept.
    pub span_names: Vec<crate::analysis::Pattern>,
}

impl Filter {
    /// True when no id is asked for: every sample is kept.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether the filter keeps every sample whatever its span (no id asked for).
    fn no_ids(&self) -> bool {
        self.span_names.is_empty()
            && self.trace_id.is_none()
            && self.span_id.is_none()
            && self.base_id.is_none()
            && self.osprofiler_id.is_none()
    }

    /// Whether a sample of `thread` passes `--thread`.
    pub fn matches_thread(&self, thread: &Thread) -> bool {
        self.threads.is_empty()
            || self
                .threads
                .iter()
                .any(|t| *t == thread.name || t.parse() == Ok(thread.tid))
    }

    /// Whether a sample in `span` (`None`: in no span) passes every id given.
    pub fn matches(&self, span: Option<&SpanContext>) -> bool {
        if self.no_ids() {
            return true;
        }
        let Some(span) = span else {
            return false;
        };
        let osp = span.osprofiler.as_ref();
        let named = self.span_names.is_empty()
            || [span.span_name, span.osprofiler_name]
                .iter()
                .flatten()
                .any(|n| self.span_names.iter().any(|p| p.matches(n.as_str())));
        named
            && self.trace_id.is_none_or(|t| span.trace_id == Some(t))
            && self.span_id.is_none_or(|s| span.span_id == Some(s))
            && self
                .base_id
                .is_none_or(|b| osp.is_some_and(|o| o.base_id == b))
            && self
                .osprofiler_id
                .is_none_or(|t| osp.is_some_and(|o| o.trace_id == t))
    }

    /// Keeps the samples of `profile` that match, and the tables they use; an error when
    /// `--event` asks for a measure the profile does not have.
    pub fn apply(&self, profile: &mut Profile) -> Result<(), String> {
        if let Some(event) = self.event {
            event.apply(profile)?;
        }
        profile.retain_samples(|p, s| {
            self.matches(p.span_of(s)) && self.matches_thread(&p.threads[s.thread as usize])
        });
        Ok(())
    }
}

/// The filter as options, e.g. `--trace-id 4bf9… --span-id 00f0…`.
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(e) = self.event {
            parts.push(format!("--event {}", e.name()));
        }
        for t in &self.threads {
            parts.push(format!("--thread {t}"));
        }
        for n in &self.span_names {
            parts.push(format!("--span '{n}'"));
        }
        if let Some(t) = &self.trace_id {
            parts.push(format!("--trace-id {}", hex(t)));
        }
        if let Some(s) = &self.span_id {
            parts.push(format!("--span-id {}", hex(s)));
        }
        if let Some(b) = &self.base_id {
            parts.push(format!("--base-id {}", uuid(b)));
        }
        if let Some(o) = &self.osprofiler_id {
            parts.push(format!("--osprofiler-id {}", uuid(o)));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{self, fixture, Format};

    fn folded(profile: &Profile) -> String {
        String::from_utf8(output::render(profile, Format::Folded).unwrap()).unwrap()
    }

    fn round_trip(profile: &Profile) -> Profile {
        read_pprof(&output::render(profile, Format::Pprof).unwrap()).unwrap()
    }

    fn python_profile() -> Profile {
        let mut profile = fixture::with_spans();
        for (name, line) in [("handle", Some(12)), ("<module>", None)] {
            profile.frames.push(Frame {
                kind: FrameKind::Python,
                function: Some(name.to_string()),
                module: None,
                address: 0,
                file: Some("/srv/app.py".to_string()),
                line,
                unknown_reason: None,
            });
        }
        profile.frames.push(Frame {
            kind: FrameKind::Native,
            function: Some("[truncated]".to_string()),
            module: None,
            address: 0,
            file: None,
            line: None,
            unknown_reason: None,
        });
        profile.samples[0].frames.extend([6, 5]);
        profile.samples[1].frames.insert(0, 7);
        profile.samples[0].unwind = UnwindStatus::Complete;
        profile.samples[1].unwind =
            UnwindStatus::Truncated(symbolizer::unwind::TruncatedBy::StackCopy);
        profile
    }

    #[test]
    fn run_facts_come_back() {
        let mut profile = fixture::profile();
        profile.meta.host = Some(crate::resource::HostInfo {
            name: "ci-runner-7".to_string(),
            id: Some("0123456789abcdef".to_string()),
        });
        profile.meta.build = crate::profile::Build::from_vars(|name| match name {
            "CI_COMMIT_SHA" => Some(" 9fceb02d0ae598e95dc970b74767f19372d61af8\n".to_string()),
            "GITHUB_REF_NAME" => Some(String::new()),
            "CI_COMMIT_REF_NAME" => Some("feature/faster".to_string()),
            _ => None,
        });
        assert_eq!(
            profile.meta.build.commit.as_deref(),
            Some("9fceb02d0ae598e95dc970b74767f19372d61af8")
        );
        let back = round_trip(&profile);
        assert_eq!(back.meta.build, profile.meta.build);
        // The machine id is not in the file.
        assert_eq!(
            back.meta.host,
            Some(crate::resource::HostInfo {
                name: "ci-runner-7".to_string(),
                id: None
            })
        );
        let long = crate::profile::Build::from_vars(|_| Some("é".repeat(150)));
        assert_eq!(long.commit.as_deref().map(str::len), Some(200));
    }

    #[test]
    fn round_trip_gives_the_same_outputs() {
        let profile = python_profile();
        let back = round_trip(&profile);
        assert_eq!(folded(&back), folded(&profile));
        assert!(folded(&back).contains("main;compute;<module> (app.py);handle (app.py:12) 5"));
        for format in [Format::Pprof, Format::Speedscope, Format::Svg] {
            assert_eq!(
                output::render(&back, format).unwrap(),
                output::render(&profile, format).unwrap(),
                "{format}"
            );
        }
        assert_eq!(back.meta, profile.meta.clone());
        assert_eq!(back.threads, profile.threads);
        assert_eq!(back.processes, profile.processes);
        assert_eq!(back.spans, profile.spans);
        // The same stacks of the same frames (the frame table is in another order), but for why
        // an unknown frame is unknown, and the kernel's module, which pprof names its own way.
        let mut frames = profile.frames.clone();
        frames[2].unknown_reason = Some("no function name in the pprof file".to_string());
        frames[3].module = Some(KERNEL_MAPPING.to_string());
        type Stack = (Vec<Frame>, u32, u64, Option<u32>, UnwindStatus);
        let stacks = |p: &Profile, frames: &[Frame]| -> Vec<Stack> {
            p.samples
                .iter()
                .map(|s| {
                    let stack = s.frames.iter().map(|&f| frames[f as usize].clone());
                    (stack.collect(), s.thread, s.count, s.span, s.unwind)
                })
                .collect()
        };
        assert_eq!(stacks(&back, &back.frames), stacks(&profile, &frames));
        // Grouped, too.
        let grouped = profile.grouped(crate::profile::GroupBy::Span);
        assert_eq!(folded(&round_trip(&grouped)), folded(&grouped));
    }

    #[test]
    fn off_cpu_round_trips_in_every_shape() {
        for profile in [fixture::off_cpu(), fixture::off_cpu_only(), fixture::wall()] {
            let back = round_trip(&profile);
            let events = profile.meta.events;
            assert_eq!(back.meta, profile.meta, "{events:?}");
            for format in Format::ALL {
                assert_eq!(
                    output::render(&back, format).unwrap(),
                    output::render(&profile, format).unwrap(),
                    "{format} {events:?}"
                );
            }
            type Values = (
                u32,
                u64,
                u64,
                Option<OffCpuReason>,
                Option<u32>,
                UnwindStatus,
            );
            let values = |p: &Profile| -> Vec<Values> {
                p.samples
                    .iter()
                    .map(|s| (s.thread, s.count, s.off_cpu_ns, s.off_cpu, s.span, s.unwind))
                    .collect()
            };
            assert_eq!(values(&back), values(&profile), "{events:?}");
            assert_eq!(back.spans, profile.spans);
            assert_eq!(back.total_off_cpu_ns(), 295_500_000);
            // The pseudo-frame comes back as the placeholder it was.
            let root = &back.frames[back.samples.last().unwrap().frames[0] as usize];
            assert_eq!(root, &profile.frames[5]);
        }
    }

    #[test]
    fn memory_round_trips_in_every_shape() {
        for profile in [
            fixture::memory(),
            fixture::alloc_only(),
            fixture::heap_only(),
        ] {
            let back = round_trip(&profile);
            let events = profile.meta.events;
            // Sampled by bytes: the rate comes back from the period, the frequency is not kept.
            assert_eq!(
                back.meta,
                Meta {
                    frequency: 0,
                    ..profile.meta.clone()
                },
                "{events:?}"
            );
            assert_eq!(back.meta.events.alloc_rate, 512 * 1024);
            for format in Format::ALL {
                assert_eq!(
                    output::render(&back, format).unwrap(),
                    output::render(&profile, format).unwrap(),
                    "{format} {events:?}"
                );
            }
            type Values = (u32, u64, u64, Memory, Memory, Option<u32>, UnwindStatus);
            let values = |p: &Profile| -> Vec<Values> {
                p.samples
                    .iter()
                    .map(|s| {
                        let (alloc, inuse) = (s.alloc, s.inuse);
                        (
                            s.thread,
                            s.count,
                            s.off_cpu_ns,
                            alloc,
                            inuse,
                            s.span,
                            s.unwind,
                        )
                    })
                    .collect()
            };
            // What the file holds: a heap-only one neither what was allocated nor the stacks
            // whose allocations were all freed.
            let mut written = profile.clone();
            if !events.alloc {
                written.retain_samples(|_, s| !s.inuse.is_empty());
                for s in &mut written.samples {
                    s.alloc = Memory::default();
                }
            }
            assert_eq!(values(&back), values(&written), "{events:?}");
            assert_eq!(back.spans, written.spans, "{events:?}");
            assert_eq!(back.threads, written.threads, "{events:?}");
        }
        // Every allocation recorded.
        let mut every = fixture::alloc_only();
        every.meta.events.alloc_rate = 1;
        assert_eq!(round_trip(&every).meta.events.alloc_rate, 1);
    }

    #[test]
    fn filters_keep_memory_samples() {
        let span = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..Filter::default()
        };
        let mut kept = round_trip(&fixture::memory());
        span.apply(&mut kept).unwrap();
        assert_eq!(folded(&kept), "main;compute 800000000\n");
        assert_eq!(
            kept.samples[0].alloc,
            Memory {
                objects: 34_000,
                bytes: 1_200_000_000
            }
        );
        // OSProfiler base: span 1 (nothing in use, not in the file) and span 2.
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        let mut heap = round_trip(&fixture::heap_only());
        base.apply(&mut heap).unwrap();
        assert_eq!(folded(&heap), "main;compute;do_syscall_64_[k] 20000000\n");
        let mut alloc = round_trip(&fixture::alloc_only());
        base.apply(&mut alloc).unwrap();
        assert_eq!(
            folded(&alloc),
            "main;compute 50000000\nmain;compute;do_syscall_64_[k] 30000000\n"
        );
    }

    #[test]
    fn refuses_contradictory_memory_values() {
        let err = read_edited(&fixture::memory(), |p| p.sample[0].value[2] = 0).unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 0: its inuse_space/bytes has bytes but its \
             inuse_objects/count no allocations"
        );
        let err = read_edited(&fixture::alloc_only(), |p| p.sample[1].value[1] = -5).unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 1 has a negative value"
        );
        let err = read_edited(&fixture::heap_only(), |p| {
            let key = intern(p, OFF_CPU_REASON_LABEL);
            let str = intern(p, "lock");
            p.sample[0].label.push(::pprof::protos::Label {
                key,
                str,
                ..Default::default()
            });
        })
        .unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 0 has an off_cpu.reason label in a memory profile"
        );
        // A memory profile's period is in bytes, a time profile's in nanoseconds.
        let err = read_edited(&fixture::memory(), |p| {
            let (ty, unit) = (intern(p, "cpu"), intern(p, "nanoseconds"));
            p.period_type = Some(::pprof::protos::ValueType { ty, unit });
        })
        .unwrap_err();
        assert_eq!(
            err,
            "not a spanprof profile: its period is not in space/bytes"
        );
        let err = read_edited(&fixture::profile(), |p| {
            let (ty, unit) = (intern(p, "space"), intern(p, "bytes"));
            p.period_type = Some(::pprof::protos::ValueType { ty, unit });
        })
        .unwrap_err();
        assert_eq!(
            err,
            "not a spanprof profile: its period is not in cpu/nanoseconds"
        );
        // An allocation of 0 bytes is an allocation; Go's order or another, the same profile.
        let back = read_edited(&fixture::memory(), |p| {
            p.sample[3].value[1] = 0;
            p.sample_type.reverse();
            for s in &mut p.sample {
                s.value.reverse();
            }
        })
        .unwrap();
        assert_eq!(
            back.samples[3].alloc,
            Memory {
                objects: 7,
                bytes: 0
            }
        );
        assert_eq!(back.samples[0].inuse, fixture::memory().samples[0].inuse);
    }

    #[test]
    fn filters_keep_off_cpu_samples() {
        let back = round_trip(&fixture::off_cpu());
        let span = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..Filter::default()
        };
        let mut kept = back.clone();
        span.apply(&mut kept).unwrap();
        // Span 0: 5 samples on CPU, 30 ms on a lock.
        assert_eq!(
            folded(&kept),
            "[off-cpu: lock];main;compute;do_syscall_64_[k] 30000000\nmain;compute 50000000\n"
        );
        let mut only = round_trip(&fixture::off_cpu_only());
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        base.apply(&mut only).unwrap();
        assert_eq!(folded(&only), "[off-cpu: lock];main;compute 15500000\n");
        assert_eq!(only.total_samples(), 0);
    }

    /// `profile`'s pprof message, changed by `edit`, read back.
    fn read_edited(
        profile: &Profile,
        edit: impl FnOnce(&mut PprofProfile),
    ) -> Result<Profile, String> {
        let mut message = output::pprof::build(profile).unwrap();
        edit(&mut message);
        read_pprof(&message.encode_to_vec()).map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    }

    /// The string table index of `s`, added when missing.
    fn intern(p: &mut PprofProfile, s: &str) -> i64 {
        match p.string_table.iter().position(|t| t == s) {
            Some(i) => i as i64,
            None => {
                p.string_table.push(s.to_string());
                p.string_table.len() as i64 - 1
            }
        }
    }

    #[test]
    fn unknown_reasons_read_as_other() {
        let back = read_edited(&fixture::off_cpu(), |p| {
            let newer = intern(p, "page-fault");
            let key = intern(p, OFF_CPU_REASON_LABEL);
            for l in p.sample[5].label.iter_mut().filter(|l| l.key == key) {
                l.str = newer;
            }
        })
        .unwrap();
        assert_eq!(back.samples[5].off_cpu, Some(OffCpuReason::Other));
        assert_eq!(back.samples[5].off_cpu_ns, fixture::SLEEP_NS);
        // Its frame still says what the file said.
        assert_eq!(folded(&back), folded(&fixture::off_cpu()));
    }

    #[test]
    fn sample_types_in_another_order() {
        let back = read_edited(&fixture::off_cpu(), |p| {
            p.sample_type.swap(0, 2);
            for s in &mut p.sample {
                s.value.swap(0, 2);
            }
        })
        .unwrap();
        assert_eq!(folded(&back), folded(&fixture::off_cpu()));
    }

    #[test]
    fn refuses_contradictory_values() {
        let key = |p: &mut PprofProfile| intern(p, OFF_CPU_REASON_LABEL);
        let err = read_edited(&fixture::off_cpu(), |p| p.sample[0].value[1] += 1).unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 0: its cpu/nanoseconds is not its count times the \
             period"
        );
        let err = read_edited(&fixture::off_cpu(), |p| {
            let key = key(p);
            p.sample[4].label.retain(|l| l.key != key);
        })
        .unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 4 has off-CPU time but no off_cpu.reason label"
        );
        let err = read_edited(&fixture::off_cpu(), |p| {
            p.sample[4].value[..2].copy_from_slice(&[1, 10_000_000]);
        })
        .unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 4 has an off_cpu.reason label and on-CPU samples"
        );
        let err = read_edited(&fixture::wall(), |p| p.sample[0].value[0] += 1).unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 0: 50000001 ns on CPU is not a whole number of \
             periods (10000000 ns)"
        );
        let err = read_edited(&fixture::off_cpu(), |p| {
            p.sample[0].value.pop();
        })
        .unwrap_err();
        assert_eq!(
            err,
            "damaged spanprof profile: sample 0 has 2 values for 3 sample types"
        );
        let err = read_edited(&fixture::off_cpu(), |p| {
            p.sample_type.pop();
            for s in &mut p.sample {
                s.value.pop();
            }
        })
        .unwrap_err();
        assert!(
            err.starts_with(
                "not a spanprof profile: its sample types are [(\"samples\", \"count\"), \
                 (\"cpu\", \"nanoseconds\")], not one of: samples/count; off_cpu/nanoseconds; \
                 samples/count, cpu/nanoseconds, off_cpu/nanoseconds; wall/nanoseconds"
            ),
            "{err}"
        );
    }

    #[test]
    fn reads_plain_protobuf_and_every_frequency() {
        let mut profile = fixture::profile();
        for hz in [1, 7, 99, 997, 9999, 10_000] {
            profile.meta.frequency = hz;
            let message = output::pprof::build(&profile).unwrap().encode_to_vec();
            assert_eq!(read_pprof(&message).unwrap().meta.frequency, hz);
        }
    }

    #[test]
    fn refuses_other_files() {
        let err =
            |bytes: &[u8]| format!("{:#}", anyhow::Error::from(read_pprof(bytes).unwrap_err()));
        assert!(
            err(b"").starts_with("not a spanprof profile"),
            "{}",
            err(b"")
        );
        assert!(err(b"\x1f\x8bnot gzip").starts_with("not a pprof profile: bad gzip data"));
        assert!(err(b"hello, world\n").starts_with("not a pprof profile"));
        let mut foreign = output::pprof::build(&fixture::profile()).unwrap();
        foreign.comment.clear();
        assert_eq!(
            err(&foreign.encode_to_vec()),
            "not a spanprof profile: no `target:` comment"
        );
    }

    #[test]
    fn event_and_thread_filters() {
        let both = fixture::off_cpu();
        let only = |event, threads: &[&str]| {
            let mut p = both.clone();
            Filter {
                event,
                threads: threads.iter().map(|t| t.to_string()).collect(),
                ..Filter::default()
            }
            .apply(&mut p)
            .map(|()| p)
        };
        let cpu = only(Some(EventFilter::Cpu), &[]).unwrap();
        assert!(!cpu.meta.events.off_cpu && cpu.meta.events.cpu);
        assert_eq!(
            crate::summary::total_weight(&cpu),
            11,
            "weighed in samples again"
        );
        assert!(cpu.samples.iter().all(|s| s.off_cpu.is_none()));
        let off = only(Some(EventFilter::OffCpu), &[]).unwrap();
        assert!(!off.meta.events.cpu && off.samples.iter().all(|s| s.off_cpu.is_some()));
        assert_eq!(off.total_off_cpu_ns(), both.total_off_cpu_ns());
        let err = only(Some(EventFilter::Heap), &[]).unwrap_err();
        assert!(
            err.contains("no such samples (it was profiled with --event cpu,offcpu)"),
            "{err}"
        );
        // Threads by name or id.
        let names: Vec<String> = both.threads.iter().map(|t| t.name.clone()).collect();
        let one = only(None, &[&names[0]]).unwrap();
        assert_eq!(one.threads, [both.threads[0].clone()]);
        let by_tid = only(None, &[&both.threads[1].tid.to_string()]).unwrap();
        assert_eq!(by_tid.threads, [both.threads[1].clone()]);
        assert!(only(None, &["no-such-thread"]).unwrap().samples.is_empty());
        let f = Filter {
            event: Some(EventFilter::Cpu),
            threads: vec!["worker".to_string()],
            ..Filter::default()
        };
        assert_eq!(f.to_string(), "--event cpu --thread worker");
        // Memory: one of the two measures.
        let mut mem = fixture::memory();
        Filter {
            event: Some(EventFilter::Alloc),
            ..Filter::default()
        }
        .apply(&mut mem)
        .unwrap();
        assert!(mem.meta.events.alloc && !mem.meta.events.heap);
    }

    #[test]
    fn filters() {
        let profile = fixture::with_spans();
        let kept = |f: &Filter| {
            let mut p = profile.clone();
            f.apply(&mut p).unwrap();
            (p.total_samples(), p.spans.len(), p.threads.len())
        };
        assert_eq!(kept(&Filter::default()), (11, 3, 2));
        // By name: one span each; a glob over both kinds of name.
        let by_name = |globs: &[&str]| Filter {
            span_names: globs
                .iter()
                .map(|g| crate::analysis::Pattern::new(g))
                .collect(),
            ..Filter::default()
        };
        assert_eq!(kept(&by_name(&[fixture::SPAN_NAME])).1, 1);
        assert_eq!(kept(&by_name(&["wsgi", "db.*"])).1, 2);
        assert_eq!(kept(&by_name(&["*"])).1, 3);
        assert_eq!(kept(&by_name(&["nothing"])).0, 0);
        assert_eq!(by_name(&["GET *"]).to_string(), "--span 'GET *'");
        let trace = Filter {
            trace_id: Some(fixture::TRACE),
            ..Filter::default()
        };
        assert_eq!(kept(&trace), (7, 2, 1));
        let span = Filter {
            span_id: parse_hex("00F067AA0BA902B8"),
            ..trace.clone()
        };
        assert_eq!(kept(&span), (2, 1, 1));
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        assert_eq!(kept(&base), (5, 2, 2));
        let point = Filter {
            osprofiler_id: parse_uuid("22222222-2222-2222-2222-222222222222"),
            ..base.clone()
        };
        assert_eq!(kept(&point), (3, 1, 1));
        let none = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..point.clone()
        };
        assert_eq!(kept(&none), (0, 0, 0));
        assert_eq!(
            none.to_string(),
            "--span-id 00f067aa0ba902b7 --base-id 11111111-1111-1111-1111-111111111111 \
             --osprofiler-id 22222222-2222-2222-2222-222222222222"
        );
    }

    #[test]
    fn names_of_other_writers_are_cut_like_ours() {
        let mut profile = fixture::with_spans();
        let long = format!("{}-and-more", fixture::LONG_NAME);
        // Written as is (not through SpanName): what another writer could put in a label.
        let mut raw = Vec::new();
        GzDecoder::new(output::render(&profile, Format::Pprof).unwrap().as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let mut decoded = PprofProfile::decode(raw.as_slice()).unwrap();
        let i = decoded
            .string_table
            .iter()
            .position(|s| s == fixture::LONG_NAME)
            .unwrap();
        decoded.string_table[i] = long.clone();
        let bytes = decoded.encode_to_vec();
        let back = read_pprof(&bytes).unwrap();
        assert_eq!(
            back.spans[2].osprofiler_name.unwrap().as_str(),
            &long[..crate::profile::SPAN_NAME_MAX]
        );
        profile.spans[2].osprofiler_name = SpanName::new(&long);
        assert_eq!(back.spans, profile.spans);
    }

    #[test]
    fn parses_ids() {
        assert_eq!(parse_hex::<2>("aB09"), Some([0xab, 0x09]));
        assert_eq!(parse_hex::<2>("ab0"), None);
        assert_eq!(parse_hex::<2>("+b09"), None);
        assert_eq!(parse_hex::<2>("ab09x"), None);
        let u = [0x12; 16];
        assert_eq!(parse_uuid("12121212-1212-1212-1212-121212121212"), Some(u));
        assert_eq!(parse_uuid("12121212121212121212121212121212"), Some(u));
        assert_eq!(parse_uuid("1212121-21212-1212-1212-121212121212"), None);
        assert_eq!(parse_uuid("12121212-1212-1212-1212-12121212121"), None);
    }
}
