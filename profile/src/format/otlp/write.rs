//! OTLP profiles: a [`Profile`] as one `ExportProfilesServiceRequest` (OpenTelemetry proto
//! v1.10.0, package `v1development`, encoded by the `opentelemetry-proto` crate).
//!
//! # Layout
//!
//! - **One dictionary per request**, shared by every resource and profile: mappings (one per
//!   module file), locations (one per distinct frame, or
//!   native frame with the functions inlined into it), functions, links, strings, attributes and
//!   stacks. Every table starts with its zero entry (an empty message, `""` for strings), so
//!   index 0 means "unset" everywhere.
//! - **One `ResourceProfiles` per process**, its resource built by
//!   [`crate::resource::resource_attributes`] (`service.name`, `process.*`, `container.id`,
//!   `host.*`, and in CI `vcs.ref.head.revision` and `vcs.ref.head.name` from
//!   [`crate::profile::Build`]), with one `ScopeProfiles` whose scope is `spanprof` and its version.
//! - **One `Profile` per sample type** (the proto has a single `sample_type`):
//!
//!   | `--event` | profiles (`type/unit`) | value of one event |
//!   |---|---|---|
//!   | `cpu` | `samples/count`, period `cpu/nanoseconds` | none: each timestamp counts 1 |
//!   | `offcpu` | `off_cpu/nanoseconds` | nanoseconds blocked |
//!   | `cpu,offcpu` | both of the above | |
//!   | `wall` | `wall/nanoseconds` | the period (on-CPU) or nanoseconds blocked |
//!   | `alloc` | `alloc_objects/count`, `alloc_space/bytes`, period `space/bytes` | scaled estimate |
//!   | `heap` | `inuse_objects/count`, `inuse_space/bytes` | scaled estimate |
//!
//! - **Samples** point to a stack (leaf first), carry the attributes `thread.id`, `thread.name`,
//!   `off_cpu.reason` (off-CPU samples), the OpenTelemetry span's name (`span.name`), the
//!   OSProfiler ids (`osprofiler.base_id`, `osprofiler.trace_id`, `osprofiler.parent_id`) and
//!   trace point name (`osprofiler.name`), and link to the OpenTelemetry trace and span they ran
//!   in (`link_index`; in an OSProfiler point with no OpenTelemetry span, the one OSProfiler's
//!   OTLP driver exports for it, with the attribute `span.ids_from`). When the session kept event times
//!   ([`Sample::times`](crate::profile::Sample::times)), each sample lists `timestamps_unix_nano`
//!   with one value per timestamp (count profiles leave values out: each timestamp counts 1);
//!   otherwise (a profile read back from a file) it has one aggregated value. Samples that the
//!   format cannot tell apart (same stack, attributes and link) are merged.
//! - **Mappings**, one per module file, have its path and, for native code, the attributes
//!   `process.executable.build_id.gnu` (when the file has a GNU build id) and
//!   `process.executable.build_id.htlhash` (every file read), as the profiles specification
//!   asks, for back ends that symbolize by build id; a module that holds a Python interpreter
//!   also has `spanprof.python.interpreter` = `true` ([`INTERPRETER`]: its frames are those
//!   the Python view leaves out).
//! - **Locations** have the attribute `profile.frame.type` (`native`, `kernel` or `cpython`),
//!   their module's mapping (kernel frames all in `[kernel.kallsyms]`, Python frames in none),
//!   the address normalized to it (file offset; 0 for Python frames), and one line (a line
//!   per inlined function before the native frame's own, innermost first, as pprof). A frame
//!   that could not be named has no line: its address and mapping say where it is.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile as OtlpProfile,
    ProfilesDictionary, ResourceProfiles, Sample as OtlpSample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::profile::{labels, scale_allocation, FrameKind, Profile, Sample, Timed};
use crate::resource::{resource_attributes, ProcessInfo, Value};
use symbolizer::build_id::ModuleIds;

