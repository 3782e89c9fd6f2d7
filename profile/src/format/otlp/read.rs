//! Reading an OTLP profiles request (`.otlp`, as `spanprof profile -o FILE.otlp` writes it)
//! back into a [`Profile`], for `report`, `diff` and `check`.
//!
//! # Overview
//! [`read_otlp`] decodes an `ExportProfilesServiceRequest` (proto v1.10.0, gzipped or not) and
//! takes its on-CPU (`samples/count`) and off-CPU (`off_cpu/nanoseconds`) profiles: every
//! sample's stack through the dictionary's stack, location, function and string tables, its
//! `thread.id`, `thread.name`, `off_cpu.reason` and span attributes, its link's trace and span
//! ids, and each resource's `process.pid` and `process.executable.name`. Other sample types
//! (memory, wall) are refused with their name.
//!
//! # Design constraints
//! The bytes are untrusted: every index is checked against its table, and any that is out of
//! range makes the file damaged, never a panic.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary;
use prost::Message;
use symbolizer::build_id::ModuleIds;
use symbolizer::unwind::UnwindStatus;

use crate::format::budget::{self, ReadBudget};
use crate::format::otlp::write::{BUILD_ID_GNU, BUILD_ID_HTLHASH, INTERPRETER};
use crate::format::pprof::read::MAX_LINES;
use crate::format::ReadError;
use crate::profile::parse_uuid;
use crate::profile::OffCpuReason;
use crate::profile::{
    labels, Events, Frame, FrameKind, Memory, Meta, OsProfilerIds, Process, Profile, PythonStats,
    Sample, SpanContext, SpanName, Thread,
};

/// Largest uncompressed request read.
const MAX_REQUEST: u64 = 1 << 30;

fn damaged(msg: impl Into<String>) -> ReadError {
    ReadError::Damaged(msg.into())
}

/// An attribute's value as spanprof writes them: a string, an integer or a boolean.
enum Attr<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Other,
}

struct Dict<'a>(&'a ProfilesDictionary);

impl<'a> Dict<'a> {
    fn string(&self, i: i32) -> Result<&'a str, ReadError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.0.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| damaged(format!("string index {i} out of range")))
    }

    fn attribute(&self, i: i32) -> Result<(&'a str, Attr<'a>), ReadError> {
        let kv = usize::try_from(i)
            .ok()
            .and_then(|i| self.0.attribute_table.get(i))
            .ok_or_else(|| damaged(format!("attribute index {i} out of range")))?;
        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Any::StringValue(s)) => Attr::Str(s),
            Some(Any::IntValue(n)) => Attr::Int(*n),
            Some(Any::BoolValue(b)) => Attr::Bool(*b),
            _ => Attr::Other,
        };
        Ok((self.string(kv.key_strindex)?, value))
    }

    /// The frames of a location, root first: the frame of its last line, then the functions
    /// inlined into it ([`FrameKind::Inlined`]), from its last line but one to its first.
    fn frames(&self, location: i32) -> Result<Vec<Frame>, ReadError> {
        let loc = usize::try_from(location)
            .ok()
            .and_then(|i| self.0.location_table.get(i))
            .ok_or_else(|| damaged(format!("location index {location} out of range")))?;
        let mut kind = FrameKind::Native;
        for &a in &loc.attribute_indices {
            if let ("profile.frame.type", Attr::Str(t)) = self.attribute(a)? {
                kind = match t {
                    "kernel" => FrameKind::Kernel,
                    "cpython" => FrameKind::Python,
                    _ => FrameKind::Native,
                };
            }
        }
        let (module, ids, interpreter) = match loc.mapping_index {
            0 => (None, None, false),
            m => {
                let mapping = usize::try_from(m)
                    .ok()
                    .and_then(|i| self.0.mapping_table.get(i))
                    .ok_or_else(|| damaged(format!("mapping index {m} out of range")))?;
                let mut ids = ModuleIds::default();
                let mut interpreter = false;
                for &a in &mapping.attribute_indices {
                    match self.attribute(a)? {
                        (BUILD_ID_GNU, Attr::Str(id)) => ids.gnu = Some(id.into()),
                        (BUILD_ID_HTLHASH, Attr::Str(id)) => ids.htlhash = Some(id.into()),
                        (INTERPRETER, Attr::Bool(true)) => interpreter = true,
                        _ => {}
                    }
                }
                let native = kind == FrameKind::Native;
                let ids = (!ids.is_empty() && native).then(|| Arc::new(ids));
                (
                    Some(self.string(mapping.filename_strindex)?.to_string()),
                    ids,
                    interpreter && native,
                )
            }
        };
        let frame = |kind, function, file, line, start_line| Frame {
            kind,
            function,
            module: module.clone(),
            address: loc.address,
            file,
            line,
            unknown_reason: None,
            ids: ids.clone(),
            start_line,
            interpreter,
        };
        if loc.lines.is_empty() {
            return Ok(vec![frame(kind, None, None, None, None)]);
        }
        if loc.lines.len() > MAX_LINES {
            return Err(damaged(format!(
                "location {location} has {} lines, more than {MAX_LINES}",
                loc.lines.len()
            )));
        }
        let mut out = Vec::with_capacity(loc.lines.len());
        for (i, l) in loc.lines.iter().rev().enumerate() {
            let f = usize::try_from(l.function_index)
                .ok()
                .and_then(|i| self.0.function_table.get(i))
                .ok_or_else(|| {
                    damaged(format!("function index {} out of range", l.function_index))
                })?;
            let name = self.string(f.name_strindex)?;
            let file = self.string(f.filename_strindex)?;
            // A native function's lines but the last are the functions inlined into it.
            out.push(frame(
                if i == 0 || kind != FrameKind::Native {
                    kind
                } else {
                    FrameKind::Inlined
                },
                (!name.is_empty()).then(|| name.to_string()),
                (!file.is_empty()).then(|| file.to_string()),
                u32::try_from(l.line).ok().filter(|&l| l > 0),
                u32::try_from(f.start_line).ok().filter(|&l| l > 0),
            ));
        }
        Ok(out)
    }
}

