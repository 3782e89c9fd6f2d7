//! Per-sample aggregation, as the collector drives it: each ring buffer record goes through the
//! [resolve](crate::resolve) and [count](crate::count) stages, and at the
//! end the counts are symbolized and [assembled](crate::assemble) into a profile.
//!
//! [`Aggregator::record`] runs once per ring buffer record and allocates only when it meets a
//! stack, thread or Python code object for the first time. Addresses of new user stacks are
//! queued per process so the collector can normalize them while the process is alive
//! ([`Aggregator::normalize_pending`]). Native symbolization happens once, in
//! [`Aggregator::into_profile`]. With [`Options::record`], what the count and assemble stages
//! were given is recorded too ([`crate::record`]), for `spanprof replay`.

use profiler_common::{AllocKey, LiveAlloc, Sample as SampleRecord};
use symbolizer::Symbolizer;

use crate::assemble::{assemble, unix_offset_ns, Facts, PythonFacts};
use crate::count::Counter;
use crate::profile::{Meta, Profile};
use crate::python::Python;
use crate::record::Recorder;
use crate::resolve::{describe_process, Resolver};

pub use crate::assemble::{NATIVE_CODE, NO_PYTHON_FRAMES, TRUNCATED};
pub use crate::count::{scale_allocation, MAX_TIMED};
pub use crate::merge::{merge, Piece};
pub use crate::Options;

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
        self.finish_recorded(python).0
    }

    /// The profile, and with [`Options::record`] the recording (gzip-compressed), or why it
    /// could not be kept.
    pub fn finish_recorded(self, python: &Python) -> (Profile, Option<Result<Vec<u8>, String>>) {
        let (user_symbols, kernel_symbols) = self.job.finish();
        let Aggregator {
            count, recorder, ..
        } = self.agg;
        let pids: Vec<u32> = count.processes.keys().copied().collect();
        let facts = Facts {
            meta: self.meta,
            user_symbols,
            kernel_symbols,
            python: PythonFacts::of(python, pids),
            unix_offset_ns: unix_offset_ns(),
        };
        let recording = recorder.map(|r| r.finish(&facts));
        let profile = assemble(count, &self.user_addrs, &self.kernel_addrs, facts);
        (profile, recording)
    }
}

/// Counts samples by (thread, kernel stack, user stack, Python stack): the resolve and count
/// stages, and the recording of what passes between them.
#[derive(Debug)]
pub struct Aggregator {
    opts: Options,
    resolve: Resolver,
    pub(crate) count: Counter,
    /// Processes whose exit record came since the last [`Aggregator::normalize_pending`].
    exited: Vec<u32>,
    /// With [`Options::record`].
    recorder: Option<Box<Recorder>>,
}

impl Aggregator {
    /// An empty aggregate; what `opts` drops is dropped at the door.
    pub fn new(opts: Options) -> Self {
        Aggregator {
            opts,
            resolve: Resolver::new(&opts),
            count: Counter::new(opts),
            exited: Vec::new(),
            recorder: opts.record.then(|| Box::new(Recorder::new(&opts))),
        }
    }

    /// A process called execve (at `time_ns`, `CLOCK_MONOTONIC`): the memory it had allocated
    /// before is gone, and so are the modules its stacks were unwound with.
    pub fn exec(&mut self, pid: u32, time_ns: u64) {
        let describe = self.count.exec(pid, time_ns);
        if let Some(rec) = self.recorder.as_deref_mut() {
            rec.exec(pid, time_ns);
        }
        self.resolve.forget(pid);
        if describe {
            let facts = describe_process(pid, true);
            if let Some(rec) = self.recorder.as_deref_mut() {
                rec.describe(pid, &facts);
            }
            self.count.describe(pid, facts);
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
        self.resolve.forget(pid);
    }

    /// Processes whose stacks the copy truncated since the last call, each once.
    pub fn take_truncated_by_copy(&mut self) -> std::vec::Drain<'_, u32> {
        self.resolve.take_truncated_by_copy()
    }

    /// A drain of the ring buffer begins (the unwinders may read each process's maps again).
    pub fn next_drain(&mut self) {
        self.resolve.next_drain();
    }

    /// What the unwinders read.
    pub fn unwind_stats(&self) -> symbolizer::unwind::UnwindStats {
        self.resolve.unwind_stats()
    }

