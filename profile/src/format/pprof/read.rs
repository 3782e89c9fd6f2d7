//! A pprof file spanprof wrote, read back into the [`Profile`] it came from.
//!
//! # Overview
//!
//! [`read_pprof`] turns the bytes of a `.pb.gz` (or plain `profile.proto`) that
//! [`crate::format::pprof`] wrote back into the [`Profile`] it came from, so every sink of
//! [`crate::format`] can render it again: a replayed file feeds the same sinks as a live session.
//! `Filter` (crate `spanprof-analysis`) then keeps the samples asked for.
//!
//! What comes back, from what the writer put in the file:
//!
//! - frames from locations: the function's name, file and line, the location's address; the
//!   mapping tells the kind (`[kernel.kallsyms]`: kernel, `[python]`: Python, another file: a
//!   native frame of that module, none: a native placeholder such as `[truncated]`). A location
//!   without lines (an address the writer could not name) is an unknown frame of its mapping,
//!   as is one whose function is named `[unknown] (libfoo.so+0x1234)` after its mapping and
//!   address (files written before December 2026); a native location's lines but the last are
//!   functions inlined into it, frames of their own. A native mapping's `build_id` is its
//!   frames' GNU build id;
//! - threads from the `thread.id`, `thread.name` and `process.id` labels, processes from the
//!   `process: PID (name)` comments (from the threads for files without them), span contexts from
//!   the span labels ([`crate::profile::labels`]);
//! - what was profiled ([`Meta::events`]) from the sample types, by name ([`Shape`], in any
//!   order): `samples/count` and `cpu/nanoseconds` is an on-CPU profile, as is `samples/count`
//!   alone (every file written before December 2026, and one without a rate),
//!   `off_cpu/nanoseconds` alone `--event offcpu`, `samples/count`,
//!   `cpu/nanoseconds`, `off_cpu/nanoseconds` `--event cpu,offcpu`, `wall/nanoseconds` alone
//!   `--event wall` (which implies both); `alloc_objects/count`, `alloc_space/bytes`
//!   `--event alloc`, `inuse_objects/count`, `inuse_space/bytes` `--event heap`, all four
//!   `--event alloc,heap` (see [`crate::format::pprof`]);
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
    io::Read,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use ::pprof::protos::{Message, Profile as PprofProfile};
use flate2::read::GzDecoder;

use symbolizer::build_id::ModuleIds;
use symbolizer::unwind::UnwindStatus;

use crate::format::budget::{self, ReadBudget};
use crate::format::pprof::{
    Shape, ALLOC_OBJECTS_TYPE, ALLOC_SPACE_TYPE, BRANCH_COMMENT, COMMIT_COMMENT, CPU_TYPE,
    DROPPED_COMMENT, HOST_COMMENT, INTERPRETER_COMMENT, INUSE_OBJECTS_TYPE, INUSE_SPACE_TYPE,
    KERNEL_MAPPING, LOST_COMMENT, OFF_CPU_REASON_LABEL, OFF_CPU_TYPE, PROCESS_COMMENT,
    PYTHON_MAPPING, SAMPLES_TYPE, TARGET_COMMENT, UNWIND_LABEL, UNWIND_REASON_LABEL,
};
use crate::format::ReadError;
use crate::profile::OffCpuReason;
use crate::profile::{
    labels, parse_hex, parse_uuid, Frame, FrameKind, Memory, Meta, OsProfilerIds, Process, Profile,
    PythonStats, Sample, SpanContext, SpanName, Thread,
};

/// Largest uncompressed profile read.
const MAX_PROFILE: u64 = 1 << 30;

/// Why a frame read back has no function: the file names none for its address.
pub const NOT_NAMED_IN_FILE: &str = "no function name in the pprof file";

/// Lines of one location at most: inlined functions nest far less deep.
pub const MAX_LINES: usize = 64;

/// Reads a pprof profile that spanprof wrote, gzipped or not, back into a [`Profile`], within
/// the memory a file of `bytes`' size may take ([`ReadBudget::for_file`]).
pub fn read_pprof(bytes: &[u8]) -> Result<Profile, ReadError> {
    read_pprof_within(bytes, ReadBudget::for_file(bytes.len() as u64))
}

/// [`read_pprof`] within `budget` (that of the file `bytes` were read from: gzip data is
/// decompressed before it comes here).
pub fn read_pprof_within(bytes: &[u8], budget: ReadBudget) -> Result<Profile, ReadError> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        // A bound against a gzip bomb: spanprof's profiles are far smaller.
        let cap = MAX_PROFILE.min(budget.max_uncompressed());
        let mut raw = Vec::new();
        GzDecoder::new(bytes)
            .take(cap + 1)
            .read_to_end(&mut raw)
            .map_err(ReadError::Gzip)?;
        if raw.len() as u64 > cap {
            return Err(budget.decompressed_too_much());
        }
        raw
    } else {
        bytes.to_vec()
    };
    let cost = budget::message_cost(&raw)
        .ok_or_else(|| ReadError::Decode("not a protobuf message".into()))?;
    budget.check("decoding it", cost)?;
    let p = PprofProfile::decode(raw.as_slice()).map_err(|e| ReadError::Decode(Box::new(e)))?;
    Reader {
        p: &p,
        budget: budget.bytes().saturating_sub(cost),
        whole: budget,
    }
    .profile()
}