/// The instrumentation scope of every profile.
pub const SCOPE_NAME: &str = "spanprof";
/// A mapping's attribute: the GNU build id of its file, lower-case hex.
pub const BUILD_ID_GNU: &str = "process.executable.build_id.gnu";
/// A mapping's attribute: the `htlhash` of its file (see `symbolizer::build_id`).
pub const BUILD_ID_HTLHASH: &str = "process.executable.build_id.htlhash";
/// A mapping's attribute, `true` on a module that holds a Python interpreter: its native frames
/// are those the Python view leaves out ([`crate::profile::View`]).
pub const INTERPRETER: &str = "spanprof.python.interpreter";

/// The semantic conventions the attribute names follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.37.0";

/// Renders `profile` as the protobuf bytes of an `ExportProfilesServiceRequest` (not
/// compressed: a transport may compress it).
pub fn render(profile: &Profile) -> Vec<u8> {
    request(profile).encode_to_vec()
}

/// What one `Profile` of the request holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `samples/count`: on-CPU samples.
    CpuSamples,
    /// `off_cpu/nanoseconds`.
    OffCpu,
    /// `wall/nanoseconds`: on-CPU samples at the period, off-CPU time as is.
    Wall,
    AllocObjects,
    AllocSpace,
    InuseObjects,
    InuseSpace,
}

impl Kind {
    fn sample_type(self) -> (&'static str, &'static str) {
        match self {
            Kind::CpuSamples => ("samples", "count"),
            Kind::OffCpu => ("off_cpu", "nanoseconds"),
            Kind::Wall => ("wall", "nanoseconds"),
            Kind::AllocObjects => ("alloc_objects", "count"),
            Kind::AllocSpace => ("alloc_space", "bytes"),
            Kind::InuseObjects => ("inuse_objects", "count"),
            Kind::InuseSpace => ("inuse_space", "bytes"),
        }
    }

    /// The kinds of a profile's events, in a fixed order.
    fn of(profile: &Profile) -> Vec<Kind> {
        let e = &profile.meta.events;
        let mut kinds = Vec::new();
        if e.wall {
            kinds.push(Kind::Wall);
        } else {
            if e.cpu {
                kinds.push(Kind::CpuSamples);
            }
            if e.off_cpu {
                kinds.push(Kind::OffCpu);
            }
        }
        if e.alloc {
            kinds.extend([Kind::AllocObjects, Kind::AllocSpace]);
        }
        if e.heap {
            kinds.extend([Kind::InuseObjects, Kind::InuseSpace]);
        }
        kinds
    }
}

/// An interned table whose entry 0 is the zero value.
#[derive(Debug)]
struct Table<K, V> {
    ids: HashMap<K, i32>,
    values: Vec<V>,
}

impl<K: Eq + Hash, V: Default> Table<K, V> {
    fn new() -> Self {
        Table {
            ids: HashMap::new(),
            values: vec![V::default()],
        }
    }

    /// The index of `key`, made by `make` when it is new.
    fn intern(&mut self, key: K, make: impl FnOnce(&mut Self) -> V) -> i32 {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let value = make(self);
        let id = self.values.len() as i32;
        self.values.push(value);
        self.ids.insert(key, id);
        id
    }
}

/// The dictionary being built.
#[derive(Debug)]
struct Dict {
    strings: Table<String, String>,
    /// By module path and file ids.
    mappings: Table<(String, Option<Arc<ModuleIds>>, bool), Mapping>,
    functions: Table<(i32, i32, i64), Function>,
    /// By the frames of a group ([`Profile::inline_groups`]).
    locations: Table<Box<[u32]>, Location>,
    attributes: Table<(i32, AttrKey), KeyValueAndUnit>,
    links: Table<([u8; 16], [u8; 8]), Link>,
    stacks: Table<Vec<i32>, Stack>,
}

