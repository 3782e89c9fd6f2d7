//! The kernel/user ABI of spanprof.
//!
//! # Overview
//! The C header `profiler-ebpf/include/spanprof_abi.h` is the source of truth. This crate mirrors
//! it in `#[repr(C)]` types that user space reads out of ring buffer records and writes into maps.
//! A test generates C `_Static_assert`s from the Rust layout (size, alignment and every field
//! offset) and the constants, and compiles them against the header twice: with the host's C
//! compiler, and as the eBPF programs are compiled (clang, `-target bpf`, the build's flags). So a
//! change on one side fails `cargo test` until the other side follows.
//!
//! # Design constraints
//! Fixed-width integers only, explicit padding, no `bool`, every struct `Copy` and a multiple of
//! 8 bytes, so a record can be read from any byte slice with [`Sample::from_bytes`].
#![no_std]

/// Maximum frames of one kernel or user stack (perf's default `kernel.perf_event_max_stack`).
pub const MAX_STACK_DEPTH: usize = 127;
/// Length of a task's `comm`, NUL-padded.
pub const TASK_COMM_LEN: usize = 16;
/// Python frames one sample can carry; a deeper stack keeps its innermost and its
/// [`PY_OUTER_FRAMES`] outermost frames, with [`PY_SKIPPED`] set.
pub const MAX_PY_FRAMES: usize = 512;
/// The outermost frames a stack deeper than [`MAX_PY_FRAMES`] keeps.
pub const PY_OUTER_FRAMES: usize = 32;
/// The frames the kernel's walk follows at most; a deeper stack has [`PY_TRUNCATED`] set.
pub const PY_WALK_FRAMES: usize = 2048;
/// Record kind of a [`Sample`].
pub const RECORD_SAMPLE: u32 = 1;
/// Record kind of an [`ExecRecord`].
pub const RECORD_EXEC: u32 = 2;
/// Record kind of an [`ExecRecord`] telling of a process that exited (every sample of it is
/// before the record in the ring buffer).
pub const RECORD_EXIT: u32 = 3;
/// Record kind of an [`ExecRecord`] telling of a target the kernel dropped at its exec: its new
/// program runs with other credentials than a guarded spanprof's (`guard_exec`).
pub const RECORD_REFUSED: u32 = 4;

/// [`SampleHeader::py_status`]: not a Python process (or not detected yet).
pub const PY_NONE: u32 = 0;
/// [`SampleHeader::py_status`]: the Python frames were read.
pub const PY_OK: u32 = 1;
/// [`SampleHeader::py_status`]: the thread has no `PyThreadState`.
pub const PY_NO_THREAD: u32 = 2;
/// [`SampleHeader::py_status`]: a read of interpreter memory faulted.
pub const PY_READ_FAILED: u32 = 3;
/// Mask of the status value in [`SampleHeader::py_status`].
pub const PY_STATUS_MASK: u32 = 0xff;
/// Flag in [`SampleHeader::py_status`]: the walk stopped before the outermost frame.
pub const PY_TRUNCATED: u32 = 0x100;
/// Flag in [`SampleHeader::py_status`]: frames were left out after the first
/// `MAX_PY_FRAMES - PY_OUTER_FRAMES`; how many in the bits from [`PY_SKIPPED_SHIFT`].
pub const PY_SKIPPED: u32 = 0x200;
/// Shift of the count of frames left out in [`SampleHeader::py_status`] (at most 0xffff).
pub const PY_SKIPPED_SHIFT: u32 = 16;
/// [`PyFrame::flags`]: the outermost frame of one call of the interpreter loop.
pub const PY_FRAME_ENTRY: u32 = 1;

/// [`PyProc::tstate_match`]: `native_thread_id` holds the kernel tid (3.11+).
pub const PY_MATCH_NATIVE_TID: u32 = 1;
/// [`PyProc::tstate_match`]: `thread_id` holds `pthread_self()`, the task's FS base (3.8–3.10).
pub const PY_MATCH_PTHREAD: u32 = 2;
/// [`PyProc::instr_kind`]: `int f_lasti` in bytes (3.8–3.9).
pub const PY_INSTR_LASTI_BYTES: u32 = 1;
/// [`PyProc::instr_kind`]: `int f_lasti` in code units (3.10).
pub const PY_INSTR_LASTI_UNITS: u32 = 2;
/// [`PyProc::instr_kind`]: a pointer into `co_code_adaptive` (3.11+).
pub const PY_INSTR_POINTER: u32 = 3;
/// [`PyProc::entry_kind`]: every frame is its own interpreter call (3.8–3.10).
pub const PY_ENTRY_EVERY_FRAME: u32 = 1;
/// [`PyProc::entry_kind`]: a bool field `is_entry` (3.11).
pub const PY_ENTRY_FIELD: u32 = 2;
/// [`PyProc::entry_kind`]: shim frames, `owner >= 3` (C stack, interpreter; 3.12+).
pub const PY_ENTRY_SHIM: u32 = 3;
/// "No such field" in [`PyProc`].
pub const PY_NO_OFFSET: u32 = u32::MAX;
/// Largest [`PyProc::frame_size`].
pub const PY_FRAME_BLOCK: u32 = 128;
/// Bytes read from a name str's hash on, before 3.12 (`SPANPROF_PY_NAME_READ`).
pub const PY_NAME_READ: u32 = 40;
/// Bytes read from `code + code_firstlineno`; `code_filename` must be inside them.
pub const PY_CODE_BLOCK: u32 = 96;
/// Largest [`PyProc::frame_window`].
pub const PY_WINDOW: u32 = 1024;
/// Size of one [`PyFrame`] in a record.
pub const PY_FRAME_SIZE: usize = 24;

