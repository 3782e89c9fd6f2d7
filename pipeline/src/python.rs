//! CPython targets: finding the interpreter of each profiled process, telling the BPF walker
//! where it is (the `py_procs` map), and naming the frames it records.
//!
//! # Overview
//! A process is looked at the first time one of its samples arrives (or at the start, for
//! `--pid` targets), and again after it calls `execve` (the kernel sends an exec record). An
//! interpreter that is not mapped yet (a process still in the dynamic loader, a shell about to
//! exec python) is looked for again a few times. Once found, its version's offsets go into
//! `py_procs` as a [`PyProc`] and the BPF program walks its threads' frames from the next sample
//! on. A child forked by a CPython process inherits its parent's entry in the kernel.
//!
//! Each recorded Python frame becomes a token of the interned stack: the function id (an index
//! into [`Python::functions`]), the line, and the entry flag the merge with native frames uses
//! ([`crate::aggregate`]).
//!
//! # Design constraints
//! Names are read from the live process (`process_vm_readv`) at the drain that follows the
//! sample; garbage or freed memory yields an `[unknown python code]` frame, never a crash.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use profiler_common::{
    PyFrame, PyProc, SpanProc, NO_KEY, PY_CODE_BLOCK, PY_ENTRY_EVERY_FRAME, PY_ENTRY_FIELD,
    PY_ENTRY_SHIM, PY_FRAME_BLOCK, PY_FRAME_ENTRY, PY_INSTR_LASTI_BYTES, PY_INSTR_LASTI_UNITS,
    PY_INSTR_POINTER, PY_MATCH_NATIVE_TID, PY_MATCH_PTHREAD, PY_NO_OFFSET, PY_WINDOW,
};
use rustc_hash::{FxHashMap, FxHashSet};

use symbolizer::otel_ctx::ModuleCache;
use symbolizer::python::detect::{
    detect_with, needs_libpython, DetectError, NotPython, PythonProcess,
};
use symbolizer::python::memory::{LiveMemory, ProcessMemory};
use symbolizer::python::names::CodeNames;
use symbolizer::python::objects::ObjectOffsets;
use symbolizer::python::offsets::{
    DebugOffsets, FrameLayout, PyOffsets, ThreadIdMatch, DEBUG_OFFSETS_LEN, NEWEST_MINOR,
};
use symbolizer::python::walk::{CodeInfo, TypeAddrs, STR_HASH};
pub use symbolizer::python::walk::{GilState, WalkError};

use spans::{span_proc, NativeCtx, Published, Spans};
use thread_names::ThreadNames;

mod arena;
mod read_ahead;
mod spans;
mod thread_names;

/// Times a process that is not (yet) Python is looked at after it appeared or exec'd: a
/// process still in the dynamic loader has no libpython mapped yet (a program linked with
/// libpython gets [`DETECT_QUICK_TRIES`] looks on the clock first).
const DETECT_TRIES: u32 = 10;
/// The first look again comes this soon: the dynamic loader maps libpython within a few ms of
/// the exec, and the program's first Python code runs soon after (`-- CMD` mode).
const DETECT_FIRST_RETRY: Duration = Duration::from_millis(1);
/// Looks again double their interval up to this one; from then on only if the process sent a
/// sample meanwhile (a short-lived child must be found while it runs; an idle one costs
/// nothing).
const DETECT_RETRY: Duration = Duration::from_millis(25);

/// How long after the `tries`-th look the next one comes: 1, 2, 4, 8, 16, then 25 ms.
fn retry_delay(tries: u32) -> Duration {
    DETECT_FIRST_RETRY
        .saturating_mul(1 << tries.min(16))
        .min(DETECT_RETRY)
}

/// A program linked with libpython is looked at again at most this far apart: under load its
/// loader and start-up stretch, and a 16 ms gap then cost a `-- CMD` session 23 ms of Python
/// frames (1.1% of a 2 s run).
const DETECT_QUICK_MAX: Duration = Duration::from_millis(4);
/// Looks on the clock at a program linked with libpython (4 ms apart: about 230 ms of
/// start-up); then [`DETECT_TRIES`] more as for any program, 25 ms apart and only after a
/// sample (a loader stopped, traced or starved is not given up on while it does not run).
const DETECT_QUICK_TRIES: u32 = 60;

/// Token flag: the frame is the outermost of one call of the interpreter loop.
pub const TOKEN_ENTRY: u64 = 1 << 63;
/// Function id of the `[truncated]` marker token.
pub const TRUNCATED_FUNCTION: u32 = u32::MAX;
/// The lowest function id of a marker token (`[truncated]`, [`Unread`]): function ids at or
/// above it index no function.
pub const FIRST_MARKER_FUNCTION: u32 = u32::MAX - 3;