/// Reads an OTLP profiles request that spanprof wrote (see the module docs).
pub fn read_otlp(bytes: &[u8]) -> Result<Profile, ReadError> {
    read_otlp_within(bytes, ReadBudget::for_file(bytes.len() as u64))
}

/// [`read_otlp`] within `budget` (that of the file `bytes` were read from: gzip data is
/// decompressed before it comes here).
pub fn read_otlp_within(bytes: &[u8], budget: ReadBudget) -> Result<Profile, ReadError> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let cap = MAX_REQUEST.min(budget.max_uncompressed());
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(cap + 1)
            .read_to_end(&mut raw)
            .map_err(|e| ReadError::NotOtlp(Box::new(e)))?;
        if raw.len() as u64 > cap {
            return Err(budget.decompressed_too_much());
        }
        raw
    } else {
        bytes.to_vec()
    };
    let cost = budget::message_cost(&raw)
        .ok_or_else(|| ReadError::NotOtlp("not a protobuf message".into()))?;
    budget.check("decoding it", cost)?;
    let request = ExportProfilesServiceRequest::decode(raw.as_slice())
        .map_err(|e| ReadError::NotOtlp(Box::new(e)))?;
    let empty = ProfilesDictionary::default();
    let dict = Dict(request.dictionary.as_ref().unwrap_or(&empty));
    // The samples' stacks, counted before they are made: a few bytes of stack indices can name
    // a stack of many locations of many lines many times.
    let stack_frames: Vec<u64> = dict
        .0
        .stack_table
        .iter()
        .map(|stack| {
            stack
                .location_indices
                .iter()
                .map(|&l| {
                    usize::try_from(l)
                        .ok()
                        .and_then(|l| dict.0.location_table.get(l))
                        .map_or(1, |loc| loc.lines.len().max(1) as u64)
                })
                .sum()
        })
        .collect();
    let (mut frames_made, mut sample_count) = (0u64, 0u64);
    for p in request
        .resource_profiles
        .iter()
        .flat_map(|rp| &rp.scope_profiles)
        .flat_map(|sp| &sp.profiles)
    {
        sample_count += p.samples.len() as u64;
        for s in &p.samples {
            let of = usize::try_from(s.stack_index)
                .ok()
                .and_then(|i| stack_frames.get(i));
            frames_made = frames_made.saturating_add(of.copied().unwrap_or(0));
        }
    }
    let need = frames_made.saturating_mul(std::mem::size_of::<u32>() as u64)
        + sample_count * std::mem::size_of::<Sample>() as u64;
    if need > budget.bytes().saturating_sub(cost) {
        return Err(budget.exceeded("its samples' stacks", need));
    }
    let mut frames: Vec<Frame> = Vec::new();
    let mut frame_ids: HashMap<Frame, u32> = HashMap::new();
    // Each location's frames, made once.
    let mut frames_of_location: HashMap<i32, Vec<u32>> = HashMap::new();
    let mut threads: Vec<Thread> = Vec::new();
    let mut thread_ids: HashMap<Thread, u32> = HashMap::new();
    let mut spans: Vec<SpanContext> = Vec::new();
    let mut span_ids: HashMap<SpanContext, u32> = HashMap::new();
    let mut processes: Vec<Process> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut events = Events {
        cpu: false,
        ..Events::default()
    };
    let (mut start, mut end, mut period) = (u64::MAX, 0u64, 0i64);
    let mut total = 0u64;
    for rp in &request.resource_profiles {
        let attrs = rp
            .resource
            .as_ref()
            .map(|r| &r.attributes[..])
            .unwrap_or(&[]);
        let get = |key: &str| {
            attrs
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        };
        let pid = match get("process.pid") {
            Some(Any::IntValue(p)) => u32::try_from(*p).unwrap_or(0),
            _ => 0,
        };
        let name = match get("process.executable.name") {
            Some(Any::StringValue(n)) => n.clone(),
            _ => String::new(),
        };
        if !processes.iter().any(|p| p.pid == pid) {
            processes.push(Process {
                pid,
                name: name.clone(),
                info: Default::default(),
            });
        }
        for sp in &rp.scope_profiles {
            for p in &sp.profiles {
                let (ty, unit) = match &p.sample_type {
                    Some(vt) => (
                        dict.string(vt.type_strindex)?,
                        dict.string(vt.unit_strindex)?,
                    ),
                    None => ("", ""),
                };
                let off_cpu = match (ty, unit) {
                    ("samples", "count") => false,
                    ("off_cpu", "nanoseconds") => true,
                    _ => {
                        return Err(ReadError::Foreign(format!(
                            "sample type {ty}/{unit} is not read (only samples/count and \
                             off_cpu/nanoseconds)"
                        )))
                    }
                };
                if off_cpu {
                    events.off_cpu = true;
                } else {
                    events.cpu = true;
                    period = p.period;
                }
                start = start.min(p.time_unix_nano);
                end = end.max(p.time_unix_nano.saturating_add(p.duration_nano));
                for (i, s) in p.samples.iter().enumerate() {
                    let stack = usize::try_from(s.stack_index)
                        .ok()
                        .and_then(|i| dict.0.stack_table.get(i))
                        .ok_or_else(|| {
                            damaged(format!(
                                "sample {i}: stack index {} out of range",
                                s.stack_index
                            ))
                        })?;
                    let mut of_sample = Vec::with_capacity(stack.location_indices.len());
                    // The stack table is leaf first; a profile's frames are root first.
                    for &loc in stack.location_indices.iter().rev() {
                        if let Some(ids) = frames_of_location.get(&loc) {
                            of_sample.extend_from_slice(ids);
                            continue;
                        }
                        let mut ids = Vec::new();
                        for frame in dict.frames(loc)? {
                            ids.push(*frame_ids.entry(frame).or_insert_with_key(|f| {
                                frames.push(f.clone());
                                frames.len() as u32 - 1
                            }));
                        }
                        of_sample.extend_from_slice(&ids);
                        frames_of_location.insert(loc, ids);
                    }
                    let weight: u64 = if s.values.is_empty() {
                        s.timestamps_unix_nano.len() as u64
                    } else {
                        s.values
                            .iter()
                            .map(|&v| u64::try_from(v).unwrap_or(0))
                            .try_fold(0u64, u64::checked_add)
                            .ok_or_else(|| damaged(format!("sample {i}: values past 2^64")))?
                    };
                    total = total
                        .checked_add(weight)
                        .ok_or_else(|| damaged("the sample values add up past 2^64"))?;
                    let (mut tid, mut tname, mut reason) = (0u32, String::new(), None);
                    let mut span = SpanContext::default();
                    let mut osp: [Option<[u8; 16]>; 3] = [None; 3];
                    let mut ids_from_osprofiler = false;
                    for &a in &s.attribute_indices {
                        match dict.attribute(a)? {
                            ("thread.id", Attr::Int(t)) => tid = u32::try_from(t).unwrap_or(0),
                            ("thread.name", Attr::Str(n)) => tname = n.to_string(),
                            (crate::format::pprof::OFF_CPU_REASON_LABEL, Attr::Str(r)) => {
                                reason =
                                    Some(OffCpuReason::from_name(r).unwrap_or(OffCpuReason::Other))
                            }
                            (labels::SPAN_NAME, Attr::Str(n)) => span.span_name = SpanName::new(n),
                            (labels::OSP_NAME, Attr::Str(n)) => {
                                span.osprofiler_name = SpanName::new(n)
                            }
                            (labels::OSP_BASE_ID, Attr::Str(v)) => osp[0] = parse_uuid(v),
                            (labels::OSP_TRACE_ID, Attr::Str(v)) => osp[1] = parse_uuid(v),
                            (labels::OSP_PARENT_ID, Attr::Str(v)) => osp[2] = parse_uuid(v),
                            (labels::IDS_FROM, Attr::Str(v)) => {
                                ids_from_osprofiler = v == labels::IDS_FROM_OSPROFILER
                            }
                            _ => {}
                        }
                    }
                    if let [Some(base_id), Some(trace_id), parent_id] = osp {
                        span.osprofiler = Some(OsProfilerIds {
                            base_id,
                            trace_id,
                            parent_id,
                        });
                    }
                    // A link derived from the OSProfiler ids is derived again when written.
                    let derived = ids_from_osprofiler && span.osprofiler.is_some();
                    if s.link_index != 0 && !derived {
                        let link = usize::try_from(s.link_index)
                            .ok()
                            .and_then(|i| dict.0.link_table.get(i))
                            .ok_or_else(|| {
                                damaged(format!(
                                    "sample {i}: link index {} out of range",
                                    s.link_index
                                ))
                            })?;
                        span.trace_id = <[u8; 16]>::try_from(link.trace_id.as_slice()).ok();
                        span.span_id = <[u8; 8]>::try_from(link.span_id.as_slice()).ok();
                    }
                    let thread = Thread {
                        pid,
                        tid,
                        name: tname,
                    };
                    let thread = *thread_ids.entry(thread).or_insert_with_key(|t| {
                        threads.push(t.clone());
                        threads.len() as u32 - 1
                    });
                    let span = (!span.is_empty()).then(|| {
                        *span_ids.entry(span).or_insert_with_key(|c| {
                            spans.push(*c);
                            spans.len() as u32 - 1
                        })
                    });
                    samples.push(Sample {
                        frames: of_sample,
                        thread,
                        count: if off_cpu { 0 } else { weight },
                        off_cpu_ns: if off_cpu { weight } else { 0 },
                        off_cpu: if off_cpu {
                            Some(reason.unwrap_or(OffCpuReason::Other))
                        } else {
                            None
                        },
                        alloc: Memory::default(),
                        inuse: Memory::default(),
                        span,
                        unwind: UnwindStatus::Unchecked,
                        times: Vec::new(),
                        inuse_times: Vec::new(),
                    });
                }
            }
        }
    }
    if !events.cpu && !events.off_cpu {
        events.cpu = true;
    }
    let start = if start == u64::MAX { 0 } else { start };
    let frequency = match u64::try_from(period) {
        Ok(p) if p > 0 => ((1e9 / p as f64).round() as u64).max(1),
        _ => 0,
    };
    Ok(Profile {
        meta: Meta {
            target: processes
                .iter()
                .map(|p| format!("pid {} ({})", p.pid, p.name))
                .collect::<Vec<_>>()
                .join(", "),
            start: UNIX_EPOCH + Duration::from_nanos(start),
            duration: Duration::from_nanos(end.saturating_sub(start)),
            frequency,
            events,
            lost_samples: 0,
            python: PythonStats::default(),
            host: None,
            build: Default::default(),
            dropped_labels: Vec::new(),
        },
        frames,
        threads,
        processes,
        samples,
        spans,
    })
}