/// Process named by the user (`--pid` or the `--` command).
pub const TARGET_EXPLICIT: u32 = 1;
/// Process forked by a profiled process.
pub const TARGET_CHILD: u32 = 2;
/// Sampled since its fork or exec: set by the BPF side, whose first sample of a process wakes
/// user space at once (to read the process's modules while it lives).
pub const TARGET_SEEN: u32 = 4;
/// Sampled in its program's own code (not the dynamic loader's, nor a library's) since its fork
/// or exec: set by the BPF side, whose first such sample wakes user space again (the loader
/// has mapped the libraries by then).
pub const TARGET_SEEN_MAIN: u32 = 8;

/// Indexes of the per-CPU error counters in the `errors` map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    /// The ring buffer was full; the sample was lost.
    RingbufFull = 0,
    /// `bpf_get_stack` failed for the kernel stack.
    KernelStack = 1,
    /// `bpf_get_stack` failed for the user stack.
    UserStack = 2,
    /// A child process could not be added to `target_pids`.
    PidMapFull = 3,
    /// A Python thread's frames could not be read.
    PythonRead = 4,
    /// A thread's span context could not be read (a failed read, or garbage).
    SpanRead = 5,
    /// A sampled off-CPU interval was dropped (blocked outside a system call, then again
    /// elsewhere before the next system call).
    OffCpuDropped = 6,
    /// A thread's off-CPU state could not be allocated: an interval was not seen.
    OffCpuStorage = 7,
    /// A sampled allocation was not tracked for the heap profile: the live table was full.
    HeapFull = 8,
    /// Not an error: nanoseconds the targets' threads waited runnable for a CPU (`--event
    /// wall`), kept with the counters because they too are summed per CPU.
    RunnableNs = 9,
    /// An allocation was not counted: the CPU's allocation sampler was busy (a preempted
    /// uprobe program).
    AllocBusy = 10,
    /// A blocked thread's off-CPU interval was never seen ending: it blocked again with the
    /// previous interval still open.
    OffCpuMissed = 11,
    /// An off-CPU interval whose switch back in was not seen, ended at its system call's exit
    /// (sent without the kernel stack it blocked in).
    OffCpuLate = 12,
}

/// Number of slots in the `errors` map.
pub const ERROR_COUNT: u32 = 16;

impl ErrorCode {
    /// Every code, for reporting.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::RingbufFull,
        ErrorCode::KernelStack,
        ErrorCode::UserStack,
        ErrorCode::PidMapFull,
        ErrorCode::PythonRead,
        ErrorCode::SpanRead,
        ErrorCode::OffCpuDropped,
        ErrorCode::OffCpuStorage,
        ErrorCode::HeapFull,
        ErrorCode::AllocBusy,
        ErrorCode::OffCpuMissed,
        ErrorCode::OffCpuLate,
    ];

    /// What the counter means, for summaries.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorCode::RingbufFull => "samples lost: ring buffer full",
            ErrorCode::KernelStack => "kernel stacks not captured",
            ErrorCode::UserStack => "user stacks not captured",
            ErrorCode::PidMapFull => "child processes not followed: pid map full",
            ErrorCode::PythonRead => "python stacks cut by a failed read of interpreter memory",
            ErrorCode::SpanRead => "span contexts not read: a failed read or unexpected objects",
            ErrorCode::OffCpuDropped => {
                "off-CPU intervals dropped: blocked outside a system call, then again elsewhere"
            }
            ErrorCode::OffCpuStorage => "off-CPU intervals not seen: no per-thread state",
            ErrorCode::HeapFull => "sampled allocations left out of the heap profile: table full",
            ErrorCode::RunnableNs => "nanoseconds waiting runnable for a CPU (not an error)",
            ErrorCode::AllocBusy => "allocations not counted: the CPU's sampler was busy",
            ErrorCode::OffCpuMissed => {
                "off-CPU intervals lost: a thread blocked again before the end of the last was seen"
            }
            ErrorCode::OffCpuLate => {
                "off-CPU intervals ended at their system call's exit (switch back in not seen; \
                 no kernel stack)"
            }
        }
    }
}

/// Value of the `target_pids` map (`struct spanprof_target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Target {
    /// [`TARGET_EXPLICIT`] or [`TARGET_CHILD`], and [`TARGET_SEEN`], [`TARGET_SEEN_MAIN`] once sampled.
    pub flags: u32,
    /// Parent process of a child target, 0 for explicit ones.
    pub parent_tgid: u32,
}

/// Size of [`SampleHeader`], where the frames of a sample record begin.
pub const SAMPLE_HEADER_SIZE: usize = 136;

/// Scratches per CPU of the BPF programs: the `scratch` map has this many entries per possible
/// CPU, which user space sets before load (`SPANPROF_SCRATCH_SLOTS`).
pub const SCRATCH_SLOTS: u32 = 3;
/// Entries of the `alloc_gaps` map, which user space fills (`SPANPROF_ALLOC_GAPS`).
pub const ALLOC_GAPS: usize = 256;

/// Most bytes of user stack one sample carries (`--unwind dwarf`).
pub const MAX_STACK_COPY: usize = 32768;
/// [`SampleHeader::ustack_copy_status`]: no copy was asked (`--unwind fp`).
pub const USTACK_COPY_NONE: u32 = 0;
/// [`SampleHeader::ustack_copy_status`]: `ustack_copy_len` bytes from `user_sp`.
pub const USTACK_COPY_OK: u32 = 1;
/// [`SampleHeader::ustack_copy_status`]: the page at `user_sp` could not be read.
pub const USTACK_COPY_FAULT: u32 = 2;
/// [`SampleHeader::ustack_copy_status`]: the thread had no user registers.
pub const USTACK_COPY_NO_REGS: u32 = 3;
/// Flag in [`SampleHeader::ustack_copy_status`]: the copy reached the top of the stack: it
/// stopped at an unreadable page before the size asked, or, for a main thread, at its initial
/// stack pointer (plus 256 bytes): nothing above it is a frame.
pub const USTACK_COPY_SHORT: u32 = 0x100;

