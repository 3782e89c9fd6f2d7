/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The kernel/user ABI of spanprof: the one place that defines what the eBPF programs send to
 * user space. The Rust mirror is profiler-common/src/lib.rs; its tests compile static asserts
 * generated from the Rust layout against this header, with the host's compiler and as the BPF
 * programs are compiled (clang -target bpf), so the two cannot drift apart silently.
 *
 * Rules: fixed-width types only, explicit padding, no bool, every struct a multiple of 8 bytes.
 */
#ifndef SPANPROF_ABI_H
#define SPANPROF_ABI_H

#ifdef __BPF__
#include <linux/types.h>
#else
#include <stdint.h>
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef int64_t __s64;
typedef uint64_t __u64;
#endif

/* perf's default kernel.perf_event_max_stack; bpf_get_stack never returns more. */
#define SPANPROF_MAX_STACK_DEPTH 127
#define SPANPROF_TASK_COMM_LEN 16

/*
 * Most bytes of user stack one sample can carry (--unwind dwarf): the stack from the interrupted
 * user sp upwards, unwound in user space with the modules' .eh_frame. The size copied is the
 * `stack_copy_bytes` setting (--stack-copy), at most this.
 */
#define SPANPROF_MAX_STACK_COPY 32768

/* spanprof_sample.ustack_copy_status */
#define SPANPROF_USTACK_COPY_NONE 0   /* not asked (--unwind fp) */
#define SPANPROF_USTACK_COPY_OK 1     /* ustack_copy_len bytes from user_sp */
#define SPANPROF_USTACK_COPY_FAULT 2  /* the page at user_sp could not be read */
#define SPANPROF_USTACK_COPY_NO_REGS 3 /* no user registers (a kernel thread) */
/*
 * Flag: the copy reached the stack's top: an unreadable page before stack_copy_bytes, or a main
 * thread's initial stack pointer (mm->start_stack) plus 256 bytes.
 */
#define SPANPROF_USTACK_COPY_SHORT 0x100

/*
 * Python frames one sample can carry. A deeper stack keeps its innermost frames and its
 * SPANPROF_PY_OUTER_FRAMES outermost ones, flagged SPANPROF_PY_SKIPPED; the walk follows at most
 * SPANPROF_PY_WALK_FRAMES frames (a deeper one is flagged SPANPROF_PY_TRUNCATED).
 */
#define SPANPROF_MAX_PY_FRAMES 512
#define SPANPROF_PY_OUTER_FRAMES 32
#define SPANPROF_PY_WALK_FRAMES 2048

/* Record kinds, first field of every ring buffer record. */
#define SPANPROF_RECORD_SAMPLE 1
#define SPANPROF_RECORD_EXEC 2 /* struct spanprof_exec */
#define SPANPROF_RECORD_EXIT 3 /* struct spanprof_exec, of a process that exited */
/* struct spanprof_exec, of a target dropped at its exec: other credentials (guard_exec). */
#define SPANPROF_RECORD_REFUSED 4