/// Why a sample taken inside the interpreter loop has no Python frames: the marker shown where
/// they would be (`[python frames not read: …]`), never a silent gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unread {
    /// The kernel had no entry for the process yet: its interpreter was not found (a program
    /// that just started or exec'd, or an entry lost).
    NotFound,
    /// The kernel found no Python thread state for the thread.
    NoThread,
    /// The kernel's walk failed at its first read.
    WalkFailed,
    /// The thread state had no current frame.
    NoFrame,
}

impl Unread {
    /// The marker token the resolve stage puts in an empty Python stack (`NotFound` has none:
    /// an empty stack says it, once the process is known to be Python).
    pub fn token(self) -> u64 {
        let func = match self {
            Unread::NotFound => return 0,
            Unread::NoThread => u32::MAX - 1,
            Unread::WalkFailed => u32::MAX - 2,
            Unread::NoFrame => FIRST_MARKER_FUNCTION,
        };
        u64::from(func) | TOKEN_ENTRY
    }

    /// The reason a marker token stands for.
    pub fn of_function(func: u32) -> Option<Unread> {
        match func {
            f if f == u32::MAX - 1 => Some(Unread::NoThread),
            f if f == u32::MAX - 2 => Some(Unread::WalkFailed),
            FIRST_MARKER_FUNCTION => Some(Unread::NoFrame),
            _ => None,
        }
    }

    /// The frame shown.
    pub fn frame_name(self) -> &'static str {
        match self {
            Unread::NotFound => "[python frames not read: interpreter not found yet]",
            Unread::NoThread => "[python frames not read: no python thread state]",
            Unread::WalkFailed => "[python frames not read: walk failed]",
            Unread::NoFrame => "[python frames not read: no current frame]",
        }
    }
}

/// What [`crate::aggregate::merge`] needs to know of a Python process.
#[derive(Debug, Clone, Copy)]
pub struct MergeInfo<'a> {
    /// Run-time ranges of the interpreter loop.
    pub eval_ranges: &'a [(u64, u64)],
    /// A boundary between two interpreter calls means C code called into Python (3.11+).
    pub markers: bool,
    /// The interpreter keeps frame pointers, so the native stack gets through it.
    pub native_trusted: bool,
}

impl MergeInfo<'_> {
    /// Whether `addr` (a lookup address) is in the interpreter loop.
    pub fn is_eval(&self, addr: u64) -> bool {
        self.eval_ranges
            .iter()
            .any(|&(s, e)| (s..e).contains(&addr))
    }
}

/// A Python function as shown in profiles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFunction {
    /// `co_qualname` (3.11+) or `co_name`; `[unknown python code]` when it could not be read.
    pub name: String,
    /// `co_filename`, when read.
    pub file: Option<String>,
    /// `co_firstlineno`: the line of its `def` (of its first decorator), when read.
    pub start_line: Option<u32>,
}

/// Where a process stands.
#[derive(Debug)]
enum Proc {
    /// To be looked at (again) from `next` on.
    Pending {
        tries: u32,
        next: Instant,
        /// A sample arrived since the last look.
        seen: bool,
        /// Its executable needs libpython: looked at again within ms, sample or not.
        quick: bool,
    },
    /// A CPython process the BPF program walks.
    Ready(Box<Ready>),
    /// Not Python, or a version or build spanprof cannot read.
    Skipped,
    /// A CPython process that exited: only what the merge needs is kept.
    Exited(Box<Merge>),
}

impl Proc {
    /// To be looked at now.
    fn pending() -> Proc {
        Proc::Pending {
            tries: 0,
            next: Instant::now(),
            seen: true,
            quick: false,
        }
    }
}

/// What [`MergeInfo`] is made of.
#[derive(Debug, Clone)]
struct Merge {
    eval_ranges: Vec<(u64, u64)>,
    /// Whether entry flags delimit calls into the interpreter from C (3.11+); on 3.8–3.10
    /// every frame is its own call and says nothing about C code in between.
    markers: bool,
    native_trusted: bool,
    /// Where the process's pymalloc arenas are mapped from, and their size.
    arenas: arena::Arenas,
}

#[derive(Debug)]
struct Ready {
    names: CodeNames<LiveMemory>,
    /// `threading.Thread` names of the process's threads.
    threads: ThreadNames,
    merge: Merge,
    /// `CLOCK_MONOTONIC` (the clock of `bpf_ktime_get_ns`) when `py_procs` was written: a later
    /// sample without Python status means the kernel lost the entry (an exec record lost).
    since_ns: u64,
    /// The tracing libraries of the process, looked for until found (`None`: `--no-spans`).
    spans: Option<Box<Spans>>,
}

