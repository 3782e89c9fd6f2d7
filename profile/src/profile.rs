//! The symbolized, aggregated profile that every output sink reads.
//!
//! One [`Profile`] is built at the end of a session (or read back from a pprof file by
//! [`crate::format`]) and handed to each sink in [`crate::format`]. Frames, threads and span
//! contexts are interned tables; a [`Sample`] points into them by index, so a sink walks small
//! integers instead of strings.

use std::time::{Duration, SystemTime};
use symbolizer::unwind::UnwindStatus;

pub use span::*;
pub use view::*;

mod span;
mod view;

/// What kind of code a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A user-space native frame (ELF executable or shared library).
    Native,
    /// A kernel frame.
    Kernel,
    /// A Python frame: `function` is the qualified name, `file` and `line` where it runs.
    Python,
    /// A native function the compiler inlined into its caller, from DWARF: it has no address
    /// of its own, and shares its `module` and `address` with the native frame it was inlined
    /// into, the nearest [`FrameKind::Native`] frame on the root side of the stack (pprof and
    /// OTLP write them as one location of several lines). `file` and `line` are in it.
    Inlined,
}

/// The mark of an inlined frame's name ([`FrameKind::Inlined`]): `name (file.c:LINE, inlined)`,
/// `name (inlined)` without a line.
pub const INLINED: &str = "inlined";

/// One symbolized frame, shared by every stack that contains it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Native or kernel.
    pub kind: FrameKind,
    /// Demangled function name, or `None` when the address could not be symbolized.
    pub function: Option<String>,
    /// Path of the module (executable, shared object, `[kernel]`) the address belongs to, if known.
    pub module: Option<String>,
    /// Address normalized to the module: the file offset for ELF files, the absolute address for
    /// the kernel and for addresses that could not be normalized.
    pub address: u64,
    /// Source file of the function, when debug information has it.
    pub file: Option<String>,
    /// Source line of the address, when debug information has it (of a native frame with
    /// functions inlined into it: the line of the call of the first).
    pub line: Option<u32>,
    /// Why the frame has no function name (e.g. "no symbol", "process exited"), when it has none.
    pub unknown_reason: Option<String>,
    /// The ids of its module file (GNU build id, `htlhash`), when known: native frames (and
    /// those inlined into them) only. pprof and OTLP write them on the frame's mapping.
    pub ids: Option<std::sync::Arc<symbolizer::build_id::ModuleIds>>,
    /// The first line of the function (a Python function's `co_firstlineno`), when known:
    /// pprof's and OTLP's `start_line`.
    pub start_line: Option<u32>,
    /// A native frame (or one inlined into it) of the CPython interpreter of a Python process:
    /// its module is the file that runs the interpreter loop (`libpython3.X.so`, or the
    /// `python3.X` executable it is linked into). The Python view leaves these out of samples
    /// with Python frames ([`View`]).
    pub interpreter: bool,
}

impl Frame {
    /// The name shown in folded stacks and flamegraphs.
    ///
    /// Known functions show their demangled name; unknown ones `[unknown] (libfoo.so+0x1234)` with
    /// the module's base name and the normalized address. Kernel frames end in `_[k]`, the
    /// convention of perf and inferno. Python frames read `qualname (file.py:LINE)`, with the
    /// file's base name, or `qualname (file.py)` without a line (`--no-lines`). Inlined native
    /// functions read `name (file.c:LINE, inlined)`, `name (inlined)` without a line.
    pub fn display_name(&self) -> String {
        match self.kind {
            FrameKind::Kernel => format!("{}_[k]", self.base_name()),
            FrameKind::Native => self.base_name(),
            // `name (file.c:LINE, inlined)`: the line tells the call site apart, as
            // there is no address to.
            FrameKind::Inlined => {
                let name = self.base_name();
                match (self.file.as_deref(), self.line) {
                    (Some(file), Some(line)) => {
                        let file = file.rsplit('/').next().unwrap_or(file);
                        format!("{name} ({file}:{line}, {INLINED})")
                    }
                    _ => format!("{name} ({INLINED})"),
                }
            }
            FrameKind::Python => {
                let name = self.base_name();
                let Some(file) = self.file.as_deref() else {
                    return name;
                };
                let file = file.rsplit('/').next().unwrap_or(file);
                match self.line {
                    Some(line) => format!("{name} ({file}:{line})"),
                    None => format!("{name} ({file})"),
                }
            }
        }
    }

