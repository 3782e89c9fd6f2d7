//! The resolve stage: one ring buffer record in, one [`Resolved`] sample out.
//!
//! It unwinds the user stack from the stack copy ([`Unwinders`]), names the Python frames
//! ([`Python::tokens`]) and reads the thread's `threading.Thread` name, turns return addresses
//! into lookup addresses and reads the span context the kernel sent. What it returns borrows its
//! own buffers: nothing is allocated per sample for stacks, code objects and threads seen
//! before. [`describe_process`] reads what the count stage asks of a process new to it.
//!
//! This is the only stage that reads the live system (the target's memory through `python`, its
//! modules through the unwinders, `/proc`).

use profiler_common::{
    Sample as SampleRecord, SpanRecord, EVENT_ALLOC, EVENT_OFFCPU, MAX_PY_FRAMES, MAX_STACK_COPY,
    MAX_STACK_DEPTH, OFFCPU_IOWAIT, OFFCPU_NO_USER, PY_NO_THREAD, PY_OK, PY_OUTER_FRAMES,
    PY_READ_FAILED, SPAN_OSP, SPAN_OSP_PARENT, SPAN_OTEL, SPAN_PUBLISHED, TASK_COMM_LEN,
    USTACK_COPY_FAULT, USTACK_COPY_NONE, USTACK_COPY_NO_REGS, USTACK_COPY_OK, USTACK_COPY_SHORT,
};
use symbolizer::unwind::{FailedBy, StackCopy, TruncatedBy, UnwindStatus, Unwinders};

use crate::profile::{OsProfilerIds, SpanContext, SpanName};
use crate::python::{
    split_token, Python, Unread, TOKEN_ENTRY, TRUNCATED_FUNCTION, UNKNOWN_FUNCTION,
};
use crate::resource::ProcessInfo;
use crate::Options;

/// [`Resolved::python_flags`]: the sample has Python frames.
pub const PY_WITH_FRAMES: u8 = 1;
/// [`Resolved::python_flags`]: the kernel found no Python thread state for the thread.
pub const PY_FLAG_NO_THREAD: u8 = 2;
/// [`Resolved::python_flags`]: the kernel's walk of the Python frames failed.
pub const PY_FLAG_READ_FAILED: u8 = 4;
/// [`Resolved::python_flags`]: the Python stack was cut (it holds a `[truncated]` token: at its
/// end when the walk stopped early, where frames were left out of a stack deeper than a sample
/// holds).
pub const PY_FLAG_TRUNCATED: u8 = 8;
/// [`Resolved::python_flags`]: the span context came from a thread context the process
/// publishes (OTEP 4947).
pub const PY_FLAG_PUBLISHED_SPAN: u8 = 16;
/// Every flag of [`Resolved::python_flags`].
pub const PY_FLAGS: u8 = 31;
/// Where a Python stack deeper than a sample holds was cut: after its innermost frames.
const GAP_AT: usize = MAX_PY_FRAMES - PY_OUTER_FRAMES;

/// [`Resolved::off_cpu`] of an allocation that is one of CPython's small-object arenas (even:
/// off-CPU keys are odd).
pub const ALLOC_ARENA: u32 = 4;

/// One sample, resolved: what the count stage needs and nothing it would have to read.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's name (`comm`, NUL-padded).
    pub comm: [u8; TASK_COMM_LEN],
    /// `profiler_common::EVENT_*`.
    pub event: u32,
    /// When (`CLOCK_MONOTONIC`, ns).
    pub time_ns: u64,
    /// Off-CPU nanoseconds, or allocated bytes.
    pub weight: u64,
    /// The allocation's id (`--event heap`).
    pub alloc_id: u64,
    /// The off-CPU facts its reason depends on ([`off_cpu_key`]); for an allocation,
    /// [`ALLOC_ARENA`] when it is one of pymalloc's arenas; 0 otherwise.
    pub off_cpu: u32,
    /// Kernel stack, leaf first, as lookup addresses; empty when not kept.
    pub kernel: &'a [u64],
    /// User stack, leaf first, as lookup addresses.
    pub user: &'a [u64],
    /// How the user stack was unwound.
    pub unwind: UnwindStatus,
    /// Python stack as tokens ([`Python::tokens`]), innermost first, ending in the
    /// `[truncated]` token when the walk stopped early; a stack deeper than a sample holds has
    /// one (without [`TOKEN_ENTRY`]) where frames were left out.
    pub python: &'a [u64],
    /// `PY_*` flags of the Python walk.
    pub python_flags: u8,
    /// The span context (empty: none).
    pub span: SpanContext,
    /// The `threading.Thread` name of a Python thread, read while it runs.
    pub thread_name: Option<&'a str>,
}