/// An attribute value as a hash key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AttrKey {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl Dict {
    fn new() -> Self {
        Dict {
            strings: Table::new(),
            mappings: Table::new(),
            functions: Table::new(),
            locations: Table::new(),
            attributes: Table::new(),
            links: Table::new(),
            stacks: Table::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if s.is_empty() {
            return 0;
        }
        if let Some(&id) = self.strings.ids.get(s) {
            return id;
        }
        self.strings.intern(s.to_string(), |_| s.to_string())
    }

    fn attribute(&mut self, key: &str, value: AttrKey) -> i32 {
        let k = self.string(key);
        self.attributes
            .intern((k, value.clone()), |_| KeyValueAndUnit {
                key_strindex: k,
                value: Some(any_value(value)),
                unit_strindex: 0,
            })
    }

    /// The location of `group` of the profile's frames ([`Profile::inline_groups`]): a frame, or a
    /// native frame with the functions inlined into it, one line each, the innermost first.
    fn location(&mut self, profile: &Profile, group: &[u32]) -> i32 {
        let Some(&first) = group.first() else {
            return 0;
        };
        if let Some(&loc) = self.locations.ids.get(group) {
            return loc;
        }
        let frame = &profile.frames[first as usize];
        // Kernel frames share one mapping whatever their module says, as in pprof.
        let module = match frame.kind {
            FrameKind::Kernel => Some(crate::format::pprof::KERNEL_MAPPING),
            FrameKind::Native | FrameKind::Inlined => frame.module.as_deref(),
            FrameKind::Python => None,
        };
        let mapping_index = match module {
            Some(module) => {
                let name = self.string(module);
                // The module file's ids (native frames only), as the profiles specification
                // asks of every mapping; two files of one path are two mappings.
                let ids = match frame.kind {
                    FrameKind::Native | FrameKind::Inlined => frame.ids.clone(),
                    _ => None,
                };
                let mut attribute_indices = Vec::new();
                let interpreter = frame.interpreter
                    && matches!(frame.kind, FrameKind::Native | FrameKind::Inlined);
                if interpreter {
                    attribute_indices.push(self.attribute(INTERPRETER, AttrKey::Bool(true)));
                }
                if let Some(ids) = &ids {
                    if let Some(gnu) = &ids.gnu {
                        attribute_indices
                            .push(self.attribute(BUILD_ID_GNU, AttrKey::Str(gnu.to_string())));
                    }
                    if let Some(htl) = &ids.htlhash {
                        attribute_indices
                            .push(self.attribute(BUILD_ID_HTLHASH, AttrKey::Str(htl.to_string())));
                    }
                }
                self.mappings
                    .intern((module.to_string(), ids, interpreter), |_| Mapping {
                        filename_strindex: name,
                        attribute_indices,
                        ..Mapping::default()
                    })
            }
            _ => 0,
        };
        // An address that could not be named stays an address in its mapping, without a
        // line, for a back end to symbolize (a made-up function would be taken as a name).
        let unnamed =
            group.len() == 1 && frame.function.is_none() && frame.kind != FrameKind::Python;
        let lines = group
            .iter()
            .filter(|_| !unnamed)
            .rev()
            .map(|&id| {
                let frame = &profile.frames[id as usize];
                let name = self.string(&frame.base_name());
                let file = self.string(frame.file.as_deref().unwrap_or(""));
                let start_line = frame.start_line.map_or(0, i64::from);
                let function_index =
                    self.functions
                        .intern((name, file, start_line), |_| Function {
                            name_strindex: name,
                            system_name_strindex: name,
                            filename_strindex: file,
                            start_line,
                        });
                Line {
                    function_index,
                    line: frame.line.map_or(0, i64::from),
                    column: 0,
                }
            })
            .collect();
        let frame_type = match frame.kind {
            FrameKind::Native | FrameKind::Inlined => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::Python => "cpython",
        };
        let attr = self.attribute("profile.frame.type", AttrKey::Str(frame_type.to_string()));
        let address = if frame.kind == FrameKind::Python {
            0
        } else {
            frame.address
        };
        self.locations.intern(group.into(), |_| Location {
            mapping_index,
            address,
            lines,
            attribute_indices: vec![attr],
        })
    }

    fn value_type(&mut self, (ty, unit): (&str, &str)) -> ValueType {
        ValueType {
            type_strindex: self.string(ty),
            unit_strindex: self.string(unit),
        }
    }

    fn finish(self) -> ProfilesDictionary {
        ProfilesDictionary {
            mapping_table: self.mappings.values,
            location_table: self.locations.values,
            function_table: self.functions.values,
            link_table: self.links.values,
            string_table: self.strings.values,
            attribute_table: self.attributes.values,
            stack_table: self.stacks.values,
        }
    }
}