/// The fixed part of one on-CPU sample record (`struct spanprof_sample` up to `stack`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct SampleHeader {
    /// [`RECORD_SAMPLE`].
    pub kind: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the sample.
    pub time_ns: u64,
    /// Kernel frames captured, or a negative errno.
    pub kstack_len: i32,
    /// User frames captured, or a negative errno.
    pub ustack_len: i32,
    /// Thread name, NUL-padded.
    pub comm: [u8; TASK_COMM_LEN],
    /// Python frames after the native ones.
    pub py_len: u32,
    /// `PY_NONE`, `PY_OK`, ... in the low byte, plus [`PY_TRUNCATED`].
    pub py_status: u32,
    /// Bytes of span context after the Python frames: 0 or the size of a [`SpanRecord`].
    pub span_len: u32,
    /// Bytes of user stack after the span context, from `user_sp` upwards.
    pub ustack_copy_len: u32,
    /// The thread's user-mode instruction pointer.
    pub user_ip: u64,
    /// Its user-mode stack pointer: the address of the first byte of the stack copy.
    pub user_sp: u64,
    /// Its user-mode frame pointer register.
    pub user_bp: u64,
    /// `USTACK_COPY_*`, plus [`USTACK_COPY_SHORT`].
    pub ustack_copy_status: u32,
    /// [`EVENT_CPU`] or [`EVENT_OFFCPU`].
    pub event: u32,
    /// [`EVENT_OFFCPU`]: nanoseconds the sample stands for (unbiased estimate of the sampled
    /// blocked intervals); [`EVENT_ALLOC`]: bytes asked for.
    pub weight: u64,
    /// [`EVENT_OFFCPU`]: blocked nanoseconds measured in the intervals sampled.
    pub blocked_ns: u64,
    /// [`EVENT_OFFCPU`]: the system call the thread blocked in, or -1.
    pub syscall_nr: i32,
    /// [`EVENT_OFFCPU`]: `OFFCPU_*` flags.
    pub offcpu_flags: u32,
    /// [`EVENT_OFFCPU`]: the system call's first argument; [`EVENT_ALLOC`]: the return address
    /// of the allocation function's caller when the kernel read it (`mmap`), else 0.
    pub syscall_arg0: u64,
    /// [`EVENT_ALLOC`]: the allocation's id, its key in the heap's live table ([`LiveAlloc`]).
    pub alloc_id: u64,
}

/// Value of the `offcpu_tasks` task storage (`struct spanprof_offcpu_task`): a thread's off-CPU
/// state, read by pidfd when the session ends.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct OffCpuTask {
    /// `bpf_ktime_get_ns()` of the switch out of a thread now blocked; 0 when not blocked.
    pub off_ts: u64,
    /// User ip when it blocked.
    pub off_ip: u64,
    /// User sp when it blocked.
    pub off_sp: u64,
    /// Weight of the sampled intervals not sent yet.
    pub weight_ns: u64,
    /// Their measured time.
    pub blocked_ns: u64,
    /// User ip of the pending intervals.
    pub pending_ip: u64,
    /// User sp of the pending intervals.
    pub pending_sp: u64,
    /// `--event wall`: when it was switched out runnable; 0 otherwise.
    pub runnable_ts: u64,
    /// Zero.
    pub _reserved: u64,
    /// `OFFCPU_IOWAIT` of the current interval.
    pub off_flags: u32,
    /// Flags of the pending intervals.
    pub flags: u32,
    /// Frames (or -errno) of the pending kernel stack.
    pub kstack_len: i32,
    /// Zero.
    pub _pad: u32,
    /// The pending kernel stack.
    pub kstack: [u64; MAX_STACK_DEPTH],
}

/// Allocation function `malloc`, in the top 4 bits of the `on_alloc` probe's attach cookie.
pub const ALLOC_MALLOC: u64 = 1;
/// `calloc`.
pub const ALLOC_CALLOC: u64 = 2;
/// `realloc`.
pub const ALLOC_REALLOC: u64 = 3;
/// `aligned_alloc`, `memalign`.
pub const ALLOC_MEMALIGN: u64 = 4;
/// `posix_memalign`.
pub const ALLOC_POSIX_MEMALIGN: u64 = 5;
/// `mmap`: the cookie's low 60 bits hold its link-time address (bits 30..59) and the end of
/// the library's code (bits 0..29).
pub const ALLOC_MMAP: u64 = 6;
/// CPython's `_PyObject_Malloc(ctx, size)` (`--python-allocators`): the cookie's low 48 bits
/// hold where `_PyObject_Realloc` starts relative to the probe (signed, bits 0..31) and its
/// length (bits 32..47).
pub const ALLOC_PY_MALLOC: u64 = 7;
/// `_PyObject_Calloc(ctx, nelem, elsize)`.
pub const ALLOC_PY_CALLOC: u64 = 8;
/// `_PyObject_Realloc(ctx, ptr, size)`; the cookie's bit 0: `realloc(NULL, n)` is inlined
/// (3.8), so this probe counts it.
pub const ALLOC_PY_REALLOC: u64 = 9;
/// `_PyObject_Free(ctx, ptr)`, the `on_free` probe's cookie.
pub const ALLOC_PY_FREE: u64 = 10;
/// pymalloc's arena allocator (`_PyObject_ArenaMmap`, `_PyMem_ArenaAlloc`): its mmap is not
/// counted when of the arena size, the cookie's low bits.
pub const ALLOC_PY_ARENA: u64 = 11;
/// The largest request pymalloc serves (`SMALL_REQUEST_THRESHOLD`, 3.8+).
pub const PY_SMALL_REQUEST: u64 = 512;