    /// The name without the kernel suffix: the function, or `[unknown] (module+0x…)`.
    pub fn base_name(&self) -> String {
        match &self.function {
            Some(f) => f.clone(),
            None => {
                let module = self
                    .module
                    .as_deref()
                    .map(|m| m.rsplit('/').next().unwrap_or(m))
                    .unwrap_or("?");
                format!("[unknown] ({module}+{:#x})", self.address)
            }
        }
    }
}

/// A thread that samples were taken on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Thread {
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`) as the kernel reported it in the sample.
    pub name: String,
}

/// One aggregated sample: a distinct (stack, thread) with its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Indexes into [`Profile::frames`], root (outermost caller) first, leaf last.
    pub frames: Vec<u32>,
    /// Index into [`Profile::threads`].
    pub thread: u32,
    /// Number of on-CPU perf events that hit this stack on this thread (0 for off-CPU samples).
    pub count: u64,
    /// Nanoseconds this thread spent blocked in this stack (0 for on-CPU samples), an unbiased
    /// estimate from sampled intervals (`offcpu` of crate `spanprof-pipeline`).
    pub off_cpu_ns: u64,
    /// Why the thread was blocked: `Some` exactly for off-CPU samples, whose first frame is the
    /// reason's pseudo-frame ([`OffCpuReason::frame_name`]).
    pub off_cpu: Option<OffCpuReason>,
    /// Allocations made in this stack (`--event alloc`), scaled from the sampled ones: an
    /// allocation of `s` bytes sampled at rate `R` counts `1 / (1 - exp(-s / R))` times.
    pub alloc: Memory,
    /// Allocations of this stack still not freed at the end (`--event heap`), scaled alike.
    pub inuse: Memory,
    /// Index into [`Profile::spans`]: the tracing context the thread was in; `None` outside any.
    pub span: Option<u32>,
    /// How the native user stack was unwound: complete, truncated, failed (and why), or
    /// unchecked (frame pointers).
    pub unwind: UnwindStatus,
    /// Each event of this sample with when it happened, oldest first, when the session kept
    /// them (outputs with timestamps: OTLP); empty otherwise. On-CPU events have the value 1,
    /// off-CPU ones their nanoseconds, allocations their size in bytes (unscaled).
    pub times: Vec<Timed>,
    /// `--event heap`: the sampled allocations of this sample still in use at the end, with
    /// when they were made and their size (unscaled), when timestamps were kept.
    pub inuse_times: Vec<Timed>,
}

impl Sample {
    /// Adds `other`'s counts, times and memory to this sample's (a sample of the same stack,
    /// thread, span, unwinding and reason); `other`'s event times are moved out.
    pub fn absorb(&mut self, other: &mut Sample) {
        self.count = self.count.saturating_add(other.count);
        self.off_cpu_ns = self.off_cpu_ns.saturating_add(other.off_cpu_ns);
        self.alloc.objects = self.alloc.objects.saturating_add(other.alloc.objects);
        self.alloc.bytes = self.alloc.bytes.saturating_add(other.alloc.bytes);
        self.inuse.objects = self.inuse.objects.saturating_add(other.inuse.objects);
        self.inuse.bytes = self.inuse.bytes.saturating_add(other.inuse.bytes);
        self.times.append(&mut other.times);
        self.times.sort_unstable();
        self.inuse_times.append(&mut other.inuse_times);
        self.inuse_times.sort_unstable();
    }
}

/// One event of a [`Sample`] and when it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timed {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    pub unix_ns: u64,
    /// Its value: 1 (on-CPU), nanoseconds (off-CPU) or bytes (allocation).
    pub value: u64,
}

/// Allocated memory: how many allocations and how many bytes (estimates, rounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Memory {
    /// Allocations.
    pub objects: u64,
    /// Bytes asked for.
    pub bytes: u64,
}

impl Memory {
    /// Whether nothing was allocated.
    pub fn is_empty(&self) -> bool {
        self.objects == 0 && self.bytes == 0
    }
}

/// A process that was profiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Executable name: `/proc/PID/comm` when first sampled, else the sampled thread's `comm`.
    pub name: String,
    /// What the process says about itself (executable, command line, service name,
    /// container), read from `/proc` when it was first sampled; empty for a profile read back
    /// from a file.
    pub info: crate::resource::ProcessInfo,
}

/// Facts about the session that produced the profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// What was profiled, for titles: e.g. `pid 1234 (python3)` or `./bench --fast`.
    pub target: String,
    /// Wall-clock start of the session.
    pub start: SystemTime,
    /// How long sampling ran.
    pub duration: Duration,
    /// Sampling frequency in Hz; the period of one sample is `1e9 / frequency` nanoseconds.
    pub frequency: u64,
    /// What was sampled (`--event`).
    pub events: Events,
    /// Samples the kernel could not hand over (ring buffer full), never silently dropped.
    pub lost_samples: u64,
    /// What the CPython walker found.
    pub python: PythonStats,
    /// The host the session ran on (its name only for a profile read back from a file).
    pub host: Option<crate::resource::HostInfo>,
    /// The commit and branch a CI system said it was building ([`Build::from_env`]).
    pub build: Build,
    /// Labels and resource attributes the sinks leave out (`--drop-label`, sorted; see
    /// [`crate::privacy`]).
    pub dropped_labels: Vec<String>,
}

/// The commit and branch of the code a CI run profiled, as its CI system names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Build {
    /// `GITHUB_SHA` (GitHub Actions) or `CI_COMMIT_SHA` (GitLab CI).
    pub commit: Option<String>,
    /// `GITHUB_HEAD_REF` (a pull request's branch), `GITHUB_REF_NAME` or `CI_COMMIT_REF_NAME`.
    pub branch: Option<String>,
}

/// Longest commit or branch kept: the variables are the environment's, not spanprof's.
const MAX_BUILD_FIELD: usize = 200;

impl Build {
    /// What the environment of this process says.
    pub fn from_env() -> Build {
        Build::from_vars(|name| std::env::var(name).ok())
    }

    /// What `var` says: the first variable set and not empty of each list, on one line (control
    /// characters become spaces) and at most 200 bytes.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Build {
        let first = |names: &[&str]| {
            names.iter().find_map(|n| {
                let v = var(n)?;
                let v: String = v
                    .trim()
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                (!v.is_empty()).then(|| truncate(v, MAX_BUILD_FIELD))
            })
        };
        Build {
            commit: first(&["GITHUB_SHA", "CI_COMMIT_SHA"]),
            branch: first(&["GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME"]),
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// What a profile measures (`--event`).
///
/// `cpu` alone is an on-CPU profile whose samples count timer events. With `off_cpu`, samples
/// also carry nanoseconds blocked, and every output weighs stacks in nanoseconds (an on-CPU
/// sample is worth [`Meta::period_ns`]). `wall` is `cpu` and `off_cpu` shown as one wall-clock
/// time per thread (`wall/nanoseconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// On-CPU samples (`--event cpu`, the default).
    pub cpu: bool,
    /// Off-CPU intervals (`--event offcpu`).
    pub off_cpu: bool,
    /// Both, as one wall-clock profile (`--event wall`).
    pub wall: bool,
    /// Sampled allocations (`--event alloc`): `alloc_objects/count`, `alloc_space/bytes`.
    pub alloc: bool,
    /// Sampled allocations not freed at the end (`--event heap`): `inuse_objects/count`,
    /// `inuse_space/bytes`. Memory events do not combine with time events.
    pub heap: bool,
    /// Bytes between two sampled allocations on average (`--alloc-rate`; 1: every allocation).
    pub alloc_rate: u64,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            cpu: true,
            off_cpu: false,
            wall: false,
            alloc: false,
            heap: false,
            alloc_rate: DEFAULT_ALLOC_RATE,
        }
    }
}