/// How often processes are checked for exit, to free their caches.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Function id of [`unknown`], interned first.
pub(crate) const UNKNOWN_FUNCTION: u32 = 0;

/// Where the offsets of the processes found go: the BPF programs' `py_procs` and `span_procs`
/// maps, which the collector's `bpf::Programs` (crate `spanprof-collect`) holds.
pub trait KernelMaps {
    /// Why a map write failed.
    type Error: std::fmt::Display;
    /// Tells the BPF program where a CPython process keeps its interpreter and threads.
    fn set_python(&mut self, pid: u32, value: &PyProc) -> Result<(), Self::Error>;
    /// Tells the BPF program where a process keeps its threads' span contexts (a CPython's
    /// objects, or a thread context the process publishes).
    fn set_spans(&mut self, pid: u32, value: &SpanProc) -> Result<(), Self::Error>;
}

/// The CPython side of a session.
#[derive(Debug)]
pub struct Python {
    enabled: bool,
    /// Span contexts are read (the tracing libraries are looked for).
    spans: bool,
    procs: FxHashMap<u32, Proc>,
    /// The earliest `next` of the pending processes that wait for a time, not a sample.
    due: Option<Instant>,
    /// The earliest quick look for tracing libraries (see `Spans::quick_look`).
    span_due: Option<Instant>,
    functions: Vec<PyFunction>,
    function_ids: FxHashMap<PyFunction, u32>,
    /// Why processes that looked like Python could not be profiled as such, with their pids.
    notes: BTreeMap<String, (Vec<u32>, u32)>,
    last_sweep: Instant,
    /// Python processes found (a process found again after an exec counts once).
    found: FxHashSet<u32>,
    /// `py_procs` entries to write at the next [`Python::flush`].
    writes: Vec<(u32, PyProc)>,
    /// `span_procs` entries to write at the next [`Python::flush`].
    span_writes: Vec<(u32, SpanProc)>,
    /// Python processes whose span contexts the kernel reads (OpenTelemetry, OSProfiler found).
    with_spans: FxHashSet<u32>,
    /// Processes not read as Python, watched for a thread context they publish.
    native: FxHashMap<u32, NativeCtx>,
    /// Module files parsed for a published thread context, shared by every process.
    modules: ModuleCache,
    /// Python processes found since the last [`Python::take_new_processes`].
    new_processes: Vec<u32>,
    /// The CPython version of each process found (`3.11.2`, or `3.11` when the patch level is
    /// not known).
    versions: FxHashMap<u32, String>,
    /// Files already found without CPython, not read again by the next looks.
    not_python: NotPython,
    /// How often the code objects on every thread's stack are named ahead of their samples
    /// (off-CPU sessions: see [`Python::set_read_ahead`]), and when next.
    read_ahead: Option<(Duration, Instant)>,
    /// The last process read ahead: the next period starts after it.
    read_ahead_last: u32,
}

impl Python {
    /// `enabled = false` never looks at processes (nothing in the kernel walks them then);
    /// `spans = false` never looks for tracing libraries (no span context is read).
    pub fn new(enabled: bool, spans: bool) -> Self {
        Python {
            enabled,
            spans,
            procs: FxHashMap::default(),
            due: None,
            span_due: None,
            functions: vec![unknown()],
            function_ids: [(unknown(), UNKNOWN_FUNCTION)].into_iter().collect(),
            notes: BTreeMap::new(),
            last_sweep: Instant::now(),
            found: FxHashSet::default(),
            writes: Vec::new(),
            span_writes: Vec::new(),
            with_spans: FxHashSet::default(),
            native: FxHashMap::default(),
            modules: ModuleCache::default(),
            new_processes: Vec::new(),
            versions: FxHashMap::default(),
            not_python: NotPython::default(),
            read_ahead: None,
            read_ahead_last: 0,
        }
    }

    /// Interned functions, by id.
    pub fn functions(&self) -> &[PyFunction] {
        &self.functions
    }

    /// Lines about processes that could not be profiled as Python: one per reason, with the
    /// pids (the first few, and how many).
    pub fn notes(&self) -> Vec<String> {
        self.notes
            .iter()
            .map(|(reason, (pids, count))| {
                let shown: Vec<String> = pids.iter().map(u32::to_string).collect();
                let more = match *count as usize {
                    n if n > pids.len() => format!(" and {} more", n - pids.len()),
                    _ => String::new(),
                };
                let s = if *count == 1 { "" } else { "es" };
                format!("{reason} (process{s} {}{more})", shown.join(", "))
            })
            .collect()
    }