fn any_value(v: AttrKey) -> AnyValue {
    AnyValue {
        value: Some(match v {
            AttrKey::Str(s) => any_value::Value::StringValue(s),
            AttrKey::Int(i) => any_value::Value::IntValue(i),
            AttrKey::Bool(b) => any_value::Value::BoolValue(b),
        }),
    }
}

/// One sample's values in a profile of `kind`: (time, value) per event when times were kept,
/// else one aggregated value with no time. Empty when the sample has nothing of that kind.
fn values(profile: &Profile, s: &Sample, kind: Kind) -> (Vec<u64>, Vec<i64>) {
    let rate = profile.meta.events.alloc_rate;
    let period = profile.meta.period_ns() as i64;
    let scaled = |t: &Timed, objects: bool| -> i64 {
        let (o, b) = scale_allocation(t.value, rate);
        (if objects { o } else { b }).round() as i64
    };
    let off = s.off_cpu.is_some();
    let timed = |events: &[Timed], f: &dyn Fn(&Timed) -> i64| -> (Vec<u64>, Vec<i64>) {
        events.iter().map(|t| (t.unix_ns, f(t))).unzip()
    };
    let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
    let has_times = !s.times.is_empty();
    match kind {
        Kind::CpuSamples if off || s.count == 0 => (vec![], vec![]),
        // Each timestamp counts 1: no values.
        Kind::CpuSamples if has_times => (s.times.iter().map(|t| t.unix_ns).collect(), vec![]),
        Kind::CpuSamples => (vec![], vec![clamp(s.count)]),
        Kind::OffCpu if !off || s.off_cpu_ns == 0 => (vec![], vec![]),
        Kind::OffCpu if has_times => timed(&s.times, &|t| clamp(t.value)),
        Kind::OffCpu => (vec![], vec![clamp(s.off_cpu_ns)]),
        Kind::Wall if has_times => timed(&s.times, &|t| {
            if off {
                clamp(t.value)
            } else {
                period
            }
        }),
        Kind::Wall => {
            let ns = profile.weight(s);
            if ns == 0 {
                (vec![], vec![])
            } else {
                (vec![], vec![clamp(ns)])
            }
        }
        Kind::AllocObjects | Kind::AllocSpace if s.alloc.objects == 0 && s.times.is_empty() => {
            (vec![], vec![])
        }
        Kind::AllocObjects if has_times => timed(&s.times, &|t| scaled(t, true)),
        Kind::AllocSpace if has_times => timed(&s.times, &|t| scaled(t, false)),
        Kind::AllocObjects => (vec![], vec![clamp(s.alloc.objects)]),
        Kind::AllocSpace => (vec![], vec![clamp(s.alloc.bytes)]),
        Kind::InuseObjects | Kind::InuseSpace
            if s.inuse.objects == 0 && s.inuse_times.is_empty() =>
        {
            (vec![], vec![])
        }
        Kind::InuseObjects if !s.inuse_times.is_empty() => {
            timed(&s.inuse_times, &|t| scaled(t, true))
        }
        Kind::InuseSpace if !s.inuse_times.is_empty() => {
            timed(&s.inuse_times, &|t| scaled(t, false))
        }
        Kind::InuseObjects => (vec![], vec![clamp(s.inuse.objects)]),
        Kind::InuseSpace => (vec![], vec![clamp(s.inuse.bytes)]),
    }
}

/// How many profiles a request holds, over all its resources and scopes.
pub fn profile_count(request: &ExportProfilesServiceRequest) -> usize {
    request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .map(|s| s.profiles.len())
        .sum()
}