/// `--alloc-rate` default: one sample per 512 KiB allocated on average, as Go and tcmalloc do.
pub const DEFAULT_ALLOC_RATE: u64 = 512 * 1024;

/// How many allocations and bytes one sampled allocation of `size` bytes stands for, sampled
/// at `rate` bytes on average (Poisson sampling by bytes: it was sampled with probability
/// `1 - exp(-size / rate)`); `rate <= 1` samples every allocation.
pub fn scale_allocation(size: u64, rate: u64) -> (f64, f64) {
    if rate <= 1 {
        return (1.0, size as f64);
    }
    let p = -(-(size as f64) / rate as f64).exp_m1();
    if p <= 0.0 {
        return (0.0, 0.0);
    }
    (1.0 / p, size as f64 / p)
}

impl Events {
    /// Whether sample weights are nanoseconds (a time profile with off-CPU time in it).
    pub fn in_nanoseconds(&self) -> bool {
        self.off_cpu || self.wall
    }

    /// Whether this is a memory profile (`alloc`, `heap`): weights are bytes.
    pub fn in_bytes(&self) -> bool {
        self.alloc || self.heap
    }
}

/// What the CPython walker found over a session, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonStats {
    /// CPython processes found.
    pub processes: u32,
    /// Samples of those processes with Python frames (a walk that failed midway included).
    pub with_frames: u64,
    /// Samples of threads without a Python thread state (C threads, no interpreter yet).
    pub no_thread: u64,
    /// Samples whose walk stopped at a failed read (with or without frames before it).
    pub read_failed: u64,
    /// Samples taken in the interpreter loop before the process's interpreter was found
    /// (`[python frames not read: interpreter not found yet]`).
    pub not_found: u64,
    /// Samples whose Python stack was cut (too deep, a cycle, or a failed read).
    pub truncated: u64,
    /// Processes that looked like Python but could not be profiled as such, one line each.
    pub notes: Vec<String>,
    /// Samples whose span context came from the thread context record the process publishes
    /// itself (OTEP 4947), not from its tracing libraries' objects.
    pub published_spans: u64,
    /// Span contexts were looked for (not `--no-spans`).
    pub spans_enabled: bool,
    /// Python processes where OpenTelemetry, OSProfiler or a published thread context was found.
    pub span_processes: u32,
}