    /// Notes why a process is not profiled as Python (or why its spans are not read); the
    /// first 5 pids per reason are kept,
    /// the others counted.
    fn note(&mut self, pid: u32, reason: String) {
        let (pids, count) = self.notes.entry(reason).or_default();
        if !pids.contains(&pid) {
            *count += 1;
            if pids.len() < 5 {
                pids.push(pid);
            }
        }
    }

    /// Python processes found so far.
    pub fn found(&self) -> u32 {
        self.found.len() as u32
    }

    /// Notes a process that sent a sample; it is looked at by the next
    /// [`Python::detect_pending`], or at once if the sample has Python frames already (a child
    /// forked by a Python process inherits its parent's `py_procs` entry in the kernel), so
    /// that they can be named. `in_kernel` says whether the kernel had an entry for it when
    /// the sample was taken (`time_ns`): a known Python process sampled without one, after
    /// its entry was written, lost it (its exec record was lost): it is looked at again.
    /// Cheap when the process is known.
    pub fn saw(&mut self, pid: u32, has_python_frames: bool, in_kernel: bool, time_ns: u64) {
        if !self.enabled {
            return;
        }
        if let Some(n) = self.native.get_mut(&pid) {
            n.seen = true;
        }
        let redo = match self.procs.get_mut(&pid) {
            None => true,
            // A late sample of a process that exited keeps its merge facts; a live pid is a
            // new process that reused it.
            Some(Proc::Exited(_)) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
            Some(Proc::Pending { next, seen, .. }) => {
                *seen = true;
                let next = *next;
                self.due = Some(self.due.map_or(next, |due| due.min(next)));
                has_python_frames && next <= Instant::now()
            }
            Some(Proc::Ready(r)) => !in_kernel && time_ns > r.since_ns,
            Some(Proc::Skipped) => false,
        };
        if !redo {
            return;
        }
        if has_python_frames {
            self.detect_now(pid);
        } else {
            self.set_proc(pid, Proc::pending());
        }
    }

    /// A process called execve: whatever was known of its interpreter is gone.
    pub fn exec(&mut self, pid: u32) {
        // The new program is another runtime, or none, until it is found again.
        self.versions.remove(&pid);
        self.native.remove(&pid);
        if self.enabled {
            self.set_proc(pid, Proc::pending());
        }
    }