/// The resolve stage's state: unwinders, buffers, and the processes to give a bigger copy.
#[derive(Debug)]
pub struct Resolver {
    /// Kernel stacks are kept (kernel frames shown).
    keep_kernel: bool,
    lines: bool,
    /// User stacks unwound from the stack copy (`--unwind dwarf`).
    unwinders: Unwinders,
    unwound: [u64; MAX_STACK_DEPTH],
    kernel: [u64; MAX_STACK_DEPTH],
    user: [u64; MAX_STACK_DEPTH],
    python: Box<[u64; MAX_PY_FRAMES + 2]>,
    last_sweep: std::time::Instant,
    /// Processes whose stacks the copy truncated, for the session to give a bigger copy (each
    /// pid once until it execs).
    truncated_by_copy: Vec<u32>,
    raised: rustc_hash::FxHashSet<u32>,
}

/// How often the unwinders of processes that exited are dropped.
const UNWINDERS_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Resolver {
    /// A resolver keeping what `opts` says.
    pub fn new(opts: &Options) -> Resolver {
        Resolver {
            keep_kernel: opts.kernel && !opts.python_only,
            lines: opts.lines,
            unwinders: Unwinders::new(),
            unwound: [0; MAX_STACK_DEPTH],
            kernel: [0; MAX_STACK_DEPTH],
            user: [0; MAX_STACK_DEPTH],
            python: Box::new([0; MAX_PY_FRAMES + 2]),
            last_sweep: std::time::Instant::now(),
            truncated_by_copy: Vec::new(),
            raised: Default::default(),
        }
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

    /// Keeps what outlives a window of the daemon (unwind tables, processes raised) and
    /// leaves a fresh resolver in their place.
    pub fn take_lasting(&mut self, into: &mut Resolver) {
        std::mem::swap(&mut into.unwinders, &mut self.unwinders);
        into.raised = std::mem::take(&mut self.raised);
    }

    /// Resolves one sample; its Python frames are named through `python` (the collector has
    /// shown it the process first: [`Python::saw`]).
    pub fn resolve<'a>(
        &'a mut self,
        sample: &SampleRecord<'_>,
        python: &'a mut Python,
    ) -> Resolved<'a> {
        let rec = sample.header;
        let arena =
            rec.event == EVENT_ALLOC && python.is_arena(rec.pid, rec.syscall_arg0, rec.weight);
        let frames = sample.python_stack();
        let mut n = python.tokens(
            rec.pid,
            frames,
            self.lines,
            &mut self.python[..MAX_PY_FRAMES],
        );
        let status = sample.python_status();
        // A walk that faulted after reading only frames that name no code object started from
        // a half-built frame (3.11 publishes tstate->cframe a few instructions before filling
        // it): it read nothing.
        if status == PY_READ_FAILED
            && self.python[..n]
                .iter()
                .all(|&t| split_token(t).0 == UNKNOWN_FUNCTION)
        {
            n = 0;
        }
        let mut python_flags = 0;
        if n > 0 {
            python_flags |= PY_WITH_FRAMES;
        }
        match status {
            PY_NO_THREAD => python_flags |= PY_FLAG_NO_THREAD,
            PY_READ_FAILED => python_flags |= PY_FLAG_READ_FAILED,
            _ => {}
        }
        // Why a stack has no Python frames, for the assembly to say where they would be (if
        // its native stack turns out to be in the interpreter loop). A walk that read no frame
        // is not a cut stack, whatever the kernel flagged (recordings made before a 3.11 call
        // being entered was told apart): a lone `[truncated]` would stand for the whole stack.
        let unread = match status {
            _ if n > 0 => None,
            PY_NO_THREAD => Some(Unread::NoThread),
            PY_READ_FAILED => Some(Unread::WalkFailed),
            PY_OK if sample.python_truncated() => Some(Unread::WalkFailed),
            PY_OK => Some(Unread::NoFrame),
            _ => None,
        };
        if let Some(unread) = unread {
            self.python[n] = unread.token();
            n += 1;
        }
        // A stack deeper than a sample holds: the marker goes where frames were left out,
        // inside the run it cut (the merge matches the runs after it from the root).
        if let (Some(_), None) = (sample.python_skipped(), unread) {
            if n > GAP_AT {
                python_flags |= PY_FLAG_TRUNCATED;
                self.python.copy_within(GAP_AT..n, GAP_AT + 1);
                self.python[GAP_AT] = u64::from(TRUNCATED_FUNCTION);
                n += 1;
            }
        }
        if sample.python_truncated() && unread.is_none() {
            python_flags |= PY_FLAG_TRUNCATED;
            // The marker closes the outermost run (it is where the walk stopped).
            self.python[n] = u64::from(TRUNCATED_FUNCTION) | TOKEN_ENTRY;
            n += 1;
        }
        // Off-CPU records keep theirs for their reason even when kernel frames are not shown.
        let kn = if self.keep_kernel || rec.event == EVENT_OFFCPU {
            to_lookup_addrs(sample.kernel_stack(), false, &mut self.kernel)
        } else {
            0
        };
        // A sample taken in the kernel has a user "leaf" that is the return address of the
        // system call, so it is adjusted like every other return address.
        let in_kernel = !sample.kernel_stack().is_empty();
        let (ustack, unwind) = user_stack(&mut self.unwinders, &mut self.unwound, sample);
        let un = to_lookup_addrs(ustack, in_kernel, &mut self.user);
        // Only a copy smaller than the largest can be made bigger.
        if unwind == UnwindStatus::Truncated(TruncatedBy::StackCopy)
            && sample.user_stack_copy().len() < MAX_STACK_COPY
            && self.raised.insert(rec.pid)
        {
            self.truncated_by_copy.push(rec.pid);
        }
        let span = match sample.span() {
            Some(record) => {
                // The thread's name as the kernel read it with the sample (at its first, then
                // every 50 ms): the name of a thread that may be gone by the drain.
                if let Some(name) = record
                    .thread_name()
                    .and_then(|b| std::str::from_utf8(b).ok())
                {
                    python.set_thread_name(rec.pid, rec.tid, name);
                }
                if record.flags & SPAN_PUBLISHED != 0 {
                    python_flags |= PY_FLAG_PUBLISHED_SPAN;
                }
                span_context(record)
            }
            None => SpanContext::default(),
        };
        // A Python thread's `threading.Thread` name: as the kernel read it (with this sample
        // or an earlier one), else as read from the process while it runs.
        let named = sample.span().is_some_and(|r| r.thread_name().is_some());
        let thread_name = if frames.is_empty() && !named {
            None
        } else {
            python.thread_name(rec.pid, rec.tid)
        };
        Resolved {
            pid: rec.pid,
            tid: rec.tid,
            comm: rec.comm,
            event: rec.event,
            time_ns: rec.time_ns,
            weight: rec.weight,
            alloc_id: rec.alloc_id,
            off_cpu: match rec.event {
                EVENT_OFFCPU => off_cpu_key(rec),
                EVENT_ALLOC if arena => ALLOC_ARENA,
                _ => 0,
            },
            kernel: &self.kernel[..kn],
            user: &self.user[..un],
            unwind,
            python: &self.python[..n],
            python_flags,
            span,
            thread_name,
        }
    }
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