impl Meta {
    /// Nanoseconds of CPU time one sample stands for.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.frequency.max(1)
    }

    /// Whether OSProfiler points get the OpenTelemetry ids their OTLP driver exports them
    /// under ([`SpanContext::trace_link`]): not when `--drop-label` took `trace_id`, `span_id`
    /// or `span.ids_from`.
    pub fn derives_links(&self) -> bool {
        !self
            .dropped_labels
            .iter()
            .any(|d| d == labels::TRACE_ID || d == labels::SPAN_ID || d == labels::IDS_FROM)
    }
}

/// A complete on-CPU profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Session facts.
    pub meta: Meta,
    /// Interned frames.
    pub frames: Vec<Frame>,
    /// Interned threads.
    pub threads: Vec<Thread>,
    /// Processes seen (the targets and their children).
    pub processes: Vec<Process>,
    /// Aggregated samples, in a deterministic order.
    pub samples: Vec<Sample>,
    /// Distinct span contexts that samples point to.
    pub spans: Vec<SpanContext>,
}

impl Profile {
    /// A stack's frames (root first) cut into what pprof and OTLP write as one location each:
    /// a frame alone, or a native frame with the functions inlined into it that follow it
    /// ([`FrameKind::Inlined`]; one after no native frame, as a file may have it, is alone).
    pub fn inline_groups<'a>(&'a self, frames: &'a [u32]) -> impl Iterator<Item = &'a [u32]> + 'a {
        let kind = |id: u32| self.frames.get(id as usize).map(|f| f.kind);
        let mut rest = frames;
        std::iter::from_fn(move || {
            let (&first, tail) = rest.split_first()?;
            let len = if kind(first) == Some(FrameKind::Native) {
                1 + tail
                    .iter()
                    .take_while(|&&id| kind(id) == Some(FrameKind::Inlined))
                    .count()
            } else {
                1
            };
            let (group, next) = rest.split_at(len);
            rest = next;
            Some(group)
        })
    }

    /// Total number of on-CPU samples.
    pub fn total_samples(&self) -> u64 {
        // NB: counts read from a file are untrusted: saturating, never an overflow.
        self.samples
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.count))
    }

    /// A sample's weight in the profile's unit: bytes in use (`heap`) or allocated (`alloc`) for
    /// a memory profile; its count for an on-CPU profile; else nanoseconds (on-CPU time
    /// `count * period` plus off-CPU time).
    pub fn weight(&self, sample: &Sample) -> u64 {
        let events = &self.meta.events;
        if events.heap {
            sample.inuse.bytes
        } else if events.alloc {
            sample.alloc.bytes
        } else if events.in_nanoseconds() {
            sample
                .count
                .saturating_mul(self.meta.period_ns())
                .saturating_add(sample.off_cpu_ns)
        } else {
            sample.count
        }
    }

    /// Total off-CPU nanoseconds.
    pub fn total_off_cpu_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.off_cpu_ns).sum()
    }
}

