//! Per-sample aggregation: interning stacks and counting (thread, kernel stack, user stack).
//!
//! [`Aggregator::record`] runs once per ring buffer record and allocates only when it meets a
//! stack or thread for the first time. Addresses of new user stacks are queued per process so
//! the session can normalize them while the process is alive ([`Aggregator::normalize_pending`]);
//! symbolization of everything happens once, in [`Aggregator::into_profile`].

use std::collections::BTreeMap;

use profiler_common::{Sample as SampleRecord, MAX_STACK_DEPTH, TASK_COMM_LEN};
use rustc_hash::FxHashMap;
use symbolizer::{Symbol, Symbolizer};

use crate::profile::{Frame, FrameKind, Meta, Process, Profile, Sample, Thread};

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

/// Counts samples by (thread, kernel stack, user stack).
#[derive(Debug)]
pub struct Aggregator {
    keep_kernel: bool,
    kernel: StackTable,
    user: FxHashMap<u32, StackTable>,
    /// By (pid, tid, kernel stack, user stack): a tid can come back under another pid.
    counts: FxHashMap<(u32, u32, u32, u32), u64>,
    /// Latest `comm` of each (pid, tid).
    threads: FxHashMap<(u32, u32), [u8; TASK_COMM_LEN]>,
    processes: BTreeMap<u32, String>,
    pending: FxHashMap<u32, Vec<u64>>,
    samples: u64,
    scratch: [u64; MAX_STACK_DEPTH],
}

impl Aggregator {
    /// An empty aggregate; `keep_kernel = false` drops kernel stacks at the door (`--no-kernel`).
    pub fn new(keep_kernel: bool) -> Self {
        Aggregator {
            keep_kernel,
            kernel: StackTable::default(),
            user: FxHashMap::default(),
            counts: FxHashMap::default(),
            threads: FxHashMap::default(),
            processes: BTreeMap::new(),
            pending: FxHashMap::default(),
            samples: 0,
            scratch: [0; MAX_STACK_DEPTH],
        }
    }

    /// Samples recorded so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Counts one sample.
    pub fn record(&mut self, sample: &SampleRecord<'_>) {
        let rec = sample.header;
        self.samples += 1;
        let kid = if self.keep_kernel {
            let n = to_lookup_addrs(sample.kernel_stack(), false, &mut self.scratch);
            self.kernel.intern(&self.scratch[..n]).0
        } else {
            EMPTY
        };
        // A sample taken in the kernel has a user "leaf" that is the return address of the
        // system call, so it is adjusted like every other return address.
        let in_kernel = !sample.kernel_stack().is_empty();
        let n = to_lookup_addrs(sample.user_stack(), in_kernel, &mut self.scratch);
        let table = self.user.entry(rec.pid).or_default();
        let (uid, new) = table.intern(&self.scratch[..n]);
        if new {
            self.pending
                .entry(rec.pid)
                .or_default()
                .extend_from_slice(&self.scratch[..n]);
        }
        *self.counts.entry((rec.pid, rec.tid, kid, uid)).or_insert(0) += 1;
        // Threads rename themselves (pthread_setname_np); the latest name wins.
        *self.threads.entry((rec.pid, rec.tid)).or_default() = rec.comm;
        self.processes
            .entry(rec.pid)
            .or_insert_with(|| process_name(rec.pid, sample.comm()));
    }

    /// Normalizes the user addresses of stacks seen since the last call, while their processes
    /// are (hopefully) still alive.
    pub fn normalize_pending(&mut self, symbolizer: &mut Symbolizer) {
        for (pid, mut addrs) in self.pending.drain() {
            symbolizer.normalize(pid, &mut addrs);
        }
    }