/// The OTLP request of a profile (see the module documentation for the layout).
pub fn request(profile: &Profile) -> ExportProfilesServiceRequest {
    let mut dict = Dict::new();
    let kinds = Kind::of(profile);
    let start = profile
        .meta
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let end = start.saturating_add(profile.meta.duration.as_nanos() as u64);

    // Processes in the profile's order; a thread whose process is not listed gets its own.
    // Samples grouped by process in one pass (a daemon window may hold thousands of each).
    let mut pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
    let mut by_pid: HashMap<u32, Vec<&Sample>> = pids.iter().map(|&p| (p, Vec::new())).collect();
    for s in &profile.samples {
        let pid = profile.threads[s.thread as usize].pid;
        by_pid
            .entry(pid)
            .or_insert_with(|| {
                pids.push(pid);
                Vec::new()
            })
            .push(s);
    }
    let processes: HashMap<u32, &crate::profile::Process> =
        profile.processes.iter().map(|p| (p.pid, p)).collect();
    let no_info = ProcessInfo::default();

    let mut resource_profiles = Vec::new();
    for &pid in &pids {
        let process = processes.get(&pid);
        let samples: &Vec<&Sample> = &by_pid[&pid];
        if samples.is_empty() {
            continue;
        }
        let mut profiles = Vec::new();
        for &kind in &kinds {
            let mut out: Vec<OtlpSample> = Vec::new();
            let mut by_identity: HashMap<(i32, Vec<i32>, i32), usize> = HashMap::new();
            let (mut first, mut last) = (start, end);
            for s in samples {
                let (times, vals) = values(profile, s, kind);
                if times.is_empty() && vals.is_empty() {
                    continue;
                }
                if let (Some(&a), Some(&b)) = (times.first(), times.last()) {
                    first = first.min(a);
                    last = last.max(b);
                }
                // Leaf first (and the locations numbered so, as they always were).
                let groups: Vec<&[u32]> = profile.inline_groups(&s.frames).collect();
                let stack: Vec<i32> = groups
                    .iter()
                    .rev()
                    .map(|group| dict.location(profile, group))
                    .collect();
                let stack_index = dict.stacks.intern(stack.clone(), |_| Stack {
                    location_indices: stack,
                });
                let attrs = sample_attributes(profile, s, &mut dict);
                let link_index = link(profile, s, &mut dict);
                let key = (stack_index, attrs.clone(), link_index);
                match by_identity.get(&key) {
                    Some(&i) => merge(&mut out[i], times, vals),
                    None => {
                        by_identity.insert(key, out.len());
                        out.push(OtlpSample {
                            stack_index,
                            attribute_indices: attrs,
                            link_index,
                            values: vals,
                            timestamps_unix_nano: times,
                        });
                    }
                }
            }
            if out.is_empty() {
                continue;
            }
            let (period_type, period) = match kind {
                Kind::CpuSamples => (
                    Some(dict.value_type(("cpu", "nanoseconds"))),
                    profile.meta.period_ns() as i64,
                ),
                Kind::AllocObjects | Kind::AllocSpace | Kind::InuseObjects | Kind::InuseSpace => (
                    Some(dict.value_type(("space", "bytes"))),
                    profile.meta.events.alloc_rate.min(i64::MAX as u64) as i64,
                ),
                Kind::OffCpu | Kind::Wall => (None, 0),
            };
            profiles.push(OtlpProfile {
                sample_type: Some(dict.value_type(kind.sample_type())),
                samples: out,
                time_unix_nano: first,
                // Timestamps are in [time, time + duration): the last one needs the 1.
                duration_nano: last.saturating_sub(first).saturating_add(1),
                period_type,
                period,
                ..OtlpProfile::default()
            });
        }
        if profiles.is_empty() {
            continue;
        }
        let (name, info) = match process {
            Some(p) => (p.name.as_str(), &p.info),
            None => ("", &no_info),
        };
        let mut attributes = resource_attributes(pid, name, info, profile.meta.host.as_ref());
        // The commit and branch a CI run profiled, as the semantic conventions' VCS attributes.
        let build = &profile.meta.build;
        for (key, v) in [
            ("vcs.ref.head.revision", &build.commit),
            ("vcs.ref.head.name", &build.branch),
        ] {
            if let Some(v) = v {
                attributes.push((key.to_string(), Value::Str(v.clone())));
            }
        }
        let dropped = &profile.meta.dropped_labels;
        let attributes = attributes
            .into_iter()
            .filter(|(key, _)| !dropped.contains(key))
            .map(|(key, value)| KeyValue {
                key,
                value: Some(any_value(match value {
                    Value::Str(s) => AttrKey::Str(s),
                    Value::Int(i) => AttrKey::Int(i),
                })),
                ..KeyValue::default()
            })
            .collect();
        resource_profiles.push(ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Resource::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: SCHEMA_URL.to_string(),
            }],
            schema_url: SCHEMA_URL.to_string(),
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.finish()),
    }
}