/* Indexes of the per-CPU error counters (map `errors`). */
enum spanprof_error {
	/* The ring buffer was full: the sample is lost (counted, reported). */
	SPANPROF_ERR_RINGBUF_FULL = 0,
	/* bpf_get_stack failed for the kernel stack. */
	SPANPROF_ERR_KSTACK = 1,
	/* bpf_get_stack failed for the user stack. */
	SPANPROF_ERR_USTACK = 2,
	/* A child process could not be added to `target_pids` (map full). */
	SPANPROF_ERR_PID_MAP_FULL = 3,
	/* A Python thread's stack could not be (wholly) read: a read of its memory faulted. */
	SPANPROF_ERR_PY_READ = 4,
	/* A thread's span context could not be read: a read faulted or found garbage. */
	SPANPROF_ERR_SPAN_READ = 5,
	/*
	 * A sampled off-CPU interval was dropped: a thread blocked outside a system call and
	 * blocked again elsewhere before it made one (the first interval is the one dropped).
	 */
	SPANPROF_ERR_OFFCPU_DROPPED = 6,
	/* A thread that blocked could not get its off-CPU state (task storage): interval not seen. */
	SPANPROF_ERR_OFFCPU_STORAGE = 7,
	/* A sampled allocation could not be tracked for --event heap: `alloc_live` was full. */
	SPANPROF_ERR_HEAP_FULL = 8,
	/*
	 * Not an error: nanoseconds the targets' threads waited runnable for a CPU (--event wall),
	 * summed per CPU in the same map.
	 */
	SPANPROF_ERR_RUNNABLE_NS = 9,
	/*
	 * An allocation was not counted: the CPU's allocation sampler was in use by a thread it
	 * preempted (uprobe programs can be preempted on preemptible kernels).
	 */
	SPANPROF_ERR_ALLOC_BUSY = 10,
	/*
	 * A blocked thread's off-CPU interval was not seen ending: it blocked again with the
	 * previous interval still open (its switch back in found no state).
	 */
	SPANPROF_ERR_OFFCPU_MISSED = 11,
	/*
	 * Not an error: an off-CPU interval whose end (the switch back in) was not seen, found at
	 * its system call's exit and sent from there without its kernel stack.
	 */
	SPANPROF_ERR_OFFCPU_LATE = 12,
	SPANPROF_ERR_COUNT = 16,
};

/* Value of `target_pids`: why a process is profiled. */
#define SPANPROF_TARGET_EXPLICIT 1 /* named by the user (--pid, or the -- command) */
#define SPANPROF_TARGET_CHILD 2    /* forked by a profiled process */
#define SPANPROF_TARGET_SEEN 4     /* sampled since its fork or exec (set by the kernel side) */
#define SPANPROF_TARGET_SEEN_MAIN 8 /* sampled in its program's own code since (kernel side) */

struct spanprof_target {
	__u32 flags; /* SPANPROF_TARGET_* */
	__u32 parent_tgid; /* 0 for explicit targets */
};

/* spanprof_sample.py_status: what the Python walk found (low byte), plus flags. */
#define SPANPROF_PY_NONE 0	      /* not a Python process (no py_procs entry) */
#define SPANPROF_PY_OK 1	      /* py_len frames were read */
#define SPANPROF_PY_NO_THREAD 2	      /* no PyThreadState of this thread (C thread, no interpreter) */
#define SPANPROF_PY_READ_FAILED 3     /* a read of interpreter memory faulted */
#define SPANPROF_PY_STATUS_MASK 0xff
#define SPANPROF_PY_TRUNCATED 0x100   /* the walk stopped before the outermost frame */
/*
 * Frames were left out between py[SPANPROF_MAX_PY_FRAMES - SPANPROF_PY_OUTER_FRAMES - 1] and
 * the next (py_len is SPANPROF_MAX_PY_FRAMES); how many in the top 16 bits (at most 0xffff).
 */
#define SPANPROF_PY_SKIPPED 0x200
#define SPANPROF_PY_SKIPPED_SHIFT 16

/* spanprof_py_frame.flags */
/*
 * The outermost frame of one call of the interpreter loop: the frame rootward of it was left
 * by a return into C code (3.8–3.10: every frame; 3.11: `is_entry`; 3.12+: the next frame is a
 * C-stack shim). Set on all frames of 3.8–3.10, where every Python call is a C call.
 */
#define SPANPROF_PY_FRAME_ENTRY 1

/* One step of the check value's hash: mixes `x` into `h`. */
static inline __u64 spanprof_py_mix(__u64 h, __u64 x)
{
	h = (h ^ x) * 0x9E3779B97F4A7C15ULL;
	return h ^ (h >> 32);
}

/*
 * The check value of a code object. 3.12+: from co_firstlineno and co_version, a counter CPython
 * bumps for every code object it creates (the other arguments are 0). Before 3.12: from its
 * name part (SPANPROF_PY_NAME of co_qualname or co_name), the addresses of co_filename and of its
 * line table, and co_firstlineno (version 0).
 * Rust: profiler_common::PyFrame::check_value.
 */
