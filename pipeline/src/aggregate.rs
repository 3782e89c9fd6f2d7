//! Per-sample aggregation: interning stacks and counting (thread, kernel stack, user stack,
//! Python stack).
//!
//! [`Aggregator::record`] runs once per ring buffer record and allocates only when it meets a
//! stack, thread or Python code object for the first time. Addresses of new user stacks are
//! queued per process so the collector can normalize them while the process is alive
//! ([`Aggregator::normalize_pending`]); Python frames are named at once, through
//! [`Python::tokens`]. Native symbolization happens once, in [`Aggregator::into_profile`], which
//! also merges each Python stack into its native stack ([`merge`]).

use std::collections::BTreeMap;

use profiler_common::{
    AllocKey, LiveAlloc, Sample as SampleRecord, SpanRecord, EVENT_ALLOC, EVENT_CPU, EVENT_OFFCPU,
    MAX_PY_FRAMES, MAX_STACK_COPY, MAX_STACK_DEPTH, OFFCPU_IOWAIT, OFFCPU_NO_USER, PY_NO_THREAD,
    PY_READ_FAILED, SPAN_OSP, SPAN_OSP_PARENT, SPAN_OTEL, SPAN_PUBLISHED, TASK_COMM_LEN,
    USTACK_COPY_FAULT, USTACK_COPY_NONE, USTACK_COPY_NO_REGS, USTACK_COPY_OK, USTACK_COPY_SHORT,
};
use rustc_hash::FxHashMap;
use symbolizer::unwind::{FailedBy, StackCopy, TruncatedBy, UnwindStatus, Unwinders};
use symbolizer::{Symbol, Symbolizer};

use crate::offcpu::{classify, BlockFacts};
use crate::profile::{
    scale_allocation, Frame, FrameKind, Memory, Meta, OsProfilerIds, Process, Profile, PythonStats,
    Sample, SpanContext, SpanName, Thread, Timed,
};
use crate::python::{split_token, Python, TOKEN_ENTRY, TRUNCATED_FUNCTION};
use crate::resource::ProcessInfo;

mod merge;
pub use merge::{merge, Piece};

/// An aggregate being symbolized ([`Aggregator::into_pending`]).
#[derive(Debug)]
pub struct PendingProfile {
    agg: Aggregator,
    meta: Meta,
    user_addrs: Vec<(u32, u64)>,
    kernel_addrs: Vec<u64>,
    job: symbolizer::Job,
}

impl PendingProfile {
    /// Symbolizes for about `budget` (at least one module); true once all is done.
    pub fn step(&mut self, symbolizer: &mut Symbolizer, budget: std::time::Duration) -> bool {
        symbolizer.step(&mut self.job, budget)
    }

    /// The profile (addresses not symbolized yet, if any, are unknown frames).
    pub fn finish(self, python: &Python) -> Profile {
        let syms = self.job.finish();
        self.agg
            .build(python, self.meta, self.user_addrs, syms, self.kernel_addrs)
    }
}

/// Frame shown where C code called into Python but native unwinding could not show it.
pub const NATIVE_CODE: &str = "[native code]";
/// Frame at the root end of a Python stack that was cut.
pub const TRUNCATED: &str = "[truncated]";
/// The whole stack of a sample without Python frames, under `--python-only`.
pub const NO_PYTHON_FRAMES: &str = "[no python frames]";

/// What to keep of each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Keep kernel frames (`--no-kernel` clears it).
    pub kernel: bool,
    /// Keep Python line numbers (`--no-lines` clears it: one frame per function).
    pub lines: bool,
    /// Keep only Python frames (`--python-only`).
    pub python_only: bool,
    /// Bytes between two sampled allocations on average (`--alloc-rate`), to scale them.
    pub alloc_rate: u64,
    /// Remember each sampled allocation's stack until the end, for the memory in use
    /// (`--event heap`).
    pub heap: bool,
    /// Keep each event's time (for outputs with timestamps: OTLP), up to [`MAX_TIMED`].
    pub timestamps: bool,
    /// Distinct count keys (stack, thread, span, event) at most, 0 for no limit; samples of
    /// new keys past it are dropped and counted ([`Aggregator::dropped`]).
    pub max_keys: usize,
    /// Processes at most, 0 for no limit; samples of new processes past it are dropped.
    pub max_processes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kernel: true,
            lines: true,
            python_only: false,
            alloc_rate: crate::profile::DEFAULT_ALLOC_RATE,
            heap: false,
            timestamps: false,
            max_keys: 0,
            max_processes: 0,
        }
    }
}

/// Stack id of "no stack" (empty kernel stack for samples in user mode).
const EMPTY: u32 = 0;