/// Key of the `alloc_live` map: a process and an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct AllocKey {
    /// Process id.
    pub tgid: u32,
    /// Zero.
    pub _pad: u32,
    /// The allocation's address.
    pub addr: u64,
}

/// Value of the `alloc_live` map: a sampled allocation not freed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct LiveAlloc {
    /// [`SampleHeader::alloc_id`] of its sample.
    pub alloc_id: u64,
    /// Bytes asked for.
    pub size: u64,
}

/// [`SampleHeader::event`]: a cpu-clock timer sample.
pub const EVENT_CPU: u32 = 0;
/// [`SampleHeader::event`]: blocked intervals of the thread, sent when it returned to user mode.
pub const EVENT_OFFCPU: u32 = 1;
/// [`SampleHeader::event`]: a sampled allocation.
pub const EVENT_ALLOC: u32 = 2;
/// [`SampleHeader::offcpu_flags`]: the thread was marked as waiting for I/O.
pub const OFFCPU_IOWAIT: u32 = 1;
/// [`SampleHeader::offcpu_flags`]: blocked outside a system call, or back in user mode elsewhere:
/// the record holds the kernel stack only.
pub const OFFCPU_NO_USER: u32 = 2;

/// [`SpanRecord::flags`]: `trace_id` and `span_id` hold OpenTelemetry's current span.
pub const SPAN_OTEL: u32 = 1;
/// [`SpanRecord::flags`]: `osp_base` and `osp_current` hold an OSProfiler trace.
pub const SPAN_OSP: u32 = 2;
/// [`SpanRecord::flags`]: `osp_parent` too.
pub const SPAN_OSP_PARENT: u32 = 4;
/// [`SpanRecord::flags`]: the ids come from the thread context record the process publishes
/// (OTEP 4947), not from its tracing libraries' objects.
pub const SPAN_PUBLISHED: u32 = 8;
/// [`SpanRecord::flags`]: `otel_name` holds the OpenTelemetry span's name. Only with
/// [`SPAN_OTEL`] ids read from the interpreter: the name is read from the span object, which is
/// not walked for ids taken from the published record ([`SPAN_PUBLISHED`]).
pub const SPAN_OTEL_NAME: u32 = 16;
/// [`SpanRecord::flags`]: `osp_name` holds the current OSProfiler trace point's name. Only with
/// [`SPAN_OSP`] ids read from the interpreter, likewise.
pub const SPAN_OSP_NAME: u32 = 32;
/// [`SpanRecord::flags`]: `thread_name` holds the thread's `threading.Thread` name, read at its
/// first sample (and again a second later at the earliest). It may come alone: a record whose
/// flags are only this has no span context.
pub const SPAN_THREAD_NAME: u32 = 64;
/// Bytes of a name a [`SpanRecord`] keeps (`SPANPROF_SPAN_NAME_MAX`): a longer name keeps its
/// first bytes; a str that is not compact ASCII gives no name at all.
pub const SPAN_NAME_MAX: usize = 64;
/// [`SpanProc::tls_kind`]: no published thread context.
pub const TLS_NONE: u32 = 0;
/// [`SpanProc::tls_kind`]: the thread's `otel_thread_ctx_v1` is at FS base + `tls_offset`.
pub const TLS_STATIC: u32 = 1;
/// [`SpanProc::tls_kind`]: at `dtv[tls_module]` + `tls_offset`, the DTV at FS base + 8.
pub const TLS_DTV: u32 = 2;
/// [`SpanProc::osp_keys`]: no such key.
pub const NO_KEY: u8 = 0xff;

/// The span context of a sampled thread (`struct spanprof_span`). Ids in wire (big-endian)
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct SpanRecord {
    /// OpenTelemetry trace id.
    pub trace_id: [u8; 16],
    /// OpenTelemetry span id.
    pub span_id: [u8; 8],
    /// OSProfiler base id (the first id of the thread's trace stack).
    pub osp_base: [u8; 16],
    /// OSProfiler current trace point id (the last).
    pub osp_current: [u8; 16],
    /// OSProfiler parent trace point id (the one before the last).
    pub osp_parent: [u8; 16],
    /// `SPAN_*`.
    pub flags: u32,
    /// Bytes of `otel_name` used, with [`SPAN_OTEL_NAME`].
    pub otel_name_len: u8,
    /// Bytes of `osp_name` used, with [`SPAN_OSP_NAME`].
    pub osp_name_len: u8,
    /// Bytes of `thread_name` used, with [`SPAN_THREAD_NAME`].
    pub thread_name_len: u8,
    /// Zero.
    pub _pad: u8,
    /// The OpenTelemetry SDK span's `_name` (ASCII, as read: user space checks it again).
    pub otel_name: [u8; SPAN_NAME_MAX],
    /// OSProfiler's `_Profiler._name[-1]`: the name of the current trace point.
    pub osp_name: [u8; SPAN_NAME_MAX],
    /// The thread's `threading.Thread` name (`_name` of `threading._active[get_ident()]`).
    pub thread_name: [u8; SPAN_NAME_MAX],
}