#define SPANPROF_PY_CHECK(name, filename, first, table, version)                         \
	spanprof_py_mix(                                                                  \
		spanprof_py_mix(spanprof_py_mix(spanprof_py_mix(spanprof_py_mix(0, (name)),  \
								(filename)),                 \
						(__u64)(__u32)(first)),                      \
				(table)),                                                    \
		(__u64)(__u32)(version))

/*
 * Before 3.12 the name part: the str's cached hash (-1 until computed) and its first 16 bytes
 * of data, read in one read of SPANPROF_PY_NAME_READ bytes from the hash.
 * Rust: profiler_common::PyFrame::name_part.
 */
#define SPANPROF_PY_NAME_READ 40
#define SPANPROF_PY_NAME(hash, data0, data1) \
	spanprof_py_mix(spanprof_py_mix(spanprof_py_mix(0, (hash)), (data0)), (data1))

/* One Python frame of a sample, as read while the thread was stopped. */
struct spanprof_py_frame {
	__u64 code;  /* PyCodeObject address */
	/*
	 * Validates `code` when it is named later: SPANPROF_PY_CHECK of the code object's fields,
	 * read while the thread was stopped. The object found at `code` later is named only if it
	 * gives the same value.
	 */
	__u64 check;
	__u32 instr; /* offset of the current instruction in the bytecode, in bytes */
	__u32 flags; /* SPANPROF_PY_FRAME_* */
};

/* spanprof_span.flags: which ids were found. */
#define SPANPROF_SPAN_OTEL 1	   /* trace_id and span_id: OpenTelemetry's current span */
#define SPANPROF_SPAN_OSP 2	   /* osp_base and osp_current: an OSProfiler trace */
#define SPANPROF_SPAN_OSP_PARENT 4 /* osp_parent too */
#define SPANPROF_SPAN_PUBLISHED 8  /* from the thread context record the process publishes */
#define SPANPROF_SPAN_OTEL_NAME 16 /* otel_name: the OpenTelemetry span's name (with SPAN_OTEL) */
#define SPANPROF_SPAN_OSP_NAME 32  /* osp_name: the current trace point's name (with SPAN_OSP) */
/* thread_name: the thread's threading.Thread name (alone, no span context: not a span) */
#define SPANPROF_SPAN_THREAD_NAME 64

/*
 * Bytes of a span or trace point name kept: a longer name keeps its first bytes. Names are read
 * only from compact ASCII strs (every byte < 0x80); any other str gives no name.
 */
#define SPANPROF_SPAN_NAME_MAX 64

/*
 * The tracing context of the sampled thread, read while it was stopped. Ids are bytes in wire
 * order (big-endian), as W3C trace context and OTLP carry them; OSProfiler's UUIDs likewise.
 */
struct spanprof_span {
	__u8 trace_id[16];
	__u8 span_id[8];
	__u8 osp_base[16];    /* OSProfiler base_id: the first id of the thread's trace stack */
	__u8 osp_current[16]; /* the current trace point: the last id */
	__u8 osp_parent[16];  /* the one before it */
	__u32 flags;	      /* SPANPROF_SPAN_* */
	__u8 otel_name_len;   /* bytes of otel_name used (SPANPROF_SPAN_OTEL_NAME), 1 to NAME_MAX */
	__u8 osp_name_len;    /* bytes of osp_name used (SPANPROF_SPAN_OSP_NAME) */
	__u8 thread_name_len; /* bytes of thread_name used (SPANPROF_SPAN_THREAD_NAME) */
	__u8 _pad;
	/* OpenTelemetry SDK: the current span's `_name`; not NUL-terminated, zeros past the length. */
	__u8 otel_name[SPANPROF_SPAN_NAME_MAX];
	/* OSProfiler: `_Profiler._name[-1]`, the name given to the current trace point's start(). */
	__u8 osp_name[SPANPROF_SPAN_NAME_MAX];
	/* threading: `threading._active[pthread_self()]._name`, read at a thread's first sample. */
	__u8 thread_name[SPANPROF_SPAN_NAME_MAX];
};