/// How `--group-by` puts samples under a synthetic root frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    /// One root per span context ([`SpanContext::group_name`]), `[no span]` for the others.
    Span,
    /// One root per span name ([`SpanContext::name_group`]): every span of one name (an
    /// endpoint) under one root.
    SpanName,
    /// One root per thread name, `[thread NAME]` (the `threading.Thread` name of a Python
    /// thread, else the OS name): threads of one name share a root.
    Thread,
    /// One root per process, `[process PID (NAME)]`: the processes of a `multiprocessing` run
    /// or of a command's children apart.
    Process,
}

impl GroupBy {
    /// Every grouping, in the order help texts list them.
    pub const ALL: [GroupBy; 4] = [
        GroupBy::Span,
        GroupBy::SpanName,
        GroupBy::Thread,
        GroupBy::Process,
    ];

    /// Parses a `--group-by` value: `span`, `span-name`, `thread` or `process` (ASCII case
    /// ignored).
    pub fn from_name(name: &str) -> Option<GroupBy> {
        GroupBy::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(name))
    }

    /// The value's name, the inverse of [`GroupBy::from_name`].
    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Span => "span",
            GroupBy::SpanName => "span-name",
            GroupBy::Thread => "thread",
            GroupBy::Process => "process",
        }
    }
}

/// The root frame of samples taken outside any span, with `--group-by span`.
pub const NO_SPAN_FRAME: &str = "[no span]";

impl SpanContext {
    /// The name of the synthetic root frame that `--group-by span` puts samples of this context
    /// under: `[span SPAN_ID trace TRACE_ID]` for OpenTelemetry, `[osprofiler TRACE_POINT base
    /// BASE_ID]` for OSProfiler alone, `[span … trace … osprofiler TRACE_POINT]` for both, and
    /// [`NO_SPAN_FRAME`] for an empty context; with the span's name when it was read (the
    /// OpenTelemetry span's, else the trace point's) after the kind, the ids in parentheses:
    /// `[span GET /servers (00f067aa0ba902b7 trace 4bf9…)]`.
    pub fn group_name(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = &self.span_id {
            parts.push(format!("span {}", hex(s)));
        }
        if let Some(t) = &self.trace_id {
            parts.push(format!("trace {}", hex(t)));
        }
        match (&self.osprofiler, parts.is_empty()) {
            (Some(o), true) => {
                parts.push(format!(
                    "osprofiler {} base {}",
                    uuid(&o.trace_id),
                    uuid(&o.base_id)
                ));
            }
            (Some(o), false) => parts.push(format!("osprofiler {}", uuid(&o.trace_id))),
            (None, _) => {}
        }
        if parts.is_empty() {
            return NO_SPAN_FRAME.to_string();
        }
        let ids = parts.join(" ");
        match self.name() {
            // `span NAME (ID trace ID)`: the kind, then the name, then the ids without the kind.
            Some(name) => {
                let (kind, rest) = ids.split_once(' ').unwrap_or((&ids, ""));
                format!("[{kind} {} ({rest})]", name.as_str())
            }
            None => format!("[{ids}]"),
        }
    }

    /// The name of the root frame that `--group-by span-name` puts samples of this context
    /// under: `[span NAME]` (OpenTelemetry, or both), `[osprofiler NAME]` (OSProfiler alone),
    /// `[span (no name)]` for a span whose name was not read (a published thread context has
    /// none), [`NO_SPAN_FRAME`] for an empty context.
    pub fn name_group(&self) -> String {
        let kind = if self.span_id.is_some() || self.trace_id.is_some() {
            "span"
        } else if self.osprofiler.is_some() {
            "osprofiler"
        } else {
            return NO_SPAN_FRAME.to_string();
        };
        match self.name() {
            Some(name) => format!("[{kind} {}]", name.as_str()),
            None => format!("[{kind} (no name)]"),
        }
    }

    /// The span's name: the OpenTelemetry span's, else the OSProfiler trace point's.
    fn name(&self) -> Option<SpanName> {
        self.span_name.or(self.osprofiler_name)
    }
}

impl Profile {
    /// The span context of a sample, if it has one.
    pub fn span_of(&self, sample: &Sample) -> Option<&SpanContext> {
        sample.span.and_then(|i| self.spans.get(i as usize))
    }