impl SpanRecord {
    /// The OpenTelemetry span's name bytes, if the record has them.
    pub fn otel_name(&self) -> Option<&[u8]> {
        Self::name(
            self.flags & SPAN_OTEL_NAME != 0,
            &self.otel_name,
            self.otel_name_len,
        )
    }

    /// The OSProfiler trace point's name bytes, if the record has them.
    pub fn osp_name(&self) -> Option<&[u8]> {
        Self::name(
            self.flags & SPAN_OSP_NAME != 0,
            &self.osp_name,
            self.osp_name_len,
        )
    }

    /// The thread's `threading` name bytes, if the record has them.
    pub fn thread_name(&self) -> Option<&[u8]> {
        Self::name(
            self.flags & SPAN_THREAD_NAME != 0,
            &self.thread_name,
            self.thread_name_len,
        )
    }

    /// Whether the record holds a span context (ids), not only a thread name.
    pub fn has_context(&self) -> bool {
        self.flags & (SPAN_OTEL | SPAN_OSP) != 0
    }

    fn name(set: bool, bytes: &[u8; SPAN_NAME_MAX], len: u8) -> Option<&[u8]> {
        let len = usize::from(len);
        (set && (1..=SPAN_NAME_MAX).contains(&len)).then(|| &bytes[..len])
    }
}

/// [`SpanProc::attr_kind`]: a dict at the type's `tp_dictoffset` (3.8–3.10).
pub const ATTR_DICTOFFSET: u32 = 1;
/// [`SpanProc::attr_kind`]: a managed dict at obj-24, or values at obj-32 (3.11).
pub const ATTR_MANAGED: u32 = 2;
/// [`SpanProc::attr_kind`]: obj-24 holds a dict, or the values' address minus one (3.12).
pub const ATTR_TAGGED: u32 = 3;
/// [`SpanProc::attr_kind`]: a dict at obj-24, or values inline at `tp_basicsize` (3.13).
pub const ATTR_INLINE: u32 = 4;
/// [`SpanProc::dict_kind`]: `dk_size` keys (3.8–3.10).
pub const DICT_SIZE: u32 = 1;
/// [`SpanProc::dict_kind`]: `dk_log2_size` keys (3.11+).
pub const DICT_LOG2: u32 = 2;
/// [`SpanProc::long_kind`]: `ob_size` (before 3.12).
pub const LONG_SIZE: u32 = 1;
/// [`SpanProc::long_kind`]: `lv_tag` (3.12+).
pub const LONG_TAG: u32 = 2;
/// [`SpanProc::local_kind`]: `tstate->dict[local.key]` is a dummy holding the dict (≤3.12).
pub const LOCAL_TSTATE_DICT: u32 = 1;
/// [`SpanProc::local_kind`]: `local.localdicts[tstate->threading_local_key]` (3.13).
pub const LOCAL_LOCALDICTS: u32 = 2;
/// [`SpanProc::green_kind`]: OSProfiler's local is a thread's.
pub const GREEN_NONE: u32 = 0;
/// [`SpanProc::green_kind`]: eventlet's `corolocal.local`, `osp_local` its greens' `data`.
pub const GREEN_EVENTLET: u32 = 1;
/// [`SpanProc::green_kind`]: gevent's `local`, `osp_local` its `_localimpl`'s `dicts`.
pub const GREEN_GEVENT: u32 = 2;

