//! The count stage: interns the stacks of each [`Resolved`] sample and counts it per (thread,
//! kernel stack, user stack, Python stack, span, unwinding, off-CPU facts).
//!
//! It reads nothing of the live system: what it learns of a process (its name, its resource)
//! is given to it ([`Counter::describe`]) when [`Counter::count`] or [`Counter::exec`] says it
//! needs it. [`Counter::count`] allocates only when it meets a stack, thread, span or process
//! for the first time.

use std::collections::BTreeMap;

use profiler_common::{EVENT_ALLOC, EVENT_CPU, EVENT_OFFCPU, TASK_COMM_LEN};
use rustc_hash::FxHashMap;
use symbolizer::unwind::UnwindStatus;

use crate::offcpu::BlockFacts;
use crate::profile::{PythonStats, SpanContext};
use crate::resolve::{
    ProcessFacts, Resolved, PY_FLAG_NO_THREAD, PY_FLAG_PUBLISHED_SPAN, PY_FLAG_READ_FAILED,
    PY_FLAG_TRUNCATED, PY_WITH_FRAMES,
};
use crate::resource::ProcessInfo;
use crate::Options;

/// Stack id of "no stack" (empty kernel stack for samples in user mode).
pub const EMPTY: u32 = 0;

/// Interns stacks of return addresses, given leaf first. Id [`EMPTY`] is the empty stack.
#[derive(Debug)]
pub struct StackTable {
    /// Each stack is stored once, as a key; [`StackTable::by_id`] inverts the map at the end.
    pub(crate) ids: FxHashMap<Box<[u64]>, u32>,
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
    pub fn intern(&mut self, stack: &[u64]) -> (u32, bool) {
        if let Some(&id) = self.ids.get(stack) {
            return (id, false);
        }
        let id = self.ids.len() as u32;
        self.ids.insert(stack.into(), id);
        (id, true)
    }

    /// The stacks indexed by id.
    pub fn by_id(&self) -> Vec<&[u64]> {
        let mut v: Vec<&[u64]> = vec![&[]; self.ids.len()];
        for (stack, &id) in &self.ids {
            v[id as usize] = stack;
        }
        v
    }
}

/// (pid, tid, the thread's Python name at the sample (0: none, else an index into
/// [`Counter::thread_names`] plus one), kernel stack, user stack, Python stack, span, how the
/// user stack was unwound, off-CPU facts: 0 for on-CPU samples, else
/// [`crate::resolve::off_cpu_key`]).
pub type CountKey = (u32, u32, u32, u32, u32, u32, u32, UnwindStatus, u32);

/// What one count key holds: on-CPU samples, off-CPU nanoseconds, allocations (scaled), and
/// with [`Options::timestamps`] each event's time and value (`CLOCK_MONOTONIC`, unscaled).
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub(crate) samples: u64,
    pub(crate) off_cpu_ns: u64,
    pub(crate) alloc_objects: f64,
    pub(crate) alloc_bytes: f64,
    pub(crate) inuse_objects: f64,
    pub(crate) inuse_bytes: f64,
    pub(crate) times: Vec<(u64, u64)>,
    pub(crate) inuse_times: Vec<(u64, u64)>,
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

pub use crate::profile::scale_allocation;

/// The inverse of [`crate::resolve::off_cpu_key`].
pub fn block_facts(key: u32) -> BlockFacts {
    BlockFacts {
        syscall: (key >> 16).checked_sub(1),
        arg0_zero: key & 4 != 0,
        iowait: key & 2 != 0,
    }
}

/// Counts samples by (thread, kernel stack, user stack, Python stack, span, unwinding, event).
#[derive(Debug)]
pub struct Counter {
    pub(crate) opts: Options,
    pub(crate) kernel: StackTable,
    pub(crate) user: FxHashMap<u32, StackTable>,
    /// Python stacks as tokens, innermost first; ids are global.
    pub(crate) python: StackTable,
    /// By [`CountKey`]: a tid can come back under another pid. Span 0 is none, else an index
    /// into `spans` plus one.
    pub(crate) counts: FxHashMap<CountKey, Counts>,
    /// Distinct span contexts, in order of appearance.
    pub(crate) spans: Vec<SpanContext>,
    span_ids: FxHashMap<SpanContext, u32>,
    /// Latest `comm` of each (pid, tid).
    pub(crate) threads: FxHashMap<(u32, u32), [u8; TASK_COMM_LEN]>,
    /// The latest `threading.Thread` name of each Python (pid, tid) that has one: it names
    /// the thread's samples that have only a `comm`.
    pub(crate) python_thread_names: FxHashMap<(u32, u32), String>,
    /// The Python names samples had, by the index in [`CountKey`] less one: a renamed thread's
    /// samples keep the name they were taken under. (A thread's `comm` is not kept per sample:
    /// a C thread that names itself as it starts would be two threads.)
    pub(crate) thread_names: Vec<Box<str>>,
    python_name_ids: FxHashMap<Box<str>, u32>,
    pub(crate) processes: BTreeMap<u32, String>,
    /// New user addresses by process, to normalize while the process lives.
    pub(crate) pending: FxHashMap<u32, Vec<u64>>,
    samples: u64,
    pub(crate) python_stats: PythonStats,
    /// `--event heap`: the count key of each sampled allocation and when it was made, by id.
    alloc_keys: FxHashMap<u64, (CountKey, u64)>,
    /// When each process last called execve (`CLOCK_MONOTONIC`).
    pub(crate) execs: FxHashMap<u32, u64>,
    /// Sampled allocations still in use at the end whose stack was not remembered.
    unattributed_inuse: u64,
    /// Events whose time is kept ([`MAX_TIMED`] at most).
    timed: usize,
    /// More than [`MAX_TIMED`] events came: times are not kept.
    pub(crate) timed_overflow: bool,
    /// What each process said about itself when first sampled.
    pub(crate) process_info: FxHashMap<u32, ProcessInfo>,
    /// Samples left out by [`Options::max_keys`] or [`Options::max_processes`].
    dropped: u64,
}