/// The decoded message, with string and table lookups that fail as [`ReadError::Damaged`].
struct Reader<'a> {
    p: &'a PprofProfile,
    /// What the profile made of the message may take.
    budget: u64,
    /// The file's budget, for the error.
    whole: ReadBudget,
}

fn damaged(msg: impl Into<String>) -> ReadError {
    ReadError::Damaged(msg.into())
}

impl Reader<'_> {
    fn string(&self, i: i64) -> Result<&str, ReadError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| damaged(format!("string {i} is not in the string table")))
    }

    fn profile(&self) -> Result<Profile, ReadError> {
        let p = self.p;
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| Ok((self.string(t.ty)?, self.string(t.unit)?)))
            .collect::<Result<_, ReadError>>()?;
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
            ReadError::Foreign(format!(
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
            return Err(ReadError::Foreign(format!(
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
            .ok_or_else(|| ReadError::Foreign("no `target:` comment".to_string()))?;
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
            .collect::<Result<Vec<_>, ReadError>>()?;

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

        let (mut frames, frame_of_location) = self.frames()?;
        // The interpreter's frames, by their module (a mapping's file).
        let interpreters: Vec<&str> = comments
            .iter()
            .filter_map(|c| c.strip_prefix(INTERPRETER_COMMENT))
            .collect();
        for f in &mut frames {
            f.interpreter = matches!(f.kind, FrameKind::Native | FrameKind::Inlined)
                && f.module
                    .as_deref()
                    .is_some_and(|m| interpreters.contains(&m));
        }
        let mut threads: Vec<Thread> = Vec::new();
        let mut thread_ids: HashMap<Thread, u32> = HashMap::new();
        let mut spans: Vec<SpanContext> = Vec::new();
        let mut span_ids: HashMap<SpanContext, u32> = HashMap::new();
        // The samples' stacks, counted before they are made: a few bytes of location ids can
        // name a location of many lines many times.
        let stack_frames: u64 = p
            .sample
            .iter()
            .flat_map(|s| &s.location_id)
            .map(|id| frame_of_location.get(id).map_or(0, |f| f.len() as u64))
            .sum();
        let need = stack_frames * std::mem::size_of::<u32>() as u64
            + p.sample.len() as u64 * std::mem::size_of::<Sample>() as u64;
        if need > self.budget {
            return Err(self.whole.exceeded("its samples' stacks", need));
        }
        let mut samples = Vec::with_capacity(p.sample.len());
        for (i, s) in p.sample.iter().enumerate() {
            let mut frames_of = Vec::with_capacity(s.location_id.len());
            for id in &s.location_id {
                let of = frame_of_location.get(id).ok_or_else(|| {
                    damaged(format!("sample {i} refers to missing location {id}"))
                })?;
                frames_of.extend_from_slice(of);
            }
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
            let value = |ty| -> Result<u64, ReadError> {
                let v = index(ty).map_or(0, |k| s.value[k]);
                u64::try_from(v).map_err(|_| damaged(format!("sample {i} has a negative value")))
            };
            let memory = |objects, bytes| -> Result<Memory, ReadError> {
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
                Shape::Cpu => {
                    let count = value(SAMPLES_TYPE)?;
                    // NB: a file with `samples/count` alone has no time to check.
                    if index(CPU_TYPE).is_some() && value(CPU_TYPE)? != count.saturating_mul(period)
                    {
                        return Err(damaged(format!(
                            "sample {i}: its cpu/nanoseconds is not its count times the period"
                        )));
                    }
                    (count, 0)
                }
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

    /// The frames, and those of each location id, leaf first: one per line (several when
    /// functions were inlined: the last line is the frame they were inlined into, the others
    /// [`FrameKind::Inlined`]).
    #[allow(clippy::type_complexity)]
    fn frames(&self) -> Result<(Vec<Frame>, HashMap<u64, Vec<u32>>), ReadError> {
        let p = self.p;
        // NB: a mapping's build id is kept for native frames: written back, it stays on
        // their mapping.
        type Ids = Option<Arc<ModuleIds>>;
        let mappings: HashMap<u64, (&str, Ids)> = p
            .mapping
            .iter()
            .map(|m| {
                let build_id = self.string(m.build_id)?;
                let ids = (!build_id.is_empty()).then(|| {
                    Arc::new(ModuleIds {
                        gnu: Some(build_id.into()),
                        htlhash: None,
                    })
                });
                Ok((m.id, (self.string(m.filename)?, ids)))
            })
            .collect::<Result<_, ReadError>>()?;
        let functions: HashMap<u64, (&str, &str, i64)> = p
            .function
            .iter()
            .map(|f| {
                Ok((
                    f.id,
                    (self.string(f.name)?, self.string(f.filename)?, f.start_line),
                ))
            })
            .collect::<Result<_, ReadError>>()?;
        let mut frames: Vec<Frame> = Vec::with_capacity(p.location.len());
        let mut ids_of: HashMap<Frame, u32> = HashMap::new();
        let mut of_location = HashMap::with_capacity(p.location.len());
        for loc in &p.location {
            if loc.line.len() > MAX_LINES {
                return Err(damaged(format!(
                    "location {} has {} lines (0 to {MAX_LINES})",
                    loc.id,
                    loc.line.len()
                )));
            }
            let mapping = match loc.mapping_id {
                0 => None,
                id => Some(mappings.get(&id).ok_or_else(|| {
                    damaged(format!(
                        "location {} refers to missing mapping {id}",
                        loc.id
                    ))
                })?),
            };
            let (kind, module, ids) = match mapping {
                Some((KERNEL_MAPPING, _)) => (FrameKind::Kernel, Some(KERNEL_MAPPING), None),
                Some((PYTHON_MAPPING, _)) => (FrameKind::Python, None, None),
                Some((module, ids)) => (FrameKind::Native, Some(*module), ids.clone()),
                None => (FrameKind::Native, None, None),
            };
            let mut intern = |frame: Frame| {
                *ids_of.entry(frame).or_insert_with_key(|f| {
                    frames.push(f.clone());
                    frames.len() as u32 - 1
                })
            };
            if loc.line.is_empty() {
                // An address the writer could not name (pprof's convention: an address in a
                // mapping, no line), for tools that symbolize later.
                let frame = Frame {
                    kind,
                    function: None,
                    module: module.map(str::to_string),
                    address: loc.address,
                    file: None,
                    line: None,
                    unknown_reason: Some(NOT_NAMED_IN_FILE.to_string()),
                    ids: ids.clone(),
                    start_line: None,
                    interpreter: false,
                };
                of_location.insert(loc.id, vec![intern(frame)]);
                continue;
            }
            let mut of_this = Vec::with_capacity(loc.line.len());
            for (i, line) in loc.line.iter().enumerate() {
                let &(name, file, start_line) =
                    functions.get(&line.function_id).ok_or_else(|| {
                        damaged(format!(
                            "location {} refers to missing function {}",
                            loc.id, line.function_id
                        ))
                    })?;
                // A native function's lines but the last are the functions inlined into it
                // (another tool's kernel or Python location of several lines keeps its kind).
                let inlined = i + 1 < loc.line.len() && kind == FrameKind::Native;
                let mut frame = Frame {
                    kind: if inlined { FrameKind::Inlined } else { kind },
                    function: None,
                    module: module.map(str::to_string),
                    address: loc.address,
                    file: (!file.is_empty()).then(|| file.to_string()),
                    line: u32::try_from(line.line).ok().filter(|&l| l != 0),
                    unknown_reason: None,
                    ids: ids.clone(),
                    start_line: u32::try_from(start_line).ok().filter(|&l| l != 0),
                    interpreter: false,
                };
                // The writer names unknown frames `[unknown] (module+0x…)`: the same frame
                // without a function gives that name back.
                if kind == FrameKind::Python || inlined || frame.base_name() != name {
                    frame.function = Some(name.to_string());
                } else {
                    frame.unknown_reason = Some(NOT_NAMED_IN_FILE.to_string());
                }
                of_this.push(intern(frame));
            }
            of_location.insert(loc.id, of_this);
        }
        Ok((frames, of_location))
    }

    /// What the labels of sample `i` say.
    fn labels(
        &self,
        i: usize,
        s: &::pprof::protos::Sample,
        dropped_labels: &[String],
    ) -> Result<SampleLabels, ReadError> {
        let (mut tid, mut pid, mut name) = (None, None, None);
        let (mut unwind, mut unwind_reason) = (None, None);
        let mut off_cpu = None;
        let mut span = SpanContext::default();
        let mut osp: [Option<[u8; 16]>; 3] = [None; 3];
        let mut ids_from_osprofiler = false;
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
                labels::IDS_FROM => ids_from_osprofiler = value()? == labels::IDS_FROM_OSPROFILER,
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
        // Ids derived from the OSProfiler ones are derived again when written.
        if ids_from_osprofiler && span.osprofiler.is_some() {
            span.trace_id = None;
            span.span_id = None;
        }
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

#[cfg(test)]
mod tests;