/// Interns stacks of return addresses, given leaf first. Id [`EMPTY`] is the empty stack.
#[derive(Debug)]
struct StackTable {
    /// Each stack is stored once, as a key; [`StackTable::by_id`] inverts the map at the end.
    ids: FxHashMap<Box<[u64]>, u32>,
}

impl Default for StackTable {
    fn default() -> Self {
        let mut t = StackTable {
            ids: FxHashMap::default(),
        };
        t.intern(&[]);
        t
    }
}

impl StackTable {
    /// Returns the id and whether the stack is new. Allocates only for new stacks.
    fn intern(&mut self, stack: &[u64]) -> (u32, bool) {
        if let Some(&id) = self.ids.get(stack) {
            return (id, false);
        }
        let id = self.ids.len() as u32;
        self.ids.insert(stack.into(), id);
        (id, true)
    }

    /// The stacks indexed by id.
    fn by_id(&self) -> Vec<&[u64]> {
        let mut v: Vec<&[u64]> = vec![&[]; self.ids.len()];
        for (stack, &id) in &self.ids {
            v[id as usize] = stack;
        }
        v
    }
}

/// (pid, tid, kernel stack, user stack, Python stack, span, how the user stack was unwound,
/// off-CPU facts: 0 for on-CPU samples, else [`off_cpu_key`]).
type CountKey = (u32, u32, u32, u32, u32, u32, UnwindStatus, u32);

/// What one count key holds: on-CPU samples, off-CPU nanoseconds, allocations (scaled), and
/// with [`Options::timestamps`] each event's time and value (`CLOCK_MONOTONIC`, unscaled).
#[derive(Debug, Clone, Default)]
struct Counts {
    samples: u64,
    off_cpu_ns: u64,
    alloc_objects: f64,
    alloc_bytes: f64,
    inuse_objects: f64,
    inuse_bytes: f64,
    times: Vec<(u64, u64)>,
    inuse_times: Vec<(u64, u64)>,
}

/// Events whose times are kept at most (16 bytes each: 32 MiB). Past it no time is kept and
/// those kept are dropped at the end, so that every sample of a profile has the same shape
/// (values and times, or values only).
pub const MAX_TIMED: usize = 1 << 21;

/// The facts key of allocation samples (off-CPU keys are odd).
const ALLOC_KEY: u32 = 2;

/// Sampled allocations whose stacks are remembered for the heap profile, at most (about 50
/// MiB); later ones still count as allocated, and as unattributed if still in use at the end.
const MAX_HEAP_SITES: usize = 1 << 20;

/// The facts of an off-CPU record that its reason depends on, packed: bit 0 set (off-CPU),
/// bit 1 in I/O wait, bit 2 the first argument was 0, bits 16.. the system call number + 1
/// (0: none).
fn off_cpu_key(h: &profiler_common::SampleHeader) -> u32 {
    let syscall = u32::try_from(h.syscall_nr)
        .ok()
        .filter(|&nr| nr < 0x7fff && h.offcpu_flags & OFFCPU_NO_USER == 0)
        .map_or(0, |nr| nr + 1);
    1 | u32::from(h.offcpu_flags & OFFCPU_IOWAIT != 0) << 1
        | u32::from(h.syscall_arg0 == 0) << 2
        | syscall << 16
}

/// The inverse of [`off_cpu_key`].
fn block_facts(key: u32) -> BlockFacts {
    BlockFacts {
        syscall: (key >> 16).checked_sub(1),
        arg0_zero: key & 4 != 0,
        iowait: key & 2 != 0,
    }
}