impl Counter {
    /// An empty count; what `opts` drops is dropped at the door.
    pub fn new(opts: Options) -> Counter {
        Counter {
            opts,
            kernel: StackTable::default(),
            user: FxHashMap::default(),
            python: StackTable::default(),
            counts: FxHashMap::default(),
            spans: Vec::new(),
            span_ids: FxHashMap::default(),
            threads: FxHashMap::default(),
            python_thread_names: FxHashMap::default(),
            thread_names: Vec::new(),
            python_name_ids: FxHashMap::default(),
            processes: BTreeMap::new(),
            pending: FxHashMap::default(),
            samples: 0,
            python_stats: PythonStats::default(),
            alloc_keys: FxHashMap::default(),
            execs: FxHashMap::default(),
            unattributed_inuse: 0,
            timed: 0,
            timed_overflow: false,
            process_info: FxHashMap::default(),
            dropped: 0,
        }
    }

    /// What it keeps of each sample.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Samples counted so far.
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

    /// Whether a sample of `pid` is counted: a new process past `max_processes` is left out
    /// whole (before any work on its stacks, or on finding its interpreter).
    pub fn accepts(&self, pid: u32) -> bool {
        self.opts.max_processes == 0
            || self.processes.len() < self.opts.max_processes
            || self.processes.contains_key(&pid)
    }

    /// A sample of a process [`Counter::accepts`] refused.
    pub fn refused(&mut self) {
        self.dropped += 1;
    }

    /// Counts one sample (of a process it [`Counter::accepts`]); true when its process is new:
    /// the caller then gives its [`Counter::describe`].
    pub fn count(&mut self, r: &Resolved<'_>) -> bool {
        self.samples += 1;
        if let Some(name) = r.thread_name {
            if self
                .python_thread_names
                .get(&(r.pid, r.tid))
                .map(String::as_str)
                != Some(name)
            {
                self.python_thread_names
                    .insert((r.pid, r.tid), name.to_owned());
            }
        }
        let stats = &mut self.python_stats;
        if r.python_flags & PY_WITH_FRAMES != 0 {
            stats.with_frames += 1;
        }
        if r.python_flags & PY_FLAG_NO_THREAD != 0 {
            stats.no_thread += 1;
        }
        if r.python_flags & PY_FLAG_READ_FAILED != 0 {
            stats.read_failed += 1;
        }
        if r.python_flags & PY_FLAG_TRUNCATED != 0 {
            stats.truncated += 1;
        }
        let pyid = self.python.intern(r.python).0;
        let kid = self.kernel.intern(r.kernel).0;
        let table = self.user.entry(r.pid).or_default();
        let (uid, new) = table.intern(r.user);
        if new {
            self.pending
                .entry(r.pid)
                .or_default()
                .extend_from_slice(r.user);
        }
        if r.python_flags & PY_FLAG_PUBLISHED_SPAN != 0 {
            self.python_stats.published_spans += 1;
        }
        let span = self.span_id(r.span);
        let off = match r.event {
            EVENT_OFFCPU => r.off_cpu,
            EVENT_ALLOC => ALLOC_KEY | r.off_cpu,
            _ => 0,
        };
        // A sample read without a name has the thread's last one so far (a recording writes a
        // name only when it changes: a replay gives the same threads as the live session).
        let name = match r.thread_name {
            Some(name) => self.name_id(name),
            None => self
                .python_thread_names
                .get(&(r.pid, r.tid))
                .and_then(|name| self.python_name_ids.get(name.as_str()).copied())
                .unwrap_or(0),
        };
        let key = (r.pid, r.tid, name, kid, uid, pyid, span, r.unwind, off);
        if self.opts.max_keys != 0
            && self.counts.len() >= self.opts.max_keys
            && !self.counts.contains_key(&key)
        {
            // NB: its stacks, span and name were interned above; those tables grow with the
            // distinct ones seen, as the counts would (a thread's name is read at most every
            // 50 ms).
            self.samples -= 1;
            self.dropped += 1;
            return false;
        }
        let counts = self.counts.entry(key).or_default();
        if self.opts.timestamps && !self.timed_overflow {
            if self.timed < MAX_TIMED {
                let value = if r.event == EVENT_CPU { 1 } else { r.weight };
                counts.times.push((r.time_ns, value));
                self.timed += 1;
            } else {
                self.timed_overflow = true;
            }
        }
        match r.event {
            EVENT_OFFCPU => {
                counts.off_cpu_ns = counts.off_cpu_ns.saturating_add(r.weight);
            }
            EVENT_ALLOC => {
                let (objects, bytes) = scale_allocation(r.weight, self.opts.alloc_rate);
                counts.alloc_objects += objects;
                counts.alloc_bytes += bytes;
                if self.opts.heap && self.alloc_keys.len() < MAX_HEAP_SITES {
                    self.alloc_keys.insert(r.alloc_id, (key, r.time_ns));
                }
            }
            _ => counts.samples += 1,
        }
        // Threads rename themselves (pthread_setname_np); the latest name wins.
        *self.threads.entry((r.pid, r.tid)).or_default() = r.comm;
        if let std::collections::btree_map::Entry::Vacant(e) = self.processes.entry(r.pid) {
            // The sampled thread's name until the process's own is given.
            e.insert(String::from_utf8_lossy(profiler_common::comm_bytes(&r.comm)).into_owned());
            return true;
        }
        false
    }