    /// A copy of the profile with every sample under a synthetic root frame chosen by `group`.
    ///
    /// The frames are placeholders like `[truncated]`: native, no module, address 0, so every
    /// output shows them as plain names (`[span GET /servers (00f067aa0ba902b7 trace 4bf9…)]` in a
    /// flame graph).
    pub fn grouped(&self, group: GroupBy) -> Profile {
        let mut out = self.clone();
        let mut ids: std::collections::HashMap<Frame, u32> = out
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i as u32))
            .collect();
        let mut root_of = |name: String, frames: &mut Vec<Frame>| -> u32 {
            let frame = Frame {
                kind: FrameKind::Native,
                function: Some(name),
                module: None,
                address: 0,
                file: None,
                line: None,
                unknown_reason: None,
                ids: None,
                start_line: None,
                interpreter: false,
            };
            *ids.entry(frame).or_insert_with_key(|frame| {
                frames.push(frame.clone());
                frames.len() as u32 - 1
            })
        };
        // One root per span index (and one for samples without), per thread index or per
        // pid, looked up once each.
        let mut roots: std::collections::HashMap<Option<u32>, u32> = Default::default();
        for i in 0..out.samples.len() {
            let thread = self.threads.get(out.samples[i].thread as usize);
            let key = match group {
                GroupBy::Span | GroupBy::SpanName => out.samples[i].span,
                GroupBy::Thread => Some(out.samples[i].thread),
                GroupBy::Process => thread.map(|t| t.pid),
            };
            let root = match roots.get(&key) {
                Some(&root) => root,
                None => {
                    let name = match group {
                        GroupBy::Span => self
                            .span_of(&out.samples[i])
                            .map_or_else(|| NO_SPAN_FRAME.to_string(), SpanContext::group_name),
                        GroupBy::SpanName => self
                            .span_of(&out.samples[i])
                            .map_or_else(|| NO_SPAN_FRAME.to_string(), SpanContext::name_group),
                        GroupBy::Thread => {
                            format!("[thread {}]", thread.map_or("?", |t| t.name.as_str()))
                        }
                        GroupBy::Process => match thread {
                            Some(t) => {
                                // The process's name (its first sampled comm), else the
                                // thread's.
                                let name = self
                                    .processes
                                    .iter()
                                    .find(|p| p.pid == t.pid)
                                    .map_or(t.name.as_str(), |p| p.name.as_str());
                                format!("[process {} ({name})]", t.pid)
                            }
                            None => "[process ?]".to_string(),
                        },
                    };
                    let root = root_of(name, &mut out.frames);
                    roots.insert(key, root);
                    root
                }
            };
            out.samples[i].frames.insert(0, root);
        }
        out
    }

    /// Keeps the samples for which `keep` is true, and only the threads, processes and span
    /// contexts they use (frames stay: sinks only write the frames samples use).
    pub fn retain_samples(&mut self, mut keep: impl FnMut(&Profile, &Sample) -> bool) {
        let samples = std::mem::take(&mut self.samples);
        let samples: Vec<Sample> = samples.into_iter().filter(|s| keep(self, s)).collect();
        let mut thread_map = vec![None; self.threads.len()];
        let mut span_map = vec![None; self.spans.len()];
        let (mut threads, mut spans) = (Vec::new(), Vec::new());
        self.samples = samples
            .into_iter()
            .map(|mut s| {
                s.thread = *thread_map[s.thread as usize].get_or_insert_with(|| {
                    threads.push(self.threads[s.thread as usize].clone());
                    threads.len() as u32 - 1
                });
                s.span = s.span.map(|i| {
                    *span_map[i as usize].get_or_insert_with(|| {
                        spans.push(self.spans[i as usize]);
                        spans.len() as u32 - 1
                    })
                });
                s
            })
            .collect();
        self.processes
            .retain(|p| threads.iter().any(|t: &Thread| t.pid == p.pid));
        self.threads = threads;
        self.spans = spans;
    }
}

/// Why a thread was off CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffCpuReason {
    /// Sleeping on purpose: `nanosleep`, `time.sleep`, a `select` without file descriptors.
    Sleep,
    /// Waiting for a lock, a semaphore, a condition or another futex.
    Lock,
    /// Waiting for I/O: network, disk, pipes, `poll`/`epoll`/`select` on descriptors.
    Io,
    /// Waiting for CPython's global interpreter lock.
    Gil,
    /// An asyncio event loop waiting in its selector for something to do (`_run_once` →
    /// `select`): no task's code runs then, and the wait is not the awaiting tasks' own.
    AsyncioIdle,
    /// Anything else (page faults, signals, ptrace stops, unknown system calls).
    Other,
}