    /// Looks at every pending process that is due, and writes the BPF map for those found.
    pub fn detect_pending(&mut self, programs: &mut impl KernelMaps) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| matches!(p, Proc::Pending { next, seen: true, .. } if *next <= now))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            self.detect_now(pid);
        }
        self.due = self
            .procs
            .values()
            .filter_map(|p| match p {
                Proc::Pending {
                    next, seen: true, ..
                } => Some(*next),
                _ => None,
            })
            .min();
        let mut notes = Vec::new();
        self.span_due = None;
        for (&pid, p) in &mut self.procs {
            if let Proc::Ready(r) = p {
                if let Some(spans) = r.spans.as_mut() {
                    if let Some(value) = spans.look(now, &mut self.modules) {
                        self.span_writes.push((pid, value));
                    }
                    if let Some(next) = spans.quick_look() {
                        self.span_due = Some(self.span_due.map_or(next, |due| due.min(next)));
                    }
                    if let Some(note) = spans.take_note() {
                        notes.push((pid, note));
                    }
                }
            }
        }
        for (pid, note) in notes {
            self.note(pid, note);
        }
        for (&pid, n) in &mut self.native {
            if !n.seen || now < n.published.next {
                continue;
            }
            n.seen = false;
            if n.published.look(now, &n.mem, &mut self.modules) {
                let mut value = SpanProc {
                    osp_keys: [NO_KEY; 4],
                    ..SpanProc::default()
                };
                n.published.fill(&mut value);
                self.span_writes.push((pid, value));
            }
        }
        self.flush(programs);
        if self.last_sweep.elapsed() >= SWEEP_EVERY {
            self.last_sweep = Instant::now();
            self.sweep();
        }
    }

    /// When the next pending look is due (`None`: none is waiting for a time, only for a
    /// sample): the loop waits no longer than that, so a program that just exec'd is found
    /// within a few ms.
    pub fn next_due(&self) -> Option<Instant> {
        self.due
    }

    /// When a young Python process is due to be looked at again for tracing libraries, sooner
    /// than the collection's tick would (see `Spans::quick_look`).
    pub fn next_span_look(&self) -> Option<Instant> {
        self.span_due
    }

    /// Whether a pending look is due now: the drain stops for it between two records.
    pub fn due_now(&self) -> bool {
        self.due.is_some_and(|due| due <= Instant::now())
    }

    /// Frees what processes that exited held: name caches (only the merge facts of Python
    /// processes are kept), and the entries of the others, so a reused pid starts afresh.
    fn sweep(&mut self) {
        self.native
            .retain(|&pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.procs.retain(|&pid, p| {
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return true;
            }
            if let Proc::Ready(r) = p {
                *p = Proc::Exited(Box::new(r.merge.clone()));
                return true;
            }
            matches!(p, Proc::Exited(_))
        });
    }

    /// Writes the `py_procs` entries of the processes found since the last call.
    pub fn flush(&mut self, programs: &mut impl KernelMaps) {
        for (pid, value) in std::mem::take(&mut self.writes) {
            match programs.set_python(pid, &value) {
                Ok(()) => {
                    if let Some(Proc::Ready(r)) = self.procs.get_mut(&pid) {
                        r.since_ns = crate::monotonic_ns();
                    }
                }
                Err(e) => {
                    self.note(
                        pid,
                        format!("cannot hand python offsets to the kernel: {e}"),
                    );
                    self.set_proc(pid, Proc::Skipped);
                    self.found.remove(&pid);
                }
            }
        }
        for (pid, value) in std::mem::take(&mut self.span_writes) {
            match programs.set_spans(pid, &value) {
                Ok(()) => {
                    // An entry for thread names alone reads no span.
                    if value.reads_spans() && matches!(self.procs.get(&pid), Some(Proc::Ready(_))) {
                        self.with_spans.insert(pid);
                    }
                }
                Err(e) => self.note(pid, format!("cannot hand span objects to the kernel: {e}")),
            }
        }
    }

    /// The Python processes found since the last call.
    pub fn take_new_processes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.new_processes)
    }

    /// Processes whose threads' span contexts are read (a tracing library was found).
    pub fn with_spans(&self) -> u32 {
        self.with_spans.len() as u32
    }

    /// Whether span contexts are looked for.
    pub fn spans_enabled(&self) -> bool {
        self.spans
    }

    /// The CPython version of a process found to be Python (the latest, after an exec).
    pub fn runtime_version(&self, pid: u32) -> Option<&str> {
        self.versions.get(&pid).map(String::as_str)
    }

    /// Looks at one process now; a [`Python::flush`] hands what was found to the kernel.
    pub fn detect_now(&mut self, pid: u32) {
        if !self.enabled {
            return;
        }
        let (tries, quick) = match self.procs.get(&pid) {
            Some(Proc::Pending { tries, quick, .. }) => (*tries, *quick),
            Some(Proc::Skipped) => return,
            Some(Proc::Ready(_) | Proc::Exited(_)) | None => (0, false),
        };
        let next = match detect_with(pid, &mut self.not_python) {
            Ok(process) => match (process.version, self.ready(process)) {
                (version, Ok(ready)) => {
                    self.found.insert(pid);
                    self.versions.insert(pid, version.to_string());
                    self.new_processes.push(pid);
                    Proc::Ready(Box::new(ready))
                }
                (_, Err(reason)) => {
                    self.note(pid, reason);
                    Proc::Skipped
                }
            },
            // Not mapped yet (dynamic loader, shell before exec): look again a few times.
            Err(DetectError::NotPython(_))
                if tries + 1 < DETECT_TRIES
                    || quick && tries + 1 < DETECT_QUICK_TRIES + DETECT_TRIES =>
            {
                // A program the loader is still starting, linked with libpython (pyenv's,
                // uwsgi), is looked at again within ms whether it sends a sample or not: its
                // first Python code is soon. Any other only after a sample, 25 ms apart (a
                // shell before its exec, an embedding that loads libpython later).
                let quick = quick || tries == 0 && needs_libpython(pid);
                let delay = if quick && tries + 1 < DETECT_QUICK_TRIES {
                    retry_delay(tries).min(DETECT_QUICK_MAX)
                } else {
                    DETECT_RETRY
                };
                Proc::Pending {
                    tries: tries + 1,
                    next: Instant::now() + delay,
                    seen: delay < DETECT_RETRY,
                    quick,
                }
            }
            Err(DetectError::NotPython(_) | DetectError::Maps { .. }) => Proc::Skipped,
            Err(e) => {
                self.note(pid, e.to_string());
                Proc::Skipped
            }
        };
        self.set_proc(pid, next);
    }

    /// Sets where `pid` stands, keeping [`Python::next_due`] up to date. A process not read as
    /// Python (or not yet) is watched for a thread context it publishes itself (when spans are
    /// read); one found to be Python is watched by its [`Spans`] instead.
    fn set_proc(&mut self, pid: u32, p: Proc) {
        let watched = match &p {
            Proc::Pending { .. } | Proc::Skipped => true,
            // A CPython whose objects spanprof cannot read still has its published context read.
            Proc::Ready(r) => r.spans.is_none(),
            Proc::Exited(_) => false,
        };
        if watched && self.spans {
            self.native.entry(pid).or_insert_with(|| NativeCtx {
                mem: LiveMemory::new(pid),
                published: Published::new(true),
                seen: true,
            });
        } else {
            self.native.remove(&pid);
        }
        if let Proc::Pending {
            next, seen: true, ..
        } = p
        {
            self.due = Some(self.due.map_or(next, |due| due.min(next)));
        }
        self.procs.insert(pid, p);
    }

    fn ready(&mut self, process: PythonProcess) -> Result<Ready, String> {
        let pid = process.pid;
        let version = process.version;
        let minor = format!("{}.{}", version.major, version.minor);
        let unsupported = |what: &str| {
            format!(
                "{what}: not supported, profiled as native code only (spanprof reads the \
                 Python frames of GIL builds of CPython 3.8 to 3.{NEWEST_MINOR})"
            )
        };
        if process.debug_build {
            return Err(unsupported(&format!("python {version} is a debug build")));
        }
        let mem = LiveMemory::new(pid);
        if version.minor >= 13 {
            // The runtime publishes its own offsets and its build: trust the table only if
            // they agree, and never walk a free-threaded build with a GIL build's table.
            let mut raw = vec![0u8; DEBUG_OFFSETS_LEN];
            mem.read(process.runtime_addr, &mut raw)
                .map_err(|e| format!("python {minor}: cannot read _PyRuntime: {e}"))?;
            let debug = DebugOffsets::parse(&raw);
            if debug.as_ref().is_ok_and(|d| d.free_threaded != 0) {
                return Err(unsupported(&format!(
                    "python {version} is a free-threaded build"
                )));
            }
            let offsets = process
                .offsets()
                .ok_or_else(|| unsupported(&format!("python {minor}")))?;
            debug
                .and_then(|d| d.check(offsets))
                .map_err(|e| format!("python {version} does not match spanprof's tables: {e}"))?;
        }
        let offsets = process
            .offsets()
            .ok_or_else(|| unsupported(&format!("python {minor}")))?;
        let value = py_proc(&process, offsets).map_err(|e| format!("python {version}: {e}"))?;
        self.writes.push((pid, value));
        // Spans are an extra: a process whose span objects cannot be set up is still walked.
        let objects = ObjectOffsets::for_version(version.major, version.minor);
        let base = objects.and_then(|o| span_proc(&process, offsets, o).ok());
        let spans = match (self.spans, objects, base) {
            (true, Some(objects), Some(base)) => {
                let mut spans = Box::new(Spans::new(
                    base,
                    mem,
                    process.runtime_addr,
                    process.hash_secret_addr,
                    offsets,
                    objects,
                ));
                // At once, so a `--pid` target's spans are read from the first sample on.
                if let Some(value) = spans.look(Instant::now(), &mut self.modules) {
                    self.span_writes.push((pid, value));
                }
                if let Some(note) = spans.take_note() {
                    self.note(pid, note);
                }
                Some(spans)
            }
            _ => None,
        };
        let types = TypeAddrs {
            code: process.code_type_addr,
            unicode: process.unicode_type_addr,
        };
        Ok(Ready {
            names: CodeNames::new(mem, offsets, types),
            threads: ThreadNames::new(LiveMemory::new(pid), offsets, objects, process.runtime_addr),
            merge: Merge {
                markers: !matches!(offsets.frame_layout, FrameLayout::FrameObject { .. }),
                native_trusted: process.frame_pointers,
                eval_ranges: process.eval_ranges,
                arenas: arena::Arenas::new(pid, &process.module, version.minor),
            },
            // Set when the entry is written (flush); until then no sample is judged by it.
            since_ns: u64::MAX,
            spans,
        })
    }

    /// Who holds the GIL of `pid`'s main interpreter now (read from its memory), if `pid` is a
    /// Python process spanprof walks; an error when what is read cannot be trusted.
    pub fn gil_state(&self, pid: u32) -> Option<Result<GilState, WalkError>> {
        match self.procs.get(&pid) {
            Some(Proc::Ready(ready)) => Some(ready.threads.gil_state()),
            _ => None,
        }
    }

    /// The module holding `pid`'s interpreter (as its maps name it), once found (also after
    /// the process exited).
    pub fn interpreter_module(&self, pid: u32) -> Option<&std::path::Path> {
        match self.procs.get(&pid) {
            Some(Proc::Ready(ready)) => Some(ready.merge.arenas.module()),
            Some(Proc::Exited(merge)) => Some(merge.arenas.module()),
            _ => None,
        }
    }

    /// Whether an allocation of `size` bytes whose caller returns to `caller` is one of
    /// pymalloc's arenas in `pid` ([`arena`]).
    pub fn is_arena(&self, pid: u32, caller: u64, size: u64) -> bool {
        match self.procs.get(&pid) {
            Some(Proc::Ready(ready)) => ready.merge.arenas.holds(caller, size),
            Some(Proc::Exited(merge)) => merge.arenas.holds(caller, size),
            Some(Proc::Pending { .. }) | None => arena::before_detection(pid, caller, size),
            Some(Proc::Skipped) => false,
        }
    }

    /// The interned-stack tokens of a sample's recorded frames, into `out` (as many as fit).
    /// `lines = false` drops the lines (`--no-lines`). Allocates only for a code object or
    /// offset seen for the first time.
    pub fn tokens(&mut self, pid: u32, frames: &[PyFrame], lines: bool, out: &mut [u64]) -> usize {
        let functions = &mut self.functions;
        let function_ids = &mut self.function_ids;
        let mut ready = match self.procs.get_mut(&pid) {
            Some(Proc::Ready(ready)) => Some(ready),
            _ => None,
        };
        let mut n = 0;
        for (frame, slot) in frames.iter().zip(out.iter_mut()) {
            let (func, line) = match ready.as_mut() {
                Some(ready) => ready
                    .names
                    .resolve(frame, |info| {
                        intern(functions, function_ids, function_of(info))
                    })
                    .unwrap_or((UNKNOWN_FUNCTION, None)),
                // Frames from a process whose interpreter is not known here (gone before it
                // was looked at, or its detection failed).
                None => (UNKNOWN_FUNCTION, None),
            };
            let line = if lines { line.unwrap_or(0) } else { 0 };
            let entry = if frame.flags & PY_FRAME_ENTRY != 0 {
                TOKEN_ENTRY
            } else {
                0
            };
            *slot = u64::from(func) | (u64::from(line.min(0x7fff_ffff)) << 32) | entry;
            n += 1;
        }
        n
    }

    /// The `threading.Thread` name of a thread of a Python process, read while it runs (call
    /// it for each sample: it reads the process's names when this thread has none yet).
    pub fn thread_name(&mut self, pid: u32, tid: u32) -> Option<&str> {
        match self.procs.get_mut(&pid) {
            Some(Proc::Ready(ready)) => ready.threads.get(tid),
            _ => None,
        }
    }

    /// Sets the `threading.Thread` name of a thread of a Python process, as the kernel read it
    /// with a sample (allocates only when the name changed).
    pub fn set_thread_name(&mut self, pid: u32, tid: u32, name: &str) {
        if let Some(Proc::Ready(ready)) = self.procs.get_mut(&pid) {
            ready.threads.set(tid, name);
        }
    }

    /// How to merge the native and Python stacks of a process.
    pub fn merge_info(&self, pid: u32) -> Option<MergeInfo<'_>> {
        let m = match self.procs.get(&pid) {
            Some(Proc::Ready(r)) => &r.merge,
            Some(Proc::Exited(m)) => m,
            _ => return None,
        };
        Some(MergeInfo {
            eval_ranges: &m.eval_ranges,
            markers: m.markers,
            native_trusted: m.native_trusted,
        })
    }
}