/// The facts of an off-CPU record that its reason depends on, packed: bit 0 set (off-CPU),
/// bit 1 in I/O wait, bit 2 the first argument was 0, bits 16.. the system call number + 1
/// (0: none).
pub fn off_cpu_key(h: &profiler_common::SampleHeader) -> u32 {
    let syscall = u32::try_from(h.syscall_nr)
        .ok()
        .filter(|&nr| nr < 0x7fff && h.offcpu_flags & OFFCPU_NO_USER == 0)
        .map_or(0, |nr| nr + 1);
    1 | u32::from(h.offcpu_flags & OFFCPU_IOWAIT != 0) << 1
        | u32::from(h.syscall_arg0 == 0) << 2
        | syscall << 16
}

/// The ids a span record carries, as the profile keeps them.
pub fn span_context(r: &SpanRecord) -> SpanContext {
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

/// Copies a leaf-first stack of return addresses, turning every return address (all but the
/// leaf, and the leaf too when `leaf_is_return` says it is one) into an address inside the call
/// instruction, so the caller's line and function are found even when the call is the last
/// instruction of a function.
pub fn to_lookup_addrs(
    stack: &[u64],
    leaf_is_return: bool,
    out: &mut [u64; MAX_STACK_DEPTH],
) -> usize {
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

/// What a process says about itself, read for the count stage: its name (`/proc/PID/comm`),
/// and its resource (when `resource`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    /// `/proc/PID/comm`, when it could be read.
    pub name: Option<String>,
    /// What `/proc/PID` says ([`ProcessInfo::read`]) when the resource was asked for, else its
    /// executable's path alone (pprof's first mapping), when it could be read.
    pub info: Option<ProcessInfo>,
}

/// Reads a process's [`ProcessFacts`] while it (hopefully) still runs.
pub fn describe_process(pid: u32, resource: bool) -> ProcessFacts {
    // The resource first, then the name: as the aggregate read them at an exec.
    let info = if resource {
        Some(ProcessInfo::read(pid))
    } else {
        crate::resource::read_exe(pid).map(|exe| ProcessInfo {
            exe_path: Some(exe),
            ..ProcessInfo::default()
        })
    };
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string());
    ProcessFacts { name, info }
}