/// Counts samples by (thread, kernel stack, user stack, Python stack).
#[derive(Debug)]
pub struct Aggregator {
    opts: Options,
    kernel: StackTable,
    user: FxHashMap<u32, StackTable>,
    /// Python stacks as tokens ([`Python::tokens`]), innermost first; ids are global.
    python: StackTable,
    /// By (pid, tid, kernel stack, user stack, Python stack, span, how the user stack was
    /// unwound): a tid can come back under another pid. Span 0 is none, else an index into
    /// `spans` plus one.
    counts: FxHashMap<CountKey, Counts>,
    /// Distinct span contexts, in order of appearance.
    spans: Vec<SpanContext>,
    span_ids: FxHashMap<SpanContext, u32>,
    /// Latest `comm` of each (pid, tid).
    threads: FxHashMap<(u32, u32), [u8; TASK_COMM_LEN]>,
    /// The `threading.Thread` name of each Python (pid, tid) that has one: it wins over `comm`.
    python_thread_names: FxHashMap<(u32, u32), String>,
    processes: BTreeMap<u32, String>,
    pending: FxHashMap<u32, Vec<u64>>,
    samples: u64,
    python_stats: PythonStats,
    scratch: [u64; MAX_STACK_DEPTH],
    py_scratch: Box<[u64; MAX_PY_FRAMES + 1]>,
    /// `--event heap`: the count key of each sampled allocation and when it was made, by id.
    alloc_keys: FxHashMap<u64, (CountKey, u64)>,
    /// When each process last called execve (`CLOCK_MONOTONIC`).
    execs: FxHashMap<u32, u64>,
    /// Sampled allocations still in use at the end whose stack was not remembered.
    unattributed_inuse: u64,
    /// Events whose time is kept ([`MAX_TIMED`] at most).
    timed: usize,
    /// More than [`MAX_TIMED`] events came: times are not kept.
    timed_overflow: bool,
    /// What each process said about itself when first sampled.
    process_info: FxHashMap<u32, ProcessInfo>,
    /// Samples left out by [`Options::max_keys`] or [`Options::max_processes`].
    dropped: u64,
    /// User stacks unwound from the stack copy (`--unwind dwarf`).
    unwinders: Unwinders,
    unwound: [u64; MAX_STACK_DEPTH],
    last_sweep: std::time::Instant,
    /// Processes whose stacks the copy truncated, for the session to give a bigger copy (each
    /// pid once until it execs).
    truncated_by_copy: Vec<u32>,
    raised: rustc_hash::FxHashSet<u32>,
    /// Processes whose exit record came since the last [`Aggregator::normalize_pending`].
    exited: Vec<u32>,
}