/*
 * One sample: on-CPU (a timer event) or off-CPU (blocked intervals). The ring buffer record is variable-sized: the header, then only the frames
 * captured: k kernel frames and u user frames (8 bytes each, leaf first), then py_len Python
 * frames (struct spanprof_py_frame, innermost first), then span_len bytes of span context (0, or
 * a struct spanprof_span), then ustack_copy_len bytes of user stack from user_sp upwards. k and u are kstack_len and ustack_len clamped to
 * [0, SPANPROF_MAX_STACK_DEPTH]; py_len is at most SPANPROF_MAX_PY_FRAMES.
 */
struct spanprof_sample {
	__u32 kind; /* SPANPROF_RECORD_SAMPLE */
	__u32 cpu;
	__u32 pid; /* tgid */
	__u32 tid;
	__u64 time_ns; /* bpf_ktime_get_ns(), CLOCK_MONOTONIC */
	/* Number of frames captured, or a negative errno from bpf_get_stack. */
	__s32 kstack_len;
	__s32 ustack_len;
	char comm[SPANPROF_TASK_COMM_LEN];
	__u32 py_len;	 /* Python frames that follow the native ones */
	__u32 py_status; /* SPANPROF_PY_* */
	__u32 span_len;	 /* 0, or sizeof(struct spanprof_span) */
	__u32 ustack_copy_len; /* bytes of user stack after the span (a multiple of 8) */
	/* The user registers an unwinder starts from (the thread's user-mode pt_regs). */
	__u64 user_ip;
	__u64 user_sp;
	__u64 user_bp;
	__u32 ustack_copy_status; /* SPANPROF_USTACK_COPY_*, with flags */
	__u32 event;		  /* SPANPROF_EVENT_* */
	/*
	 * SPANPROF_EVENT_OFFCPU: the nanoseconds this sample stands for (the unbiased estimate of
	 * the sampled blocked intervals); SPANPROF_EVENT_ALLOC: the bytes asked for.
	 */
	__u64 weight;
	__u64 blocked_ns; /* SPANPROF_EVENT_OFFCPU: the blocked time measured in the intervals */
	__s32 syscall_nr;    /* the system call it blocked in and returned from, or -1 */
	__u32 offcpu_flags;  /* SPANPROF_OFFCPU_* */
	__u64 syscall_arg0;  /* its first argument; SPANPROF_EVENT_ALLOC: the caller's return address (mmap), or 0 */
	/*
	 * SPANPROF_EVENT_ALLOC: the allocation's id (CPU << 56 | a per-CPU counter), the key under
	 * which --event heap finds it in `alloc_live` while it is not freed.
	 */
	__u64 alloc_id;
	/*
	 * Kernel frames, then user frames, each leaf first, then the Python frames, then the span,
	 * then the user stack copy: each part right after the one before, so `py`, `span` and
	 * `ustack` only reserve room.
	 */
	__u64 stack[2 * SPANPROF_MAX_STACK_DEPTH];
	struct spanprof_py_frame py[SPANPROF_MAX_PY_FRAMES];
	struct spanprof_span span;
	__u8 ustack[SPANPROF_MAX_STACK_COPY];
};

/* spanprof_sample.event */
#define SPANPROF_EVENT_CPU 0	/* a cpu-clock timer sample */
#define SPANPROF_EVENT_OFFCPU 1 /* blocked intervals, sent when the thread returns to user mode */
#define SPANPROF_EVENT_ALLOC 2	/* a sampled allocation (malloc family, CPython arenas) */

/* Allocation functions, in the top 4 bits of the on_alloc probe's attach cookie. */
#define SPANPROF_ALLOC_MALLOC 1
#define SPANPROF_ALLOC_CALLOC 2
#define SPANPROF_ALLOC_REALLOC 3
#define SPANPROF_ALLOC_MEMALIGN 4	/* aligned_alloc, memalign */
#define SPANPROF_ALLOC_POSIX_MEMALIGN 5
#define SPANPROF_ALLOC_MMAP 6
/*
 * CPython's object allocator (--python-allocators): pymalloc's own functions, reached through
 * the allocator hooks (PyObject_Malloc, PyMem_Malloc), each with the hooks' context first.
 * _PyObject_Malloc's cookie holds, in its low 48 bits, where _PyObject_Realloc starts relative
 * to the probe (signed, bits 0..31) and its length (bits 32..47): a call from there is a block
 * realloc moves, which the realloc probe counts.
 */