/// Adds the events of a sample to one with the same identity, keeping times in order.
fn merge(into: &mut OtlpSample, times: Vec<u64>, vals: Vec<i64>) {
    if times.is_empty() {
        // Aggregated values: one each.
        if let (Some(a), Some(b)) = (into.values.first_mut(), vals.first()) {
            *a = a.saturating_add(*b);
        }
        return;
    }
    if vals.is_empty() {
        into.timestamps_unix_nano.extend(times);
        into.timestamps_unix_nano.sort_unstable();
        return;
    }
    let mut pairs: Vec<(u64, i64)> = into
        .timestamps_unix_nano
        .drain(..)
        .zip(into.values.drain(..))
        .chain(times.into_iter().zip(vals))
        .collect();
    pairs.sort_unstable();
    (into.timestamps_unix_nano, into.values) = pairs.into_iter().unzip();
}

/// `thread.id`, `thread.name`, `off_cpu.reason`, and the span labels of a sample but the
/// OpenTelemetry ids (those are its link): `span.name`, the OSProfiler ids and name.
/// Labels `--drop-label` took away are left out.
fn sample_attributes(profile: &Profile, s: &Sample, dict: &mut Dict) -> Vec<i32> {
    let thread = &profile.threads[s.thread as usize];
    let dropped = &profile.meta.dropped_labels;
    let mut attrs = Vec::with_capacity(4);
    let mut push = |dict: &mut Dict, key: &str, value: AttrKey| {
        if !dropped.iter().any(|d| d == key) {
            attrs.push(dict.attribute(key, value));
        }
    };
    push(dict, "thread.id", AttrKey::Int(i64::from(thread.tid)));
    push(dict, "thread.name", AttrKey::Str(thread.name.clone()));
    if let Some(reason) = s.off_cpu {
        push(
            dict,
            crate::format::pprof::OFF_CPU_REASON_LABEL,
            AttrKey::Str(reason.name().to_string()),
        );
    }
    if let Some(span) = s.span.and_then(|i| profile.spans.get(i as usize)) {
        for (key, value) in span.labels(profile.meta.derives_links()) {
            if key != labels::TRACE_ID && key != labels::SPAN_ID {
                push(dict, key, AttrKey::Str(value));
            }
        }
    }
    attrs
}