/// How often the unwinders of processes that exited are dropped.
const UNWINDERS_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Aggregator {
    /// An empty aggregate; what `opts` drops is dropped at the door.
    pub fn new(opts: Options) -> Self {
        Aggregator {
            opts,
            kernel: StackTable::default(),
            user: FxHashMap::default(),
            python: StackTable::default(),
            counts: FxHashMap::default(),
            spans: Vec::new(),
            span_ids: FxHashMap::default(),
            threads: FxHashMap::default(),
            python_thread_names: FxHashMap::default(),
            processes: BTreeMap::new(),
            pending: FxHashMap::default(),
            samples: 0,
            alloc_keys: FxHashMap::default(),
            execs: FxHashMap::default(),
            unattributed_inuse: 0,
            timed: 0,
            timed_overflow: false,
            process_info: FxHashMap::default(),
            dropped: 0,
            python_stats: PythonStats::default(),
            scratch: [0; MAX_STACK_DEPTH],
            py_scratch: Box::new([0; MAX_PY_FRAMES + 1]),
            unwinders: Unwinders::new(),
            unwound: [0; MAX_STACK_DEPTH],
            last_sweep: std::time::Instant::now(),
            truncated_by_copy: Vec::new(),
            raised: Default::default(),
            exited: Vec::new(),
        }
    }

    /// A process called execve (at `time_ns`, `CLOCK_MONOTONIC`): the memory it had allocated
    /// before is gone, and so are the modules its stacks were unwound with.
    pub fn exec(&mut self, pid: u32, time_ns: u64) {
        // Only the heap profile needs exec times (a daemon would keep one per pid forever).
        if self.opts.heap {
            self.execs.insert(pid, time_ns);
        }
        self.forget(pid);
        // The process describes itself anew (executable, command line, service name): a
        // wrapper (`sh -c 'exec python …'`) is not the program's resource.
        if self.opts.timestamps && self.processes.contains_key(&pid) {
            self.process_info.insert(pid, ProcessInfo::read(pid));
            if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
                self.processes.insert(pid, comm.trim_end().to_string());
            }
        }
    }

    /// A process exited (its exit record: every sample of it was recorded before): its
    /// unwinder goes at once, and what names its addresses once they are normalized
    /// ([`Aggregator::normalize_pending`]).
    pub fn exited(&mut self, pid: u32) {
        self.forget(pid);
        self.exited.push(pid);
    }

    /// A process exec'd or exited: the modules its stacks were unwound with are gone.
    pub fn forget(&mut self, pid: u32) {
        self.unwinders.forget(pid);
        self.raised.remove(&pid);
        self.truncated_by_copy.retain(|&p| p != pid);
    }

    /// Processes whose stacks the copy truncated since the last call, each once.
    pub fn take_truncated_by_copy(&mut self) -> std::vec::Drain<'_, u32> {
        self.truncated_by_copy.drain(..)
    }

    /// A drain of the ring buffer begins (the unwinders may read each process's maps again).
    pub fn next_drain(&mut self) {
        self.unwinders.next_drain();
        if self.last_sweep.elapsed() >= UNWINDERS_SWEEP_EVERY {
            self.last_sweep = std::time::Instant::now();
            self.unwinders.sweep();
            // A pid that comes back is another process: it may need a bigger copy again.
            self.raised
                .retain(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        }
    }

    /// What the unwinders read.
    pub fn unwind_stats(&self) -> symbolizer::unwind::UnwindStats {
        self.unwinders.stats()
    }

    /// Bytes of the unwind tables held for the processes known.
    pub fn unwind_table_bytes(&self) -> u64 {
        self.unwinders.table_bytes()
    }

    /// The sample's user stack, leaf first, and how it was unwound: the kernel's frame-pointer
    /// walk as it came, or the stack copy unwound here.
    fn user_stack<'s>(
        unwinders: &mut Unwinders,
        unwound: &'s mut [u64; MAX_STACK_DEPTH],
        sample: &SampleRecord<'s>,
    ) -> (&'s [u64], UnwindStatus) {
        let h = sample.header;
        match h.ustack_copy_status & 0xff {
            USTACK_COPY_NONE => (sample.user_stack(), UnwindStatus::Unchecked),
            USTACK_COPY_OK => {
                let copy = StackCopy {
                    ip: h.user_ip,
                    sp: h.user_sp,
                    bp: h.user_bp,
                    bytes: sample.user_stack_copy(),
                    reached_top: h.ustack_copy_status & USTACK_COPY_SHORT != 0,
                };
                let (n, status) = unwinders.unwind(h.pid, &copy, unwound);
                (&unwound[..n], status)
            }
            USTACK_COPY_FAULT => (&[], UnwindStatus::Failed(FailedBy::StackUnreadable)),
            // A thread with no user state (an io_uring worker of the process): its empty user
            // stack is the whole of it.
            USTACK_COPY_NO_REGS => (&[], UnwindStatus::Complete),
            // A status this build does not know.
            _ => (&[], UnwindStatus::Unchecked),
        }
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Samples left out by the limits ([`Options::max_keys`], [`Options::max_processes`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// New limits ([`Options::max_keys`], [`Options::max_processes`]), from the next sample on.
    pub fn set_limits(&mut self, max_keys: usize, max_processes: usize) {
        self.opts.max_keys = max_keys;
        self.opts.max_processes = max_processes;
    }

    /// Ends a window (the daemon): returns what was aggregated so far and goes on empty,
    /// keeping what outlives a window: the unwind tables of the processes, exec times.
    pub fn take_window(&mut self) -> Aggregator {
        let mut next = Aggregator::new(self.opts);
        std::mem::swap(&mut next.unwinders, &mut self.unwinders);
        next.execs = self.execs.clone();
        next.raised = std::mem::take(&mut self.raised);
        std::mem::replace(self, next)
    }

    /// Whether a sample of `pid` is counted: a new process past `max_processes` is left out
    /// whole (before any work on its stacks, or on finding its interpreter).
    pub fn accepts(&self, pid: u32) -> bool {
        self.opts.max_processes == 0
            || self.processes.len() < self.opts.max_processes
            || self.processes.contains_key(&pid)
    }

    /// Counts one sample; its Python frames are named through `python` (the collector has
    /// shown it the process first: [`Python::saw`]).
    pub fn record(&mut self, sample: &SampleRecord<'_>, python: &mut Python) {
        let rec = sample.header;
        if !self.accepts(rec.pid) {
            self.dropped += 1;
            return;
        }
        self.samples += 1;
        let frames = sample.python_stack();
        // A Python thread's `threading.Thread` name, read while it runs.
        if !frames.is_empty() {
            if let Some(name) = python.thread_name(rec.pid, rec.tid) {
                if self
                    .python_thread_names
                    .get(&(rec.pid, rec.tid))
                    .map(String::as_str)
                    != Some(name)
                {
                    self.python_thread_names
                        .insert((rec.pid, rec.tid), name.to_owned());
                }
            }
        }
        let mut n = python.tokens(
            rec.pid,
            frames,
            self.opts.lines,
            &mut self.py_scratch[..MAX_PY_FRAMES],
        );
        let stats = &mut self.python_stats;
        if n > 0 {
            stats.with_frames += 1;
        }
        match sample.python_status() {
            PY_NO_THREAD => stats.no_thread += 1,
            PY_READ_FAILED => stats.read_failed += 1,
            _ => {}
        }
        if sample.python_truncated() {
            stats.truncated += 1;
            // The marker closes the outermost run (it is where the walk stopped).
            self.py_scratch[n] = u64::from(TRUNCATED_FUNCTION) | TOKEN_ENTRY;
            n += 1;
        }
        let pyid = self.python.intern(&self.py_scratch[..n]).0;
        // Off-CPU records keep theirs for their reason even when kernel frames are not shown.
        let kid = if (self.opts.kernel && !self.opts.python_only) || rec.event == EVENT_OFFCPU {
            let n = to_lookup_addrs(sample.kernel_stack(), false, &mut self.scratch);
            self.kernel.intern(&self.scratch[..n]).0
        } else {
            EMPTY
        };
        // A sample taken in the kernel has a user "leaf" that is the return address of the
        // system call, so it is adjusted like every other return address.
        let in_kernel = !sample.kernel_stack().is_empty();
        let (ustack, unwind) = Self::user_stack(&mut self.unwinders, &mut self.unwound, sample);
        // Only a copy smaller than the largest can be made bigger.
        if unwind == UnwindStatus::Truncated(TruncatedBy::StackCopy)
            && sample.user_stack_copy().len() < MAX_STACK_COPY
            && self.raised.insert(rec.pid)
        {
            self.truncated_by_copy.push(rec.pid);
        }
        let n = to_lookup_addrs(ustack, in_kernel, &mut self.scratch);
        let table = self.user.entry(rec.pid).or_default();
        let (uid, new) = table.intern(&self.scratch[..n]);
        if new {
            self.pending
                .entry(rec.pid)
                .or_default()
                .extend_from_slice(&self.scratch[..n]);
        }
        let span = match sample.span() {
            Some(record) => {
                if record.flags & SPAN_PUBLISHED != 0 {
                    self.python_stats.published_spans += 1;
                }
                self.span_id(record)
            }
            None => 0,
        };
        let off = match rec.event {
            EVENT_OFFCPU => off_cpu_key(rec),
            EVENT_ALLOC => ALLOC_KEY,
            _ => 0,
        };
        let key = (rec.pid, rec.tid, kid, uid, pyid, span, unwind, off);
        if self.opts.max_keys != 0
            && self.counts.len() >= self.opts.max_keys
            && !self.counts.contains_key(&key)
        {
            // NB: its stacks were interned above; the stack tables grow with distinct stacks
            // seen, as the counts would.
            self.samples -= 1;
            self.dropped += 1;
            return;
        }
        let counts = self.counts.entry(key).or_default();
        if self.opts.timestamps && !self.timed_overflow {
            if self.timed < MAX_TIMED {
                let value = if rec.event == EVENT_CPU {
                    1
                } else {
                    rec.weight
                };
                counts.times.push((rec.time_ns, value));
                self.timed += 1;
            } else {
                self.timed_overflow = true;
            }
        }
        match rec.event {
            EVENT_OFFCPU => {
                counts.off_cpu_ns = counts.off_cpu_ns.saturating_add(rec.weight);
            }
            EVENT_ALLOC => {
                let (objects, bytes) = scale_allocation(rec.weight, self.opts.alloc_rate);
                counts.alloc_objects += objects;
                counts.alloc_bytes += bytes;
                if self.opts.heap && self.alloc_keys.len() < MAX_HEAP_SITES {
                    self.alloc_keys.insert(rec.alloc_id, (key, rec.time_ns));
                }
            }
            _ => counts.samples += 1,
        }
        // Threads rename themselves (pthread_setname_np); the latest name wins.
        *self.threads.entry((rec.pid, rec.tid)).or_default() = rec.comm;
        if let std::collections::btree_map::Entry::Vacant(e) = self.processes.entry(rec.pid) {
            e.insert(process_name(rec.pid, sample.comm()));
            if self.opts.timestamps {
                // Once per process, while it (hopefully) still runs: for its OTLP resource.
                self.process_info
                    .insert(rec.pid, ProcessInfo::read(rec.pid));
            }
        }
    }

    /// The id (index + 1) of a span context; allocates only for a context seen first.
    fn span_id(&mut self, record: &SpanRecord) -> u32 {
        let span = span_context(record);
        if span.is_empty() {
            return 0;
        }
        if let Some(&id) = self.span_ids.get(&span) {
            return id;
        }
        self.spans.push(span);
        let id = self.spans.len() as u32;
        self.span_ids.insert(span, id);
        id
    }

    /// The sampled allocations not freed at the end (`--event heap`): each adds to the memory in
    /// use of the stack it was allocated in.
    pub fn set_live(&mut self, live: Vec<(AllocKey, LiveAlloc)>) {
        for (_, alloc) in live {
            let Some(&(key, time_ns)) = self.alloc_keys.get(&alloc.alloc_id) else {
                self.unattributed_inuse += 1;
                continue;
            };
            // Memory of a program the process replaced with execve is gone.
            if self.execs.get(&key.0).is_some_and(|&exec| exec > time_ns) {
                continue;
            }
            let (objects, bytes) = scale_allocation(alloc.size, self.opts.alloc_rate);
            let counts = self.counts.entry(key).or_default();
            counts.inuse_objects += objects;
            counts.inuse_bytes += bytes;
            if self.opts.timestamps && !counts.times.is_empty() {
                counts.inuse_times.push((time_ns, alloc.size));
            }
        }
    }

    /// Sampled allocations in use at the end whose stack was not remembered (sampled after the
    /// last drain, or more than `MAX_HEAP_SITES`).
    pub fn unattributed_inuse(&self) -> u64 {
        self.unattributed_inuse
    }

    /// Normalizes the user addresses of stacks seen since the last call, while their processes
    /// are (hopefully) still alive, or from the memory maps read while they lived; then tells
    /// the symbolizer of the processes that exited since (none of their addresses is left to
    /// normalize).
    pub fn normalize_pending(&mut self, symbolizer: &mut Symbolizer) {
        for (pid, mut addrs) in self.pending.drain() {
            symbolizer.normalize(pid, &mut addrs);
        }
        for pid in self.exited.drain(..) {
            symbolizer.exited(pid);
        }
    }

    /// Symbolizes every stack and builds the profile.
    pub fn into_profile(self, symbolizer: &mut Symbolizer, python: &Python, meta: Meta) -> Profile {
        let mut pending = self.into_pending(symbolizer, meta);
        while !pending.step(symbolizer, std::time::Duration::MAX) {}
        pending.finish(python)
    }

    /// Begins [`Aggregator::into_profile`] a part at a time: [`PendingProfile::step`]
    /// symbolizes a few modules per call, so that a caller (the daemon) drains samples in
    /// between, and [`PendingProfile::finish`] builds the profile.
    pub fn into_pending(mut self, symbolizer: &mut Symbolizer, meta: Meta) -> PendingProfile {
        self.normalize_pending(symbolizer);

        // Every distinct address once, in a stable order.
        let mut user_addrs: Vec<(u32, u64)> = self
            .user
            .iter()
            .flat_map(|(&pid, t)| t.ids.keys().flat_map(|s| s.iter()).map(move |&a| (pid, a)))
            .collect();
        user_addrs.sort_unstable();
        user_addrs.dedup();
        let mut kernel_addrs: Vec<u64> = self
            .kernel
            .ids
            .keys()
            .flat_map(|s| s.iter())
            .copied()
            .collect();
        kernel_addrs.sort_unstable();
        kernel_addrs.dedup();
        let job = symbolizer.start(&user_addrs, kernel_addrs.clone());
        PendingProfile {
            agg: self,
            meta,
            user_addrs,
            kernel_addrs,
            job,
        }
    }

    /// Builds the profile of the symbols of its addresses.
    fn build(
        mut self,
        python: &Python,
        mut meta: Meta,
        user_addrs: Vec<(u32, u64)>,
        (user_syms, kernel_syms): (Vec<Symbol>, Vec<Symbol>),
        kernel_addrs: Vec<u64>,
    ) -> Profile {
        meta.python = PythonStats {
            processes: python.found(),
            notes: python.notes(),
            spans_enabled: python.spans_enabled(),
            span_processes: python.with_spans(),
            ..self.python_stats.clone()
        };
        let mut frames = FrameTable::default();
        let user_frame: FxHashMap<(u32, u64), u32> = user_addrs
            .iter()
            .zip(user_syms)
            .map(|(&k, s)| (k, frames.intern(s, FrameKind::Native)))
            .collect();
        let kernel_frame: FxHashMap<u64, u32> = kernel_addrs
            .iter()
            .zip(kernel_syms)
            .map(|(&a, s)| (a, frames.intern(s, FrameKind::Kernel)))
            .collect();

        let mut thread_ids: Vec<(u32, u32)> = self.threads.keys().copied().collect();
        thread_ids.sort_unstable();
        let thread_index: FxHashMap<(u32, u32), u32> = thread_ids
            .iter()
            .enumerate()
            .map(|(i, &key)| (key, i as u32))
            .collect();
        let threads: Vec<Thread> = thread_ids
            .iter()
            .map(|&(pid, tid)| Thread {
                pid,
                tid,
                name: self
                    .python_thread_names
                    .get(&(pid, tid))
                    .cloned()
                    .unwrap_or_else(|| comm_string(&self.threads[&(pid, tid)])),
            })
            .collect();

        let kernel_stacks = self.kernel.by_id();
        let python_stacks = self.python.by_id();
        let user_stacks: FxHashMap<u32, Vec<&[u64]>> =
            self.user.iter().map(|(&pid, t)| (pid, t.by_id())).collect();
        let mut python_frame: FxHashMap<u64, u32> = FxHashMap::default();
        let mut pieces = Vec::new();
        let mut samples: Vec<Sample> = Vec::with_capacity(self.counts.len());
        // Monotonic event times to wall-clock ones; none at all past MAX_TIMED.
        let to_unix = unix_offset_ns();
        let keep_times = self.opts.timestamps && !self.timed_overflow;
        let timed = |times: &[(u64, u64)]| -> Vec<Timed> {
            if !keep_times {
                return Vec::new();
            }
            let mut v: Vec<Timed> = times
                .iter()
                .map(|&(t, value)| Timed {
                    unix_ns: t.saturating_add_signed(to_unix),
                    value,
                })
                .collect();
            v.sort_unstable();
            v
        };
        for (&(pid, tid, kid, uid, pyid, span, unwind, off), counts) in &self.counts {
            let ustack = user_stacks[&pid][uid as usize];
            let kstack = kernel_stacks[kid as usize];
            let pystack = python_stacks[pyid as usize];
            pieces.clear();
            // A stack unwound with the unwind tables holds every interpreter frame up to where it
            // stopped, frame pointers or not.
            let info = python.merge_info(pid).map(|mut info| {
                info.native_trusted |=
                    matches!(unwind, UnwindStatus::Complete | UnwindStatus::Truncated(_));
                info
            });
            merge(ustack, pystack, info, &mut pieces);
            // Root first: outermost user frame … user leaf, then syscall entry … kernel leaf.
            let mut stack: Vec<u32> = Vec::with_capacity(pieces.len() + kstack.len());
            for piece in pieces.iter().rev() {
                let id = match *piece {
                    Piece::Native(a) if !self.opts.python_only => user_frame[&(pid, a)],
                    Piece::NativeCode if !self.opts.python_only => frames.placeholder(NATIVE_CODE),
                    Piece::Native(_) | Piece::NativeCode => continue,
                    Piece::Python(token) => {
                        let (func, _, _) = split_token(token);
                        if func == TRUNCATED_FUNCTION {
                            frames.placeholder(TRUNCATED)
                        } else {
                            let key = token & !TOKEN_ENTRY;
                            *python_frame
                                .entry(key)
                                .or_insert_with(|| frames.insert(python_frame_of(python, key)))
                        }
                    }
                };
                stack.push(id);
            }
            if self.opts.kernel && !self.opts.python_only {
                stack.extend(kstack.iter().rev().map(|a| kernel_frame[a]));
            }
            // Off-CPU: the reason, from the kernel and native frames, as a root pseudo-frame.
            let reason = (off & 1 == 1).then(|| {
                let name = |id: u32| frames.frames[id as usize].function.as_deref().unwrap_or("");
                let kernel: Vec<&str> = kstack.iter().map(|a| name(kernel_frame[a])).collect();
                // Unknown native frames keep their module (`[unknown] (python3.11+0x…)`): the
                // classifier knows a stripped interpreter's GIL wait by its caller's module.
                let native: Vec<String> = ustack
                    .iter()
                    .map(|a| frames.frames[user_frame[&(pid, *a)] as usize].base_name())
                    .collect();
                let native: Vec<&str> = native.iter().map(String::as_str).collect();
                classify(&block_facts(off), &kernel, &native)
            });
            if let Some(reason) = reason {
                stack.insert(0, frames.placeholder(&reason.frame_name()));
            }
            if stack.is_empty() {
                stack.push(frames.placeholder(if self.opts.python_only {
                    NO_PYTHON_FRAMES
                } else {
                    crate::wording::NO_STACK
                }));
            }
            samples.push(Sample {
                frames: stack,
                thread: thread_index[&(pid, tid)],
                count: counts.samples,
                off_cpu_ns: counts.off_cpu_ns,
                off_cpu: reason,
                alloc: Memory {
                    objects: counts.alloc_objects.round() as u64,
                    bytes: counts.alloc_bytes.round() as u64,
                },
                inuse: Memory {
                    objects: counts.inuse_objects.round() as u64,
                    bytes: counts.inuse_bytes.round() as u64,
                },
                span: span.checked_sub(1),
                unwind,
                times: timed(&counts.times),
                inuse_times: timed(&counts.inuse_times),
            });
        }
        samples.sort_by(|a, b| {
            (a.thread, &a.frames, a.span, a.unwind, a.off_cpu)
                .cmp(&(b.thread, &b.frames, b.span, b.unwind, b.off_cpu))
        });
        // Off-CPU keys that differ only in facts the reason did not depend on are one sample.
        samples.dedup_by(|b, a| {
            let same = (a.thread, &a.frames, a.span, a.unwind, a.off_cpu)
                == (b.thread, &b.frames, b.span, b.unwind, b.off_cpu);
            if same {
                a.count += b.count;
                a.off_cpu_ns = a.off_cpu_ns.saturating_add(b.off_cpu_ns);
                a.alloc.objects += b.alloc.objects;
                a.alloc.bytes += b.alloc.bytes;
                a.inuse.objects += b.inuse.objects;
                a.inuse.bytes += b.inuse.bytes;
                a.times.append(&mut b.times);
                a.times.sort_unstable();
                a.inuse_times.append(&mut b.inuse_times);
                a.inuse_times.sort_unstable();
            }
            same
        });

        Profile {
            meta,
            frames: frames.frames,
            threads,
            processes: self
                .processes
                .into_iter()
                .map(|(pid, name)| {
                    let mut info = self.process_info.remove(&pid).unwrap_or_default();
                    info.runtime = python
                        .runtime_version(pid)
                        .map(|v| ("cpython".to_string(), v.to_string()));
                    Process { pid, name, info }
                })
                .collect(),
            samples,
            spans: self.spans,
        }
    }
}

/// The ids a span record carries, as the profile keeps them.
fn span_context(r: &SpanRecord) -> SpanContext {
    SpanContext {
        trace_id: (r.flags & SPAN_OTEL != 0).then_some(r.trace_id),
        span_id: (r.flags & SPAN_OTEL != 0).then_some(r.span_id),
        osprofiler: (r.flags & SPAN_OSP != 0).then_some(OsProfilerIds {
            base_id: r.osp_base,
            trace_id: r.osp_current,
            parent_id: (r.flags & SPAN_OSP_PARENT != 0).then_some(r.osp_parent),
        }),
        // A name only beside its ids (the kernel sets it no other way).
        span_name: r
            .otel_name()
            .filter(|_| r.flags & SPAN_OTEL != 0)
            .and_then(SpanName::from_ascii),
        osprofiler_name: r
            .osp_name()
            .filter(|_| r.flags & SPAN_OSP != 0)
            .and_then(SpanName::from_ascii),
    }
}

/// The profile frame of a Python token (without its entry flag).
fn python_frame_of(python: &Python, token: u64) -> Frame {
    let (func, line, _) = split_token(token);
    let f = &python.functions()[func as usize];
    Frame {
        kind: FrameKind::Python,
        function: Some(f.name.clone()),
        module: None,
        address: 0,
        file: f.file.clone(),
        line: (line != 0).then_some(line),
        unknown_reason: None,
    }
}

/// Copies a leaf-first stack of return addresses, turning every return address (all but the
/// leaf, and the leaf too when `leaf_is_return` says it is one) into an address inside the call
/// instruction, so the caller's line and function are found even when the call is the last
/// instruction of a function.
fn to_lookup_addrs(stack: &[u64], leaf_is_return: bool, out: &mut [u64; MAX_STACK_DEPTH]) -> usize {
    let n = stack.len().min(MAX_STACK_DEPTH);
    for (i, (&a, o)) in stack.iter().zip(out.iter_mut()).enumerate() {
        *o = if i == 0 && !leaf_is_return {
            a
        } else {
            a.saturating_sub(1)
        };
    }
    n
}

fn comm_string(comm: &[u8; TASK_COMM_LEN]) -> String {
    String::from_utf8_lossy(profiler_common::comm_bytes(comm)).into_owned()
}

/// What to add to a `CLOCK_MONOTONIC` time (the clock of `bpf_ktime_get_ns`) for the Unix time.
fn unix_offset_ns() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    unix - crate::monotonic_ns() as i64
}

/// The process's name: `/proc/PID/comm` of the main thread, else the sampled thread's comm.
fn process_name(pid: u32, thread_comm: &[u8]) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(thread_comm).into_owned())
}

#[derive(Debug, Default)]
struct FrameTable {
    ids: FxHashMap<Frame, u32>,
    frames: Vec<Frame>,
}

impl FrameTable {
    fn intern(&mut self, sym: Symbol, kind: FrameKind) -> u32 {
        let frame = Frame {
            kind,
            function: sym.function,
            module: sym.module,
            address: sym.address,
            file: sym.file,
            line: sym.line,
            unknown_reason: sym.unknown_reason,
        };
        self.insert(frame)
    }

    fn insert(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.ids.insert(frame.clone(), id);
        self.frames.push(frame);
        id
    }

    fn placeholder(&mut self, name: &str) -> u32 {
        self.insert(Frame {
            kind: FrameKind::Native,
            function: Some(name.to_string()),
            module: None,
            address: 0,
            file: None,
            line: None,
            unknown_reason: None,
        })
    }
}

#[cfg(test)]
mod tests;