#define SPANPROF_ALLOC_PY_MALLOC 7
#define SPANPROF_ALLOC_PY_CALLOC 8
#define SPANPROF_ALLOC_PY_REALLOC 9 /* cookie bit 0: realloc(NULL, n) inlined (3.8), counted here */
#define SPANPROF_ALLOC_PY_FREE 10  /* the on_free probe's cookie: the pointer is the 2nd argument */
#define SPANPROF_ALLOC_PY_ARENA 11 /* _PyObject_ArenaMmap, _PyMem_ArenaAlloc; cookie: arena size */
/* pymalloc serves requests of at most this many bytes (SMALL_REQUEST_THRESHOLD, 3.8+). */
#define SPANPROF_PY_SMALL_REQUEST 512

/*
 * Key of `alloc_live`: a process and an address (a forked child has its parent's addresses: the
 * child's free of X must not free the parent's X).
 */
struct spanprof_alloc_key {
	__u32 tgid;
	__u32 _pad;
	__u64 addr;
};

/* Value of `alloc_live`: a sampled allocation not freed yet (--event heap). */
struct spanprof_live_alloc {
	__u64 alloc_id; /* spanprof_sample.alloc_id of its sample */
	__u64 size;
};

/* spanprof_sample.offcpu_flags */
#define SPANPROF_OFFCPU_IOWAIT 1  /* the thread was marked as waiting for I/O (in_iowait) */
/*
 * The thread was blocked outside a system call (a page fault) or came back to user mode
 * elsewhere: the record holds its kernel stack only.
 */
#define SPANPROF_OFFCPU_NO_USER 2

/*
 * Off-CPU state of a thread of a profiled process (task storage `offcpu_tasks`, created the
 * first time it blocks; user space reads it by pidfd when the session ends). An interval runs
 * from the switch out of the blocked thread to its switch back in; one the sampling keeps waits
 * here ("pending") until the thread is back in user mode, where its user and Python stacks can
 * be read: at the exit of the system call it blocked in, on_sys_exit sends it. Intervals kept
 * within one system call add up (the user stack cannot change meanwhile); the kernel stack is
 * the first one's.
 */
struct spanprof_offcpu_task {
	__u64 off_ts;	   /* bpf_ktime_get_ns() of the switch out; 0 when not blocked */
	__u64 off_ip;	   /* user ip and sp when it blocked (its user-mode registers) */
	__u64 off_sp;
	__u64 weight_ns;   /* pending weight; 0 when nothing is pending */
	__u64 blocked_ns;  /* pending measured time */
	__u64 pending_ip;  /* user ip and sp of the pending intervals */
	__u64 pending_sp;
	__u64 runnable_ts; /* --event wall: switched out runnable (preempted) at; 0 otherwise */
	__u64 _reserved;
	__u32 off_flags;   /* SPANPROF_OFFCPU_IOWAIT of the current interval */
	__u32 flags;	   /* of the pending ones */
	__s32 kstack_len;  /* frames (or -errno) of the pending kernel stack */
	__u32 _pad;
	__u64 kstack[SPANPROF_MAX_STACK_DEPTH];
};

/*
 * A process called execve: what user space knew of its address space is stale. Also, with
 * kind SPANPROF_RECORD_EXIT, a process that exited: every sample of it is before this record.
 */
struct spanprof_exec {
	__u32 kind; /* SPANPROF_RECORD_EXEC, _EXIT or _REFUSED */
	__u32 pid;  /* tgid */
	__u64 time_ns;
};