/// Value of the `span_procs` map (`struct spanprof_span_proc`): where a CPython process keeps
/// its threads' span contexts. Object addresses are 0 until the library is imported; a process
/// not read as Python has only its published thread context (`tls_*`, `osp_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct SpanProc {
    /// OpenTelemetry's `current_context` ContextVar.
    pub otel_var: u64,
    /// The str keying the current span in a `Context`.
    pub otel_key: u64,
    /// Its hash.
    pub otel_key_hash: u64,
    /// The interned str `_context`.
    pub context_name: u64,
    /// Its hash.
    pub context_name_hash: u64,
    /// `&_PyHamt_BitmapNode_Type`.
    pub hamt_bitmap_type: u64,
    /// `&_PyHamt_ArrayNode_Type`.
    pub hamt_array_type: u64,
    /// `&_PyHamt_CollisionNode_Type`.
    pub hamt_collision_type: u64,
    /// OSProfiler's `threading.local`: its key str (≤3.12) or its `localdicts` dict (3.13).
    pub osp_local: u64,
    /// Hash of the key str (≤3.12).
    pub osp_local_hash: u64,
    /// The interned str `profiler`.
    pub osp_profiler_name: u64,
    /// Its hash.
    pub osp_profiler_name_hash: u64,
    /// `osprofiler.profiler._Profiler`.
    pub osp_profiler_type: u64,
    /// The interned str `_trace_stack`.
    pub osp_stack_name: u64,
    /// Its hash.
    pub osp_stack_name_hash: u64,
    /// The interned str `_name` (an OpenTelemetry SDK span's name; OSProfiler's deque of trace
    /// point names), 0 until found.
    pub name_attr: u64,
    /// Its hash.
    pub name_attr_hash: u64,
    /// `&PyUnicode_Type` (the type of the `_name` str): a name is read only from an exact str.
    pub str_type: u64,
    /// The ContextVar's hash folded to 32 bits, as the HAMT keys it.
    pub otel_var_hash: u32,
    /// `offsetof(PyThreadState, context)`.
    pub tstate_context: u32,
    /// `offsetof(PyContext, ctx_vars)`.
    pub context_vars: u32,
    /// `offsetof(PyHamtObject, h_root)`.
    pub hamt_root: u32,
    /// Offset of `PyThreadState.dict` (≤3.12) or `threading_local_key` (3.13).
    pub tstate_local: u32,
    /// `LOCAL_*`.
    pub local_kind: u32,
    /// `DICT_*`.
    pub dict_kind: u32,
    /// Offset of `values[0]` in a split dict's values.
    pub dict_values: u32,
    /// `ATTR_*`.
    pub attr_kind: u32,
    /// `offsetof(PyTypeObject, tp_flags)`.
    pub type_flags: u32,
    /// `offsetof(PyTypeObject, tp_dictoffset)`.
    pub type_dictoffset: u32,
    /// `offsetof(PyTypeObject, tp_basicsize)`.
    pub type_basicsize: u32,
    /// `offsetof(PyHeapTypeObject, ht_cached_keys)`.
    pub type_cached_keys: u32,
    /// `LONG_*`.
    pub long_kind: u32,
    /// `sizeof(PyASCIIObject)`.
    pub str_data: u32,
    /// `TLS_*`: how a thread's OTEP 4947 `otel_thread_ctx_v1` is found.
    pub tls_kind: u32,
    /// Offset from the FS base (static) or in the module's TLS block (DTV).
    pub tls_offset: i64,
    /// The module's DTV index (DTV).
    pub tls_module: u64,
    /// Attribute key indexes of `osprofiler.base_id`, `.trace_id`, `.parent_id` and
    /// `spanprof.python_context` in the thread context record, or [`NO_KEY`].
    pub osp_keys: [u8; 4],
    /// `offsetof(PyTupleObject, ob_item)`: 24, 32 from 3.14 (`ob_hash` before the items).
    pub tuple_items: u32,
    /// `GREEN_*`: OSProfiler's local is green-thread local (eventlet, gevent); `osp_local` is
    /// then the dict of every greenlet's attributes.
    pub green_kind: u32,
    /// `TLS_*`: how a thread's greenlet state (`g_thread_state_global`) is found.
    pub green_tls_kind: u32,
    /// Offset from the FS base (static) or in greenlet's TLS block (DTV).
    pub green_tls_offset: i64,
    /// greenlet's DTV index (DTV).
    pub green_tls_module: u64,
    /// `&PyGreenlet_Type`: the type of a thread's main greenlet.
    pub green_type: u64,
    /// `&PyDict_Type`.
    pub dict_type: u64,
    /// `threading._active` (0 until found): the Thread objects by `get_ident()`, which is
    /// `pthread_self()`, the thread's FS base; their `_name` ([`SpanProc::name_attr`]) names
    /// the threads ([`SPAN_THREAD_NAME`]).
    pub threading_active: u64,
}

impl SpanProc {
    /// Whether it has something to read a span context from (a tracing library's objects, or
    /// a thread context the process publishes), not only thread names.
    pub fn reads_spans(&self) -> bool {
        self.otel_var != 0 || self.osp_local != 0 || self.tls_kind != TLS_NONE
    }
}

/// One Python frame of a sample (`struct spanprof_py_frame`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct PyFrame {
    /// Address of the `PyCodeObject`.
    pub code: u64,
    /// [`PyFrame::check_value`] of the code object as it was when sampled, to tell it from
    /// another object at the same address later.
    pub check: u64,
    /// Offset of the current instruction in the bytecode, in bytes.
    pub instr: u32,
    /// [`PY_FRAME_ENTRY`].
    pub flags: u32,
}

impl PyFrame {
    /// The [`PyFrame::check`] value of a code object (`SPANPROF_PY_CHECK` in the C header).
    /// 3.12+: from `co_firstlineno` and `co_version` (the other arguments 0). Before 3.12:
    /// from its name part ([`PyFrame::name_part`] of `co_qualname` or `co_name`), the
    /// addresses of `co_filename` and of its line table, and `co_firstlineno` (version 0).
    pub fn check_value(
        name: u64,
        filename_addr: u64,
        first_line: i32,
        table_addr: u64,
        version: u32,
    ) -> u64 {
        let mut h = mix(0, name);
        h = mix(h, filename_addr);
        h = mix(h, u64::from(first_line as u32));
        h = mix(h, table_addr);
        mix(h, u64::from(version))
    }

    /// The name part of [`PyFrame::check_value`] before 3.12 (`SPANPROF_PY_NAME`): the str's
    /// cached hash and its first 16 bytes of data, as two little-endian words.
    pub fn name_part(hash: u64, data0: u64, data1: u64) -> u64 {
        mix(mix(mix(0, hash), data0), data1)
    }
}