    /// The id of a Python thread name (its index in [`Counter::thread_names`] plus one).
    /// Allocates only for a name seen first.
    fn name_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.python_name_ids.get(name) {
            return id;
        }
        self.thread_names.push(name.into());
        let id = self.thread_names.len() as u32;
        self.python_name_ids.insert(name.into(), id);
        id
    }

    /// The id (index + 1) of a span context, 0 for none; allocates only for a context seen
    /// first.
    fn span_id(&mut self, span: SpanContext) -> u32 {
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

    /// What a process said about itself, as [`Counter::count`] or [`Counter::exec`] asked:
    /// its name when read, its resource when read.
    pub fn describe(&mut self, pid: u32, facts: ProcessFacts) {
        if let Some(name) = facts.name {
            self.processes.insert(pid, name);
        }
        if let Some(info) = facts.info {
            self.process_info.insert(pid, info);
        }
    }

    /// A process called execve (at `time_ns`, `CLOCK_MONOTONIC`): the memory it had allocated
    /// before is gone. True when the process is to be described anew (executable, command
    /// line, service name: a wrapper, `sh -c 'exec python …'`, is not the program's resource):
    /// the caller then gives its [`Counter::describe`] with the resource read.
    pub fn exec(&mut self, pid: u32, time_ns: u64) -> bool {
        // Only the heap profile needs exec times (a daemon would keep one per pid forever).
        if self.opts.heap {
            self.execs.insert(pid, time_ns);
        }
        self.opts.timestamps && self.processes.contains_key(&pid)
    }

    /// The sampled allocations not freed at the end (`--event heap`), as (id, size): each adds
    /// to the memory in use of the stack it was allocated in.
    pub fn set_live(&mut self, live: impl IntoIterator<Item = (u64, u64)>) {
        for (alloc_id, size) in live {
            let Some(&(key, time_ns)) = self.alloc_keys.get(&alloc_id) else {
                self.unattributed_inuse += 1;
                continue;
            };
            // Memory of a program the process replaced with execve is gone.
            if self.execs.get(&key.0).is_some_and(|&exec| exec > time_ns) {
                continue;
            }
            let (objects, bytes) = scale_allocation(size, self.opts.alloc_rate);
            let counts = self.counts.entry(key).or_default();
            counts.inuse_objects += objects;
            counts.inuse_bytes += bytes;
            if self.opts.timestamps && !counts.times.is_empty() {
                counts.inuse_times.push((time_ns, size));
            }
        }
    }

    /// Sampled allocations in use at the end whose stack was not remembered (sampled after the
    /// last drain, or more than `MAX_HEAP_SITES`).
    pub fn unattributed_inuse(&self) -> u64 {
        self.unattributed_inuse
    }

    /// Every distinct user address (by process) and kernel address once, in a stable order:
    /// the addresses to symbolize, in the order [`crate::assemble`] takes their symbols.
    pub fn addresses(&self) -> (Vec<(u32, u64)>, Vec<u64>) {
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
        (user_addrs, kernel_addrs)
    }
}