/* How a PyThreadState is matched with the sampled thread (spanprof_py_proc.tstate_match). */
#define SPANPROF_PY_MATCH_NATIVE_TID 1 /* 3.11+: native_thread_id == tid */
#define SPANPROF_PY_MATCH_PTHREAD 2    /* 3.8–3.10: thread_id (pthread_self) == task fsbase */

/* How a frame's current instruction is stored (spanprof_py_proc.instr_kind). */
#define SPANPROF_PY_INSTR_LASTI_BYTES 1 /* int f_lasti, in bytes (3.8–3.9) */
#define SPANPROF_PY_INSTR_LASTI_UNITS 2 /* int f_lasti, in 2-byte code units (3.10) */
#define SPANPROF_PY_INSTR_POINTER 3	/* pointer into co_code_adaptive (3.11+) */

/* How the end of one interpreter-loop call is marked (spanprof_py_proc.entry_kind). */
#define SPANPROF_PY_ENTRY_EVERY_FRAME 1 /* 3.8–3.10 */
#define SPANPROF_PY_ENTRY_FIELD 2	/* 3.11: a bool at frame_entry */
#define SPANPROF_PY_ENTRY_SHIM 3	/* 3.12+: frames with owner (at frame_entry) >= 3 */

/* No such field in this version. */
#define SPANPROF_PY_NO_OFFSET 0xffffffff

/*
 * Value of `py_procs` (key: tgid), written by user space for each CPython process it detects:
 * where `_PyRuntime` is and the offsets of the version, so the BPF code is version-independent.
 */
struct spanprof_py_proc {
	__u64 runtime_addr;	   /* run-time address of _PyRuntime */
	__u32 runtime_interp_head; /* offsetof(_PyRuntimeState, interpreters.head) */
	__u32 interp_threads_head; /* offsetof(PyInterpreterState, threads.head | tstate_head) */
	__u32 tstate_next;
	__u32 tstate_match;	   /* SPANPROF_PY_MATCH_* */
	__u32 tstate_thread;	   /* offset of native_thread_id or thread_id */
	__u32 tstate_frame;	   /* offset of frame | cframe | current_frame */
	__u32 cframe_current;	   /* offsetof(_PyCFrame, current_frame), or NO_OFFSET */
	__u32 frame_previous;
	__u32 frame_code;
	__u32 frame_instr;
	__u32 frame_entry;	   /* is_entry (3.11) or owner (3.12+), or NO_OFFSET */
	__u32 instr_kind;	   /* SPANPROF_PY_INSTR_* */
	__u32 entry_kind;	   /* SPANPROF_PY_ENTRY_* */
	__u32 code_adaptive;	   /* offsetof(PyCodeObject, co_code_adaptive), or NO_OFFSET */
	__u32 code_firstlineno;	   /* read with code_filename and code_name in one block */
	__u32 code_filename;	   /* of code_size <= SPANPROF_PY_CODE_BLOCK bytes from here */
	__u32 frame_size;	   /* bytes read per frame, covering every frame_* field */
	__u32 code_size;	   /* bytes read per code object, from code_firstlineno */
	__u32 code_name;	   /* offset of co_qualname (3.11+) or co_name, in the same block */
	/*
	 * 3.11+: frames sit next to each other on the thread's data stack, so a frame is read with
	 * the bytes below it, up to this many, within its page: one read serves several frames.
	 * 0: each frame is read alone (3.8–3.10 frame objects live anywhere on the heap).
	 */
	__u32 frame_window;
	/*
	 * Before 3.12, names are mortal strings whose addresses are reused: the name part of the
	 * check is SPANPROF_PY_NAME, read from this offset (the str's hash) in a second read, with
	 * the data at name_data. Unused on 3.12+.
	 */
	__u32 name_hash;
	__u32 code_linetable;	   /* offset of co_linetable / co_lnotab, in the same block */
	__u32 name_data;	   /* offset of a compact ASCII str's data (before 3.12) */
	__u32 code_version;	   /* offset of co_version (3.12+: the block ends with it), or NO_OFFSET */
};