/// `spanprof_py_mix` of the C header.
fn mix(h: u64, x: u64) -> u64 {
    let h = (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

/// An exec notice (`struct spanprof_exec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct ExecRecord {
    /// [`RECORD_EXEC`], [`RECORD_EXIT`] for an exit notice, or [`RECORD_REFUSED`].
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// `bpf_ktime_get_ns()` at the exec.
    pub time_ns: u64,
}

/// Value of the `py_procs` map (`struct spanprof_py_proc`): where a CPython process keeps its
/// runtime and the offsets of its version. Offsets are bytes; [`PY_NO_OFFSET`] when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PyProc {
    /// Run-time address of `_PyRuntime`.
    pub runtime_addr: u64,
    /// `offsetof(_PyRuntimeState, interpreters.head)`.
    pub runtime_interp_head: u32,
    /// `offsetof(PyInterpreterState, threads.head)` (`tstate_head` before 3.11).
    pub interp_threads_head: u32,
    /// `offsetof(PyThreadState, next)`.
    pub tstate_next: u32,
    /// [`PY_MATCH_NATIVE_TID`] or [`PY_MATCH_PTHREAD`].
    pub tstate_match: u32,
    /// Offset of `native_thread_id` or `thread_id`.
    pub tstate_thread: u32,
    /// Offset of `frame`, `cframe` or `current_frame`.
    pub tstate_frame: u32,
    /// `offsetof(_PyCFrame, current_frame)` (3.11–3.12).
    pub cframe_current: u32,
    /// `f_back` / `previous`.
    pub frame_previous: u32,
    /// `f_code` / `f_executable`.
    pub frame_code: u32,
    /// `f_lasti` / `prev_instr` / `instr_ptr`.
    pub frame_instr: u32,
    /// `is_entry` (3.11) or `owner` (3.12+).
    pub frame_entry: u32,
    /// `PY_INSTR_*`.
    pub instr_kind: u32,
    /// `PY_ENTRY_*`.
    pub entry_kind: u32,
    /// `offsetof(PyCodeObject, co_code_adaptive)` (3.11+).
    pub code_adaptive: u32,
    /// `offsetof(PyCodeObject, co_firstlineno)`.
    pub code_firstlineno: u32,
    /// `offsetof(PyCodeObject, co_filename)`.
    pub code_filename: u32,
    /// Bytes read per frame (at most [`PY_FRAME_BLOCK`]).
    pub frame_size: u32,
    /// Bytes read per code object from `code_firstlineno`, through `co_filename` (at most
    /// [`PY_CODE_BLOCK`]).
    pub code_size: u32,
    /// `offsetof(PyCodeObject, co_qualname)` (3.11+) or `co_name`.
    pub code_name: u32,
    /// 3.11+: bytes read below a frame, within its page, so one read serves the frames next
    /// to it on the data stack (at most [`PY_WINDOW`]); 0 reads each frame alone.
    pub frame_window: u32,
    /// Before 3.12: offset of the hash in a `str`, which the check value takes instead of the
    /// name's address (mortal names are freed and their addresses reused); else
    /// [`PY_NO_OFFSET`].
    pub name_hash: u32,
    /// Offset of `co_linetable` (`co_lnotab` before 3.10), also in the check value.
    pub code_linetable: u32,
    /// Offset of a compact ASCII str's data, read with the hash before 3.12.
    pub name_data: u32,
    /// Offset of `co_version` (3.12+), or [`PY_NO_OFFSET`].
    pub code_version: u32,
}

// SAFETY: plain old data, every bit pattern valid, no padding (checked by the layout test).
unsafe impl Pod for SampleHeader {}
// SAFETY: as above.
unsafe impl Pod for Target {}
// SAFETY: as above.
unsafe impl Pod for PyFrame {}
// SAFETY: as above.
unsafe impl Pod for ExecRecord {}
// SAFETY: as above.
unsafe impl Pod for SpanRecord {}

/// Types that may be reinterpreted from any bytes of the right length.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding and accept every bit pattern.
pub unsafe trait Pod: Copy {}

/// A sample record read from the ring buffer: the header and the frames that follow it.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The fixed fields.
    pub header: &'a SampleHeader,
    kernel: &'a [u64],
    user: &'a [u64],
    python: &'a [PyFrame],
    span: Option<&'a SpanRecord>,
    ustack: &'a [u8],
}