    /// Bytes of the unwind tables held for the processes known.
    pub fn unwind_table_bytes(&self) -> u64 {
        self.resolve.unwind_table_bytes()
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> u64 {
        self.count.samples()
    }

    /// The (pid, tid) of every thread with a sample so far.
    pub fn threads_seen(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.count.threads.keys().copied()
    }

    /// Samples left out by the limits ([`Options::max_keys`], [`Options::max_processes`]).
    pub fn dropped(&self) -> u64 {
        self.count.dropped()
    }

    /// New limits ([`Options::max_keys`], [`Options::max_processes`]), from the next sample on.
    pub fn set_limits(&mut self, max_keys: usize, max_processes: usize) {
        self.opts.max_keys = max_keys;
        self.opts.max_processes = max_processes;
        self.count.set_limits(max_keys, max_processes);
    }

    /// Ends a window (the daemon): returns what was aggregated so far and goes on empty,
    /// keeping what outlives a window: the unwind tables of the processes, exec times. A
    /// recording stays with the window returned.
    pub fn take_window(&mut self) -> Aggregator {
        let mut next = Aggregator::new(Options {
            record: false,
            ..self.opts
        });
        self.resolve.take_lasting(&mut next.resolve);
        next.count.execs = self.count.execs.clone();
        std::mem::replace(self, next)
    }

    /// Whether a sample of `pid` is counted: a new process past `max_processes` is left out
    /// whole (before any work on its stacks, or on finding its interpreter).
    pub fn accepts(&self, pid: u32) -> bool {
        self.count.accepts(pid)
    }

    /// Counts one sample; its Python frames are named through `python` (the collector has
    /// shown it the process first: [`Python::saw`]).
    pub fn record(&mut self, sample: &SampleRecord<'_>, python: &mut Python) {
        let pid = sample.header.pid;
        if !self.count.accepts(pid) {
            self.count.refused();
            return;
        }
        let resolved = self.resolve.resolve(sample, python);
        let new_process = self.count.count(&resolved);
        if let Some(rec) = self.recorder.as_deref_mut() {
            rec.sample(&resolved);
        }
        if new_process {
            // Once per process, while it (hopefully) still runs: its name, and with
            // timestamps its OTLP resource.
            let facts = describe_process(pid, self.opts.timestamps);
            if let Some(rec) = self.recorder.as_deref_mut() {
                rec.describe(pid, &facts);
            }
            self.count.describe(pid, facts);
        }
    }

    /// The sampled allocations not freed at the end (`--event heap`): each adds to the memory in
    /// use of the stack it was allocated in.
    pub fn set_live(&mut self, live: Vec<(AllocKey, LiveAlloc)>) {
        let live: Vec<(u64, u64)> = live.iter().map(|(_, a)| (a.alloc_id, a.size)).collect();
        if let Some(rec) = self.recorder.as_deref_mut() {
            rec.live(&live);
        }
        self.count.set_live(live);
    }

    /// The kernel's error counters at the end of a session, for the recording (the summary a
    /// replay prints).
    pub fn set_errors(&mut self, errors: &[u64]) {
        if let Some(rec) = self.recorder.as_deref_mut() {
            rec.errors(errors);
        }
    }

    /// Sampled allocations in use at the end whose stack was not remembered (sampled after the
    /// last drain, or more than a million).
    pub fn unattributed_inuse(&self) -> u64 {
        self.count.unattributed_inuse()
    }

    /// Normalizes the user addresses of stacks seen since the last call, while their processes
    /// are (hopefully) still alive, or from the memory maps read while they lived; then tells
    /// the symbolizer of the processes that exited since (none of their addresses is left to
    /// normalize).
    pub fn normalize_pending(&mut self, symbolizer: &mut Symbolizer) {
        for (pid, mut addrs) in self.count.pending.drain() {
            symbolizer.normalize(pid, &mut addrs);
        }
        for pid in self.exited.drain(..) {
            symbolizer.exited(pid);
        }
    }

    /// Symbolizes every stack and builds the profile.
    pub fn into_profile(self, symbolizer: &mut Symbolizer, python: &Python, meta: Meta) -> Profile {
        self.into_profile_recorded(symbolizer, python, meta).0
    }

    /// [`Aggregator::into_profile`], and with [`Options::record`] the recording.
    pub fn into_profile_recorded(
        self,
        symbolizer: &mut Symbolizer,
        python: &Python,
        meta: Meta,
    ) -> (Profile, Option<Result<Vec<u8>, String>>) {
        let mut pending = self.into_pending(symbolizer, meta);
        while !pending.step(symbolizer, std::time::Duration::MAX) {}
        pending.finish_recorded(python)
    }

    /// Begins [`Aggregator::into_profile`] a part at a time: [`PendingProfile::step`]
    /// symbolizes a few modules per call, so that a caller (the daemon) drains samples in
    /// between, and [`PendingProfile::finish`] builds the profile.
    pub fn into_pending(mut self, symbolizer: &mut Symbolizer, meta: Meta) -> PendingProfile {
        self.normalize_pending(symbolizer);
        let (user_addrs, kernel_addrs) = self.count.addresses();
        let job = symbolizer.start(&user_addrs, kernel_addrs.clone());
        PendingProfile {
            agg: self,
            meta,
            user_addrs,
            kernel_addrs,
            job,
        }
    }
}

#[cfg(test)]
mod tests;