/* How an object's instance attributes are stored (spanprof_span_proc.attr_kind). */
#define SPANPROF_ATTR_DICTOFFSET 1 /* 3.8–3.10: a dict at the type's tp_dictoffset */
#define SPANPROF_ATTR_MANAGED 2	   /* 3.11: a dict at obj-24, or values at obj-32 */
#define SPANPROF_ATTR_TAGGED 3	   /* 3.12: obj-24 holds a dict, or the values' address - 1 */
#define SPANPROF_ATTR_INLINE 4	   /* 3.13: a dict at obj-24, or values inline at tp_basicsize */

/* How a dict's keys object is laid out (spanprof_span_proc.dict_kind). */
#define SPANPROF_DICT_SIZE 1 /* 3.8–3.10: dk_size; the index width follows from it */
#define SPANPROF_DICT_LOG2 2 /* 3.11+: dk_log2_size, dk_log2_index_bytes, dk_kind */

/* How a PyLong's size is stored (spanprof_span_proc.long_kind). */
#define SPANPROF_LONG_SIZE 1 /* ob_size: signed number of digits */
#define SPANPROF_LONG_TAG 2  /* 3.12+: lv_tag: digits << 3 | sign */

/* How a thread finds its copy of `otel_thread_ctx_v1` (spanprof_span_proc.tls_kind). */
#define SPANPROF_TLS_NONE 0   /* the process publishes no thread context */
#define SPANPROF_TLS_STATIC 1 /* at FS base + tls_offset */
#define SPANPROF_TLS_DTV 2    /* at dtv[tls_module].block + tls_offset; the DTV at FS base + 8 */
/* spanprof_span_proc.osp_keys: no such attribute key. */
#define SPANPROF_NO_KEY 0xff

/* Where a threading.local keeps a thread's attributes (spanprof_span_proc.local_kind). */
#define SPANPROF_LOCAL_TSTATE_DICT 1 /* <=3.12: tstate->dict[local.key] is a dummy; +16 the dict */
#define SPANPROF_LOCAL_LOCALDICTS 2  /* 3.13: local.localdicts[tstate->threading_local_key] */

/*
 * Whose green-thread local OSProfiler's `__local_ctx` is (spanprof_span_proc.green_kind), when
 * eventlet or gevent monkey-patched threading.local before OSProfiler was imported.
 */
#define SPANPROF_GREEN_NONE 0
#define SPANPROF_GREEN_EVENTLET 1 /* corolocal.local: greens.data[weakref(greenlet)] is the dict */
#define SPANPROF_GREEN_GEVENT 2	  /* gevent.local: dicts[id(greenlet)] is (weakref, dict) */

/*
 * Value of `span_procs` (key: tgid): where a CPython process keeps the span context of its
 * threads, found by user space in the process's memory (of a process not read as Python, only
 * the published thread context: the tls_* fields and osp_keys). The objects are those of the tracing
 * libraries (0 until the process imports them: user space looks again later); the offsets are
 * the version's. Hashes are of the keys as the dicts store them (a str's cached hash).
 */