/// A ring buffer record.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    /// An on-CPU sample.
    Sample(Sample<'a>),
    /// A process called execve.
    Exec(&'a ExecRecord),
    /// A process exited.
    Exit(&'a ExecRecord),
    /// A target exec'd a program of other credentials and is no longer profiled.
    Refused(&'a ExecRecord),
}

impl<'a> Record<'a> {
    /// Reads a record of any kind; `None` for unknown kinds, short or misaligned records.
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Record<'a>> {
        if bytes.len() < 4 || bytes.as_ptr().align_offset(8) != 0 {
            return None;
        }
        match u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) {
            RECORD_SAMPLE => Sample::from_bytes(bytes).map(Record::Sample),
            RECORD_EXEC if bytes.len() >= core::mem::size_of::<ExecRecord>() => {
                // SAFETY: length and alignment checked; ExecRecord is Pod.
                Some(Record::Exec(unsafe {
                    &*(bytes.as_ptr() as *const ExecRecord)
                }))
            }
            RECORD_EXIT if bytes.len() >= core::mem::size_of::<ExecRecord>() => {
                // SAFETY: length and alignment checked; ExecRecord is Pod.
                Some(Record::Exit(unsafe {
                    &*(bytes.as_ptr() as *const ExecRecord)
                }))
            }
            RECORD_REFUSED if bytes.len() >= core::mem::size_of::<ExecRecord>() => {
                // SAFETY: length and alignment checked; ExecRecord is Pod.
                Some(Record::Refused(unsafe {
                    &*(bytes.as_ptr() as *const ExecRecord)
                }))
            }
            _ => None,
        }
    }
}

impl<'a> Sample<'a> {
    /// Reads a record, or `None` when it is not a sample, is misaligned, or is shorter than its
    /// header says: the lengths are clamped to what the record holds, never trusted.
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Sample<'a>> {
        if bytes.len() < SAMPLE_HEADER_SIZE || bytes.as_ptr().align_offset(8) != 0 {
            return None;
        }
        // SAFETY: length and alignment checked above; SampleHeader is Pod.
        let header = unsafe { &*(bytes.as_ptr() as *const SampleHeader) };
        if header.kind != RECORD_SAMPLE {
            return None;
        }
        let frames_bytes = &bytes[SAMPLE_HEADER_SIZE..];
        // SAFETY: the pointer is 8-aligned (the record is, and the header is 136 bytes) and the
        // length covers whole u64s inside `bytes`; every bit pattern is a valid u64.
        let frames = unsafe {
            core::slice::from_raw_parts(frames_bytes.as_ptr() as *const u64, frames_bytes.len() / 8)
        };
        let k = clamp(header.kstack_len).min(frames.len());
        let u = clamp(header.ustack_len).min(frames.len() - k);
        let py_bytes = &frames_bytes[(k + u) * 8..];
        let p = (header.py_len as usize)
            .min(MAX_PY_FRAMES)
            .min(py_bytes.len() / PY_FRAME_SIZE);
        // SAFETY: 8-aligned (header and native frames are whole u64s), `p` whole frames inside
        // `bytes`, and PyFrame is Pod of size PY_FRAME_SIZE.
        let python = unsafe { core::slice::from_raw_parts(py_bytes.as_ptr() as *const PyFrame, p) };
        let span_bytes = &py_bytes[p * PY_FRAME_SIZE..];
        let span = (header.span_len as usize == core::mem::size_of::<SpanRecord>()
            && span_bytes.len() >= core::mem::size_of::<SpanRecord>())
        .then(|| {
            // SAFETY: 8-aligned (whole u64s and 24-byte frames before it), inside `bytes`, Pod.
            unsafe { &*(span_bytes.as_ptr() as *const SpanRecord) }
        });
        let copy_bytes = &span_bytes[span.map_or(0, |_| core::mem::size_of::<SpanRecord>())..];
        let c = (header.ustack_copy_len as usize)
            .min(MAX_STACK_COPY)
            .min(copy_bytes.len())
            & !7;
        Some(Sample {
            header,
            kernel: &frames[..k],
            user: &frames[k..k + u],
            python,
            span,
            ustack: &copy_bytes[..c],
        })
    }

    /// The copy of the user stack from `header.user_sp` upwards (empty unless `--unwind dwarf`;
    /// a whole number of u64s, clamped to what the record holds).
    pub fn user_stack_copy(&self) -> &'a [u8] {
        self.ustack
    }

    /// The kernel stack, leaf first (empty on error or in user mode).
    pub fn kernel_stack(&self) -> &'a [u64] {
        self.kernel
    }

    /// The user stack, leaf first (empty on error).
    pub fn user_stack(&self) -> &'a [u64] {
        self.user
    }

    /// The Python frames, innermost first (empty when the process is not Python).
    pub fn python_stack(&self) -> &'a [PyFrame] {
        self.python
    }

    /// What the Python walk found: `PY_NONE`, `PY_OK`, `PY_NO_THREAD` or `PY_READ_FAILED`.
    pub fn python_status(&self) -> u32 {
        self.header.py_status & PY_STATUS_MASK
    }

    /// Whether the Python walk stopped before the outermost frame (too deep, a cycle, or a
    /// failed read).
    pub fn python_truncated(&self) -> bool {
        self.header.py_status & PY_TRUNCATED != 0
    }

    /// The Python frames left out between the first `MAX_PY_FRAMES - PY_OUTER_FRAMES` and the
    /// outermost ones (at most 0xffff), when the stack was deeper than a sample holds.
    pub fn python_skipped(&self) -> Option<u32> {
        let s = self.header.py_status;
        (s & PY_SKIPPED != 0 && self.python.len() == MAX_PY_FRAMES).then_some(s >> PY_SKIPPED_SHIFT)
    }

    /// The span context of the thread, when one was read.
    pub fn span(&self) -> Option<&'a SpanRecord> {
        self.span
    }

    /// The thread name up to its first NUL.
    pub fn comm(&self) -> &'a [u8] {
        comm_bytes(&self.header.comm)
    }
}

/// A NUL-padded task name up to its first NUL.
pub fn comm_bytes(comm: &[u8; TASK_COMM_LEN]) -> &[u8] {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(TASK_COMM_LEN);
    &comm[..end]
}

fn clamp(len: i32) -> usize {
    usize::try_from(len).unwrap_or(0).min(MAX_STACK_DEPTH)
}

// SAFETY: Target is repr(C), padding-free and valid for every bit pattern (layout test).
#[cfg(feature = "user")]
unsafe impl aya::Pod for Target {}
// SAFETY: as above, for PyProc.
#[cfg(feature = "user")]
unsafe impl aya::Pod for PyProc {}
// SAFETY: as above, for SpanProc.
#[cfg(feature = "user")]
unsafe impl aya::Pod for SpanProc {}
// SAFETY: as above, for LiveAlloc.
#[cfg(feature = "user")]
unsafe impl aya::Pod for LiveAlloc {}
// SAFETY: as above, for AllocKey.
#[cfg(feature = "user")]
unsafe impl aya::Pod for AllocKey {}

/// `write!` to stderr that never panics, for the crates of the binary, which shadow `eprint!`
/// with it: a session whose stderr was closed (`spanprof … 2>&1 | head`, a terminal gone) goes
/// on and writes its outputs, and the lines are lost (`eprint!` would panic on `EPIPE`).
#[macro_export]
macro_rules! stderr_lossy {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stderr(), $($arg)*);
    }};
}

/// [`stderr_lossy!`] with a newline: the binary's `eprintln!`.
#[macro_export]
macro_rules! stderr_line_lossy {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// `write!` to stdout that never panics (a `spanprof dump | head`): the binary's `print!`.
#[macro_export]
macro_rules! stdout_lossy {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stdout(), $($arg)*);
    }};
}

/// [`stdout_lossy!`] with a newline: the binary's `println!`.
#[macro_export]
macro_rules! stdout_line_lossy {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($arg)*);
    }};
}

#[cfg(test)]
mod tests;