fn unknown() -> PyFunction {
    PyFunction {
        name: "[unknown python code]".to_string(),
        file: None,
        start_line: None,
    }
}

/// The function a code object names.
fn function_of(info: &CodeInfo) -> PyFunction {
    PyFunction {
        name: info.name.clone(),
        file: Some(info.filename.clone()),
        start_line: (info.first_line > 0).then_some(info.first_line),
    }
}

fn intern(
    functions: &mut Vec<PyFunction>,
    ids: &mut FxHashMap<PyFunction, u32>,
    f: PyFunction,
) -> u32 {
    if let Some(&id) = ids.get(&f) {
        return id;
    }
    let id = functions.len() as u32;
    ids.insert(f.clone(), id);
    functions.push(f);
    id
}

/// Splits a token into (function id, line or 0, entry flag).
pub fn split_token(token: u64) -> (u32, u32, bool) {
    (
        token as u32,
        ((token >> 32) & 0x7fff_ffff) as u32,
        token & TOKEN_ENTRY != 0,
    )
}

/// The `py_procs` value of a process: its runtime address and its version's offsets.
pub fn py_proc(process: &PythonProcess, o: &PyOffsets) -> Result<PyProc, String> {
    let u = |v: u64, what: &str| -> Result<u32, String> {
        u32::try_from(v).map_err(|_| format!("offset of {what} out of range"))
    };
    let (tstate_match, tstate_thread) = match o.thread_match {
        ThreadIdMatch::NativeThreadId(at) => (PY_MATCH_NATIVE_TID, at),
        ThreadIdMatch::PthreadId => (PY_MATCH_PTHREAD, o.tstate_thread_id),
    };
    let (instr_kind, cframe_current) = match o.frame_layout {
        FrameLayout::FrameObject {
            lasti_in_code_units: false,
        } => (PY_INSTR_LASTI_BYTES, PY_NO_OFFSET),
        FrameLayout::FrameObject {
            lasti_in_code_units: true,
        } => (PY_INSTR_LASTI_UNITS, PY_NO_OFFSET),
        FrameLayout::CFrame { current_frame } => {
            (PY_INSTR_POINTER, u(current_frame, "cframe.current_frame")?)
        }
        FrameLayout::Direct => (PY_INSTR_POINTER, PY_NO_OFFSET),
    };
    let (entry_kind, frame_entry) = match (o.frame_layout, o.frame_is_entry, o.frame_owner) {
        (FrameLayout::FrameObject { .. }, _, _) => (PY_ENTRY_EVERY_FRAME, PY_NO_OFFSET),
        (_, Some(at), _) => (PY_ENTRY_FIELD, u(at, "is_entry")?),
        (_, None, Some(at)) => (PY_ENTRY_SHIM, u(at, "owner")?),
        (_, None, None) => return Err("no way to find interpreter entry frames".into()),
    };
    let code_adaptive = match (instr_kind, o.code_adaptive) {
        (PY_INSTR_POINTER, Some(at)) => u(at, "co_code_adaptive")?,
        (PY_INSTR_POINTER, None) => return Err("no co_code_adaptive offset".into()),
        _ => PY_NO_OFFSET,
    };
    let name = o.code_qualname.unwrap_or(o.code_name);
    // 3.12+: first line and co_version only; before, the name, file and line table too.
    let block_end = match o.code_version {
        Some(v) => v + 4,
        None => o.code_filename.max(name).max(o.code_linetable) + 8,
    };
    if o.code_filename.min(name).min(o.code_linetable) < o.code_firstlineno
        || o.code_version.is_some_and(|v| v < o.code_firstlineno)
        || block_end - o.code_firstlineno > u64::from(PY_CODE_BLOCK)
    {
        return Err(
            "co_filename, co_name and co_linetable are too far from co_firstlineno for one read"
                .into(),
        );
    }
    let instr_size = if instr_kind == PY_INSTR_POINTER { 8 } else { 4 };
    let mut frame_size = (o.frame_previous + 8)
        .max(o.frame_code + 8)
        .max(o.frame_instr + instr_size);
    if frame_entry != PY_NO_OFFSET {
        frame_size = frame_size.max(u64::from(frame_entry) + 1);
    }
    if frame_size > u64::from(PY_FRAME_BLOCK) {
        return Err("frame fields span more than one read".into());
    }
    Ok(PyProc {
        runtime_addr: process.runtime_addr,
        runtime_interp_head: u(o.runtime_interpreters_head, "interpreters.head")?,
        interp_threads_head: u(o.interp_threads_head, "threads.head")?,
        tstate_next: u(o.tstate_next, "tstate.next")?,
        tstate_match,
        tstate_thread: u(tstate_thread, "tstate thread id")?,
        tstate_frame: u(o.tstate_frame, "tstate frame")?,
        cframe_current,
        frame_previous: u(o.frame_previous, "frame.previous")?,
        frame_code: u(o.frame_code, "frame.code")?,
        frame_instr: u(o.frame_instr, "frame.instr")?,
        frame_entry,
        instr_kind,
        entry_kind,
        code_adaptive,
        code_firstlineno: u(o.code_firstlineno, "co_firstlineno")?,
        code_filename: u(o.code_filename, "co_filename")?,
        frame_size: frame_size as u32,
        code_size: (block_end - o.code_firstlineno) as u32,
        code_name: u(name, "co_qualname")?,
        frame_window: if instr_kind == PY_INSTR_POINTER {
            PY_WINDOW
        } else {
            0
        },
        name_hash: if o.code_version.is_none() {
            u(STR_HASH, "str hash")?
        } else {
            PY_NO_OFFSET
        },
        code_linetable: u(o.code_linetable, "co_linetable")?,
        name_data: u(o.unicode_ascii_size, "str data")?,
        code_version: match o.code_version {
            Some(v) => u(v, "co_version")?,
            None => PY_NO_OFFSET,
        },
    })
}

#[cfg(test)]
mod tests;