struct spanprof_span_proc {
	/* OpenTelemetry: the Context of the ContextVar `otel_var` holds the span at `otel_key`. */
	__u64 otel_var;
	__u64 otel_key;
	__u64 otel_key_hash;
	__u64 context_name; /* the interned str "_context": a span's SpanContext */
	__u64 context_name_hash;
	__u64 hamt_bitmap_type; /* &_PyHamt_BitmapNode_Type and its siblings */
	__u64 hamt_array_type;
	__u64 hamt_collision_type;
	/*
	 * OSProfiler: its threading.local (<=3.12: the local's key str; 3.13: its localdicts
	 * dict), then attribute `profiler` (of type osp_profiler_type), then its `_trace_stack`.
	 */
	__u64 osp_local;
	__u64 osp_local_hash;
	__u64 osp_profiler_name;
	__u64 osp_profiler_name_hash;
	__u64 osp_profiler_type;
	__u64 osp_stack_name;
	__u64 osp_stack_name_hash;
	/*
	 * Names: the interned str `_name` (0 until found: the OpenTelemetry SDK's ReadableSpan and
	 * OSProfiler's _Profiler both keep their names under it) and the type of strs (`str`, read
	 * from that object), which a name must be exactly.
	 */
	__u64 name_attr;
	__u64 name_attr_hash;
	__u64 str_type;
	__u32 otel_var_hash;   /* the ContextVar's hash folded to 32 bits, as the HAMT keys it */
	__u32 tstate_context;  /* offsetof(PyThreadState, context) */
	__u32 context_vars;    /* offsetof(PyContext, ctx_vars) */
	__u32 hamt_root;       /* offsetof(PyHamtObject, h_root) */
	__u32 tstate_local;    /* offset of PyThreadState dict (<=3.12) or threading_local_key */
	__u32 local_kind;      /* SPANPROF_LOCAL_* */
	__u32 dict_kind;       /* SPANPROF_DICT_* */
	__u32 dict_values;     /* offset of values[0] in a split dict's values */
	__u32 attr_kind;       /* SPANPROF_ATTR_* */
	__u32 type_flags;      /* offsetof(PyTypeObject, tp_flags) */
	__u32 type_dictoffset; /* offsetof(PyTypeObject, tp_dictoffset) */
	__u32 type_basicsize;  /* offsetof(PyTypeObject, tp_basicsize) */
	__u32 type_cached_keys; /* offsetof(PyHeapTypeObject, ht_cached_keys) */
	__u32 long_kind;       /* SPANPROF_LONG_* */
	__u32 str_data;	       /* sizeof(PyASCIIObject): a compact ASCII str's data */
	__u32 tls_kind;	       /* SPANPROF_TLS_*: OTEP 4947 `otel_thread_ctx_v1` */
	__s64 tls_offset;
	__u64 tls_module;
	/*
	 * Key indexes, in the thread context record's attributes, of osprofiler.base_id,
	 * osprofiler.trace_id, osprofiler.parent_id and spanprof.python_context (the PyContext the
	 * OpenTelemetry ids were published in: 16 hex digits), from the OTEP 4719 process
	 * context's key map, or SPANPROF_NO_KEY.
	 */
	__u8 osp_keys[4];
	__u32 tuple_items; /* offsetof(PyTupleObject, ob_item): 24, 32 from 3.14 (ob_hash) */
	/*
	 * OSProfiler under eventlet or gevent (green_kind not SPANPROF_GREEN_NONE): osp_local is
	 * the dict of every greenlet's attributes, keyed by the current greenlet, which greenlet's
	 * thread-local `g_thread_state_global` gives (green_tls_*, found as tls_* are: a
	 * ThreadState pointer, 1 before the thread's first use; the ThreadState begins with the
	 * main greenlet, whose type must be green_type, then the current greenlet).
	 */
	__u32 green_kind;     /* SPANPROF_GREEN_* */
	__u32 green_tls_kind; /* SPANPROF_TLS_* */
	__s64 green_tls_offset;
	__u64 green_tls_module;
	__u64 green_type; /* &PyGreenlet_Type */
	__u64 dict_type;  /* &PyDict_Type: which field of a gevent entry is the dict */
	/*
	 * threading's `_active` dict (0 until found): Thread objects keyed by get_ident(), which is
	 * pthread_self(), the thread's FS base. Their `_name` (name_attr) is a thread's name.
	 */
	__u64 threading_active;
};

/* Limits of the two block reads of a frame walk step (frame, then code object). */
#define SPANPROF_PY_FRAME_BLOCK 128
#define SPANPROF_PY_CODE_BLOCK 96
#define SPANPROF_PY_WINDOW 1024

/*
 * Sizes of maps that user space sizes or fills itself: scratches per CPU (the `scratch` map has
 * this many entries per possible CPU), and the entries of `alloc_gaps`.
 */
#define SPANPROF_SCRATCH_SLOTS 3
#define SPANPROF_ALLOC_GAPS 256

#define SPANPROF_SAMPLE_HEADER_SIZE 136
#define SPANPROF_PY_FRAME_SIZE 24

#endif /* SPANPROF_ABI_H */