impl OffCpuReason {
    /// Every reason, in the order summaries list them.
    pub const ALL: [OffCpuReason; 6] = [
        OffCpuReason::Sleep,
        OffCpuReason::Lock,
        OffCpuReason::Io,
        OffCpuReason::Gil,
        OffCpuReason::AsyncioIdle,
        OffCpuReason::Other,
    ];

    /// The label value: `sleep`, `lock`, `io`, `gil`, `asyncio_idle` or `other`.
    pub fn name(self) -> &'static str {
        match self {
            OffCpuReason::Sleep => "sleep",
            OffCpuReason::Lock => "lock",
            OffCpuReason::Io => "io",
            OffCpuReason::Gil => "gil",
            OffCpuReason::AsyncioIdle => "asyncio_idle",
            OffCpuReason::Other => "other",
        }
    }

    /// The inverse of [`OffCpuReason::name`].
    pub fn from_name(name: &str) -> Option<OffCpuReason> {
        OffCpuReason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The pseudo-frame at the root of an off-CPU stack: `[off-cpu: lock]`.
    pub fn frame_name(self) -> String {
        format!("[off-cpu: {}]", self.name())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn span_names_are_cut_and_checked_the_same_way_whatever_their_source() {
        let long = "x".repeat(SPAN_NAME_MAX + 10);
        // From the kernel: ASCII only, already cut.
        let name = SpanName::from_ascii(b"GET /servers/7").unwrap();
        assert_eq!(name.as_str(), "GET /servers/7");
        assert_eq!(format!("{name:?}"), "\"GET /servers/7\"");
        assert_eq!(SpanName::from_ascii(b""), None);
        assert_eq!(SpanName::from_ascii("caf\u{e9}".as_bytes()), None);
        assert_eq!(SpanName::from_ascii(long.as_bytes()), None);
        // From text: cut to SPAN_NAME_MAX bytes, at a character boundary.
        assert_eq!(
            SpanName::new(&long).unwrap().as_str(),
            &long[..SPAN_NAME_MAX]
        );
        let accents = "\u{e9}".repeat(SPAN_NAME_MAX); // 2 bytes each
        assert_eq!(
            SpanName::new(&accents).unwrap().as_str(),
            "\u{e9}".repeat(SPAN_NAME_MAX / 2)
        );
        let odd = format!("a{accents}");
        assert_eq!(
            SpanName::new(&odd).unwrap().as_str().len(),
            SPAN_NAME_MAX - 1
        );
        assert_eq!(SpanName::new(""), None);
        // Equal text, equal names; ordered as text.
        assert_eq!(SpanName::new("abc"), SpanName::from_ascii(b"abc"));
        assert!(SpanName::new("ab").unwrap() < SpanName::new("b").unwrap());
        assert!(SpanName::new("a").unwrap() < SpanName::new("ab").unwrap());
    }

    use super::*;
    use crate::format::{self, fixture, Format};

    #[test]
    fn group_names() {
        let p = fixture::with_spans();
        let names: Vec<String> = p.spans.iter().map(SpanContext::group_name).collect();
        assert_eq!(
            names,
            [
                "[span GET /servers/{server_id} (00f067aa0ba902b7 trace \
                 4bf92f3577b34da6a3ce929d0e0e4736)]",
                "[osprofiler wsgi (22222222-2222-2222-2222-222222222222 base \
                 11111111-1111-1111-1111-111111111111)]",
                "[span db.SELECT instances.uuid FROM instances WHERE instances.host = ? \
                 (00f067aa0ba902b8 trace 4bf92f3577b34da6a3ce929d0e0e4736 osprofiler \
                 33333333-3333-3333-3333-333333333333)]",
            ]
        );
        assert_eq!(SpanContext::default().group_name(), NO_SPAN_FRAME);
        // A span whose name was not read: its ids alone.
        let unnamed = SpanContext {
            span_name: None,
            ..p.spans[0]
        };
        assert_eq!(
            unnamed.group_name(),
            "[span 00f067aa0ba902b7 trace 4bf92f3577b34da6a3ce929d0e0e4736]"
        );
        assert_eq!(unnamed.name_group(), "[span (no name)]");
        let names: Vec<String> = p.spans.iter().map(SpanContext::name_group).collect();
        assert_eq!(
            names,
            [
                "[span GET /servers/{server_id}]",
                "[osprofiler wsgi]",
                "[span db.SELECT instances.uuid FROM instances WHERE instances.host = ?]",
            ]
        );
        assert_eq!(SpanContext::default().name_group(), NO_SPAN_FRAME);
        assert_eq!(GroupBy::from_name("span-name"), Some(GroupBy::SpanName));
        assert_eq!(GroupBy::from_name("SPAN"), Some(GroupBy::Span));
        assert_eq!(GroupBy::from_name("trace"), None);
        assert_eq!(GroupBy::from_name("Thread"), Some(GroupBy::Thread));
    }

    #[test]
    fn grouped_puts_a_root_frame_per_span() {
        let p = fixture::with_spans().grouped(GroupBy::Span);
        let folded = String::from_utf8(format::render(&p, Format::Folded).unwrap()).unwrap();
        assert_eq!(
            folded,
            "[no span];main;[unknown] (libfoo.so+0x1234) 1\n\
             [osprofiler wsgi (22222222-2222-2222-2222-222222222222 base \
             11111111-1111-1111-1111-111111111111)];main;compute 3\n\
             [span GET /servers/{server_id} (00f067aa0ba902b7 trace \
             4bf92f3577b34da6a3ce929d0e0e4736)];main;compute 5\n\
             [span db.SELECT instances.uuid FROM instances WHERE instances.host = ? \
             (00f067aa0ba902b8 trace 4bf92f3577b34da6a3ce929d0e0e4736 osprofiler \
             33333333-3333-3333-3333-333333333333)];main;compute;do_syscall_64_[k] 2\n"
        );
        // By name: two spans of one name share a root.
        let mut named = fixture::with_spans();
        named.spans[1] = SpanContext {
            osprofiler: None,
            osprofiler_name: None,
            ..named.spans[0]
        };
        named.spans[1].span_id = Some([9; 8]);
        let by_name = named.grouped(GroupBy::SpanName);
        let folded = String::from_utf8(format::render(&by_name, Format::Folded).unwrap()).unwrap();
        assert_eq!(
            folded,
            "[no span];main;[unknown] (libfoo.so+0x1234) 1\n\
             [span GET /servers/{server_id}];main;compute 8\n\
             [span db.SELECT instances.uuid FROM instances WHERE instances.host = ?];main;\
             compute;do_syscall_64_[k] 2\n"
        );
        let root = &p.frames[p.samples[3].frames[0] as usize];
        assert_eq!(
            (root.kind, root.module.as_deref(), root.address),
            (FrameKind::Native, None, 0)
        );
        // Samples without spans share one root; grouping twice adds a second level.
        let mut q = fixture::profile();
        let before = q.frames.len();
        q = q.grouped(GroupBy::Span);
        assert_eq!(q.frames.len(), before + 1);
        let twice = q.grouped(GroupBy::Span);
        assert_eq!(twice.frames.len(), before + 1);
        assert_eq!(twice.samples[0].frames[..2], [before as u32, before as u32]);
    }

    #[test]
    fn grouped_by_process_puts_each_pid_under_its_own_root() {
        let mut p = fixture::profile();
        // The worker thread becomes a second process, known by its comm only.
        p.threads[1].pid = 200;
        let by_process = p.grouped(GroupBy::Process);
        let folded =
            String::from_utf8(format::render(&by_process, Format::Folded).unwrap()).unwrap();
        assert_eq!(
            folded,
            "[process 100 (app)];main;compute 5\n\
             [process 100 (app)];main;compute;do_syscall_64_[k] 2\n\
             [process 200 (worker)];main;[unknown] (libfoo.so+0x1234) 1\n\
             [process 200 (worker)];main;compute 3\n"
        );
        assert_eq!(GroupBy::from_name("process"), Some(GroupBy::Process));
    }

    #[test]
    fn retain_samples_compacts_tables() {
        let mut p = fixture::with_spans();
        p.retain_samples(|_, s| s.thread == 1);
        assert_eq!(p.total_samples(), 4);
        assert_eq!(p.threads.len(), 1);
        assert_eq!(p.threads[0].tid, 101);
        assert_eq!(p.spans.len(), 1);
        assert_eq!(
            p.samples
                .iter()
                .map(|s| (s.thread, s.span))
                .collect::<Vec<_>>(),
            [(0, Some(0)), (0, None)]
        );
        assert_eq!(p.processes.len(), 1);
        p.retain_samples(|_, _| false);
        assert!(p.threads.is_empty() && p.spans.is_empty() && p.processes.is_empty());
    }
}