/// The link to the OpenTelemetry span a sample ran in ([`crate::profile::SpanContext::trace_link`]:
/// also the span OSProfiler's OTLP driver exports for its point), 0 for none.
fn link(profile: &Profile, s: &Sample, dict: &mut Dict) -> i32 {
    let Some(l) = s
        .span
        .and_then(|i| profile.spans.get(i as usize))
        .and_then(|span| span.trace_link(profile.meta.derives_links()))
    else {
        return 0;
    };
    dict.links.intern((l.trace_id, l.span_id), |_| Link {
        trace_id: l.trace_id.to_vec(),
        span_id: l.span_id.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;

    #[test]
    fn every_table_starts_with_its_zero_entry_and_indexes_are_in_range() {
        let req = request(&fixture::with_spans());
        let d = req.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.mapping_table[0], Mapping::default());
        assert_eq!(d.location_table[0], Location::default());
        assert_eq!(d.function_table[0], Function::default());
        assert_eq!(d.link_table[0], Link::default());
        assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(d.stack_table[0], Stack::default());
        let mut strings = d.string_table.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), d.string_table.len(), "duplicate strings");
        let profiles: Vec<&OtlpProfile> = req
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .flat_map(|s| &s.profiles)
            .collect();
        assert!(!profiles.is_empty());
        for p in profiles {
            for s in &p.samples {
                assert!(s.stack_index > 0 && (s.stack_index as usize) < d.stack_table.len());
                assert!((s.link_index as usize) < d.link_table.len());
                for &a in &s.attribute_indices {
                    assert!(a > 0 && (a as usize) < d.attribute_table.len());
                }
                for &l in &d.stack_table[s.stack_index as usize].location_indices {
                    assert!(l > 0 && (l as usize) < d.location_table.len());
                }
            }
        }
    }

    #[test]
    fn the_ci_commit_and_branch_are_resource_attributes() {
        let mut p = fixture::profile();
        p.meta.build = crate::profile::Build {
            commit: Some("9fceb02".to_string()),
            branch: Some("main".to_string()),
        };
        let req = request(&p);
        let attrs: Vec<(String, String)> = req.resource_profiles[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .filter(|kv| kv.key.starts_with("vcs."))
            .map(|kv| (kv.key.clone(), format!("{:?}", kv.value)))
            .collect();
        assert_eq!(attrs.len(), 2, "{attrs:?}");
        assert_eq!(attrs[0].0, "vcs.ref.head.revision");
        assert!(attrs[0].1.contains("9fceb02") && attrs[1].1.contains("main"));
        // Without a CI, none.
        let req = request(&fixture::profile());
        let r = req.resource_profiles[0].resource.as_ref().unwrap();
        assert!(!r.attributes.iter().any(|kv| kv.key.starts_with("vcs.")));
    }

    #[test]
    fn spans_become_links_and_osprofiler_ids_attributes() {
        let p = fixture::with_spans();
        let req = request(&p);
        let d = req.dictionary.as_ref().unwrap();
        let samples: Vec<&OtlpSample> = req.resource_profiles[0].scope_profiles[0].profiles[0]
            .samples
            .iter()
            .collect();
        let linked: Vec<&Link> = samples
            .iter()
            .filter(|s| s.link_index > 0)
            .map(|s| &d.link_table[s.link_index as usize])
            .collect();
        assert!(linked
            .iter()
            .any(|l| crate::profile::hex(&l.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736"));
        let keys: Vec<&str> = samples
            .iter()
            .flat_map(|s| &s.attribute_indices)
            .map(|&a| d.string_table[d.attribute_table[a as usize].key_strindex as usize].as_str())
            .collect();
        assert!(keys.contains(&"osprofiler.base_id"));
        assert!(keys.contains(&"thread.id"));
        // Names are attributes; the OpenTelemetry ids only links.
        assert!(!keys.contains(&"trace_id") && !keys.contains(&"span_id"));
        let str_values = |key: &str| -> Vec<String> {
            let mut v: Vec<String> = d
                .attribute_table
                .iter()
                .filter(|a| d.string_table[a.key_strindex as usize] == key)
                .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
                    opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                        Some(s.clone())
                    }
                    _ => None,
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(str_values("span.name"), [fixture::SPAN_NAME]);
        // The OSProfiler point with no OpenTelemetry span links to the span OSProfiler's OTLP
        // driver exports for it: trace id the base id, span id the point id's low 64 bits.
        assert!(linked
            .iter()
            .any(|l| l.trace_id == fixture::BASE && l.span_id == [0x22; 8]));
        assert_eq!(str_values("span.ids_from"), ["osprofiler"]);
        assert_eq!(
            str_values("osprofiler.name"),
            [fixture::LONG_NAME, fixture::OSP_NAME]
        );
        // The sample of span 0 (`00f0…b7`) carries its name.
        let named = samples
            .iter()
            .find(|s| {
                s.link_index > 0
                    && d.link_table[s.link_index as usize].span_id
                        == [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
            })
            .expect("a sample linked to span 0");
        assert!(named.attribute_indices.iter().any(|&a| {
            d.string_table[d.attribute_table[a as usize].key_strindex as usize] == "span.name"
        }));
    }

    #[test]
    fn timed_events_give_timestamps_and_merged_identities_stay_sorted() {
        let mut a = OtlpSample {
            values: vec![5, 7],
            timestamps_unix_nano: vec![10, 30],
            ..OtlpSample::default()
        };
        merge(&mut a, vec![20, 40], vec![6, 8]);
        assert_eq!(a.timestamps_unix_nano, [10, 20, 30, 40]);
        assert_eq!(a.values, [5, 6, 7, 8]);
        let mut c = OtlpSample {
            values: vec![3],
            ..OtlpSample::default()
        };
        merge(&mut c, vec![], vec![4]);
        assert_eq!(c.values, [7]);
    }
}