    /// Symbolizes every stack and builds the profile.
    pub fn into_profile(mut self, symbolizer: &mut Symbolizer, meta: Meta) -> Profile {
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
        let (user_syms, kernel_syms) = symbolizer.symbolize(&user_addrs, &kernel_addrs);

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
                name: comm_string(&self.threads[&(pid, tid)]),
            })
            .collect();

        let kernel_stacks = self.kernel.by_id();
        let user_stacks: FxHashMap<u32, Vec<&[u64]>> =
            self.user.iter().map(|(&pid, t)| (pid, t.by_id())).collect();
        let mut samples: Vec<Sample> = Vec::with_capacity(self.counts.len());
        for (&(pid, tid, kid, uid), &count) in &self.counts {
            let ustack = user_stacks[&pid][uid as usize];
            let kstack = kernel_stacks[kid as usize];
            // Root first: outermost user frame … user leaf, then syscall entry … kernel leaf.
            let mut stack: Vec<u32> = ustack
                .iter()
                .rev()
                .map(|a| user_frame[&(pid, *a)])
                .collect();
            stack.extend(kstack.iter().rev().map(|a| kernel_frame[a]));
            if stack.is_empty() {
                stack.push(frames.placeholder(crate::output::folded::NO_STACK));
            }
            samples.push(Sample {
                frames: stack,
                thread: thread_index[&(pid, tid)],
                count,
            });
        }
        samples.sort_by(|a, b| (a.thread, &a.frames).cmp(&(b.thread, &b.frames)));

        Profile {
            meta,
            frames: frames.frames,
            threads,
            processes: self
                .processes
                .into_iter()
                .map(|(pid, name)| Process { pid, name })
                .collect(),
            samples,
        }
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
mod tests {
    use super::*;
    use profiler_common::{SampleHeader, RECORD_SAMPLE, SAMPLE_HEADER_SIZE};

    /// An 8-aligned ring buffer record as the BPF program writes it.
    fn record(pid: u32, tid: u32, kstack: &[u64], ustack: &[u64]) -> Vec<u64> {
        let mut words = vec![0u64; SAMPLE_HEADER_SIZE / 8];
        words.extend_from_slice(kstack);
        words.extend_from_slice(ustack);
        // SAFETY: the buffer holds the header; SampleHeader is plain old data.
        let h = unsafe { &mut *(words.as_mut_ptr() as *mut SampleHeader) };
        h.kind = RECORD_SAMPLE;
        h.pid = pid;
        h.tid = tid;
        h.kstack_len = kstack.len() as i32;
        h.ustack_len = ustack.len() as i32;
        h.comm[..4].copy_from_slice(b"test");
        words
    }

    fn sample(words: &[u64]) -> SampleRecord<'_> {
        // SAFETY: u64s viewed as bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) };
        SampleRecord::from_bytes(bytes).unwrap()
    }

    #[test]
    fn counts_per_thread_and_stack_and_queues_new_addresses_once() {
        let mut agg = Aggregator::new(true);
        let r1 = record(10, 11, &[0xffff_0010], &[0x1000, 0x2000]);
        agg.record(&sample(&r1));
        agg.record(&sample(&r1));
        agg.record(&sample(&record(10, 12, &[], &[0x1000, 0x2000])));
        assert_eq!(agg.samples(), 3);
        assert_eq!(agg.counts.len(), 2, "two threads");
        // In the kernel, the user leaf is the return address of the system call.
        assert_eq!(agg.counts[&(10, 11, 1, 1)], 2);
        assert_eq!(agg.user[&10].by_id()[1], [0xfff, 0x1fff]);
        // In user mode the leaf is the interrupted instruction itself.
        assert_eq!(agg.counts[&(10, 12, EMPTY, 2)], 1);
        assert_eq!(agg.user[&10].by_id()[2], [0x1000, 0x1fff]);
        assert_eq!(agg.pending[&10], vec![0xfff, 0x1fff, 0x1000, 0x1fff]);
    }

    #[test]
    fn a_reused_tid_under_another_pid_is_another_thread() {
        let mut agg = Aggregator::new(true);
        agg.record(&sample(&record(10, 11, &[], &[0x1000])));
        agg.record(&sample(&record(20, 11, &[], &[0x1000, 0x2000, 0x3000])));
        assert_eq!(agg.threads.len(), 2);
        assert_eq!(agg.counts[&(10, 11, EMPTY, 1)], 1);
        assert_eq!(agg.counts[&(20, 11, EMPTY, 1)], 1);
    }

    #[test]
    fn no_kernel_drops_kernel_stacks() {
        let mut agg = Aggregator::new(false);
        agg.record(&sample(&record(10, 11, &[0xffff_0010], &[0x1000])));
        assert_eq!(agg.counts[&(10, 11, EMPTY, 1)], 1);
        assert_eq!(agg.kernel.ids.len(), 1, "only the empty stack");
    }
}
