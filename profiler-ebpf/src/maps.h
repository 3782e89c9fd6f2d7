/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Every map of spanprof's eBPF object, with its size and value type, and every setting user
 * space fixes before load (EbpfLoader::override_global): the one list of what the object shares
 * with user space besides the records of spanprof_abi.h.
 *
 * Written once, used by every unit: maps.bpf.c defines them (SPANPROF_MAPS_DEFINE), the other
 * units see `extern` declarations of the same text, which libbpf's static linker (bpftool gen
 * object, build.rs) resolves against those definitions, checking that each matches it. So the
 * linked object has one of each map, shared by all programs. Declarations only: no code runs here.
 */
#ifndef SPANPROF_MAPS_H
#define SPANPROF_MAPS_H

#include "kernel.h"

#ifdef SPANPROF_MAPS_DEFINE
#define SPANPROF_MAP
#define SPANPROF_SETTING(type, name, value) const volatile type name = value
#else
#define SPANPROF_MAP extern
#define SPANPROF_SETTING(type, name, value) extern const volatile type name
#endif

/* Settings, fixed by user space before load (EbpfLoader::override_global); these are defaults. */

/* --follow-children: on_fork makes the children of targets targets. */
SPANPROF_SETTING(__u32, follow_children, 0);
/*
 * A spanprof that may not read other users' processes (not root, no CAP_SYS_PTRACE): on_exec
 * drops a target whose new program runs with other credentials than these (a setuid or setgid
 * program) or with capabilities spanprof does not hold (file capabilities), as --pid refuses
 * such a process. guard_exec 0: no check (root).
 */
SPANPROF_SETTING(__u32, guard_exec, 0);
SPANPROF_SETTING(__u32, guard_uid, 0);
SPANPROF_SETTING(__u32, guard_gid, 0);
SPANPROF_SETTING(__u64, guard_caps, 0);
/*
 * User space drains the ring buffer on a timer; it is woken early only when more than this many
 * bytes wait, so a sample does not cost a wake-up of user space (half the ring by default).
 */
SPANPROF_SETTING(__u64, wakeup_bytes, 2 * 1024 * 1024);
/*
 * --unwind dwarf: bytes of user stack copied per sample (a multiple of 8, at most
 * SPANPROF_MAX_STACK_COPY), unwound in user space; 0 (--unwind fp): the kernel's frame-pointer
 * walk instead.
 */
SPANPROF_SETTING(__u32, stack_copy_bytes, 0);
/*
 * Off-CPU sampling (--event offcpu): a blocked interval of d ns, d >= offcpu_min_ns, is kept
 * with weight d when d >= offcpu_period_ns, else with probability d / period and weight period
 * (an unbiased estimate of the time blocked in each stack, at about the cost of on-CPU samples).
 */
SPANPROF_SETTING(__u64, offcpu_period_ns, 10101010);
SPANPROF_SETTING(__u64, offcpu_min_ns, 5000);
/*
 * --event offcpu or wall: blocked intervals are measured (on_switch is attached); the task
 * iterator then counts the open ones instead of listing blocked threads (dump.task.c).
 */
SPANPROF_SETTING(__u32, offcpu_enabled, 0);
/* --event wall: the time targets' threads wait runnable (preempted) is summed per thread. */
SPANPROF_SETTING(__u32, offcpu_runnable, 0);
/*
 * --event alloc: bytes allocated between two sampled allocations, on average (exponentially
 * distributed gaps; alloc.bpf.c); <= 1 samples every allocation.
 */
SPANPROF_SETTING(__u64, alloc_rate, 524288);
/* --event heap: sampled allocations are tracked to their free (uretprobes and free uprobes). */
SPANPROF_SETTING(__u32, alloc_heap, 0);
/*
 * `spanprof dump`: the index in `scratch` of the task iterator's own scratch, after the CPUs'
 * (user space makes the map one entry longer).
 */
SPANPROF_SETTING(__u32, dump_scratch_key, 0);

/* Maps of the targets, written by user space (and by on_fork, for children). */

/* Processes to profile, by tgid. User space adds targets; on_fork adds their children. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_target);
} target_pids SEC(".maps");

/* Sized by user space (--ring-buffer-size); this is the default. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} samples SEC(".maps");

/* CPython processes among the targets: offsets and addresses, written by user space. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_py_proc);
} py_procs SEC(".maps");

/*
 * Where processes keep span contexts (a CPython's objects, a published thread context of any
 * process): written by user space once it found them.
 */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_span_proc);
} span_procs SEC(".maps");

/*
 * Bytes of stack copied for a process, when not stack_copy_bytes: user space raises it for a
 * process whose stacks the default copy truncates. Copied on fork, dropped on exec and exit.
 */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} stack_copy_sizes SEC(".maps");

/* The sampling programs: their Python thread cache, scratch and error counters. */

/*
 * The PyThreadState found for a thread, checked before each use (it may have been freed); 0 when
 * the search found none (a C thread), which is trusted for PY_NO_THREAD_RETRY units.
 */
struct py_tstate {
	__u64 tstate;
	__u32 tgid;
	__u32 stamp; /* bpf_ktime_get_ns() >> 20 (units of ~1 ms) of a negative entry */
};

SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
	__type(value, struct py_tstate);
} py_threads SEC(".maps");

/*
 * When a thread's threading name was read last (bpf_ktime_get_ns()), by tid: it is read at the
 * thread's first sample, then at most once per THREAD_NAME_EVERY_NS (span_read.bpf.c).
 */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
	__type(value, __u64);
} thread_named SEC(".maps");

/* Bytes read at once by the span reading: a dict keys header, a str up to a UUID's end. */
#define SPAN_BUF 96
/* One read of a type object, from tp_basicsize through tp_dictoffset. */
#define TYPE_BLOCK 272
/* One read of a dict's keys object: header, indices and the first entries of a small table. */
#define KEYS_BLOCK 256

/* The state of a dict or HAMT lookup, run as a bpf_loop whose callback finds it in scratch. */
struct lookup {
	__u64 key;	/* object compared by identity */
	__u64 hash;
	__u64 node;	/* HAMT: the node to look in next */
	__u64 index;	/* dict: the index table */
	__u64 entries;	/* dict: entry 0 */
	__u64 values;	/* dict: split values[0], or 0 for a combined table */
	__u64 mask;
	__u64 i;
	__u64 perturb;
	__u64 result;	/* the value found, or 0 */
	__u64 rkey;	/* dict, by_hash: the key of the entry found */
	__u32 by_hash;	/* dict: match the entry's stored hash, not the key (general tables) */
	__u32 width;	/* dict: bytes per index */
	__u32 esize;	/* dict: bytes per entry */
	__u32 koff;	/* dict: offset of the key in an entry */
	__u32 nentries;
	__u32 shift;	/* HAMT: bits of the hash used so far */
	__s32 status;	/* 0 going on or not found, 1 found, SPAN_FAULT */
};

/*
 * Where a sample is assembled before the used part is copied into the ring buffer, and the
 * state of the Python walk, which bpf_loop callbacks reach through this map.
 */
struct scratch {
	struct spanprof_sample s;
	/*
	 * Room for the last page-sized read of the stack copy past `s.ustack`, so the verifier can
	 * bound it by (start < end of ustack) + (length <= one page).
	 */
	__u8 ustack_slack[4096];
	struct spanprof_py_proc cfg;
	__u64 frame;  /* next frame to read; tstate during the thread search */
	__u64 want;   /* thread search: the value that identifies the sampled thread */
	__u64 last_code;  /* the code object read last in this walk, and its check value */
	__u64 last_check;
	__u32 py_base; /* byte offset of the Python frames in s.stack */
	__u32 n;       /* Python frames recorded */
	__u32 status;  /* SPANPROF_PY_* */
	__u32 slot;    /* SCRATCH_*: which of the CPU's scratches this is */
	__u64 win_base; /* target address of win[0] */
	__u32 win_len;  /* bytes of win that hold target memory */
	__u32 _pad2;
	__u8 win[SPANPROF_PY_WINDOW];
	__u8 code[SPANPROF_PY_CODE_BLOCK];
	__u8 name[SPANPROF_PY_NAME_READ];
	/* The span context read: config, result, the state of the bpf_loop lookups. */
	struct spanprof_span_proc scfg;
	struct spanprof_span span;
	__u64 tstate;
	/*
	 * The objects whose `_name` span_name reads, found by the id readers: the OpenTelemetry
	 * span (0: not read from the interpreter), OSProfiler's _Profiler.
	 */
	__u64 name_obj[2];
	/*
	 * The length of OSProfiler's id stack (_trace_stack) osp_trace read: the name of the current
	 * point is taken only when the name deque is two shorter (base id and parent id first), so
	 * a sample inside start() or stop(), which update the two one after the other, gets no name
	 * rather than the name of another point.
	 */
	__u64 osp_depth;
	struct lookup q;
	__u8 buf[SPAN_BUF];
	__u8 tblock[TYPE_BLOCK];
	__u8 kblock[KEYS_BLOCK];
	__u64 kbase; /* target address of kblock[0] */
	__u32 klen;  /* bytes of kblock read */
	__u32 _pad3;
	__u64 kvalues; /* the split values the lookup in kblock was given (0: combined table) */
	/*
	 * The object whose attributes' keys kblock holds (the last lookup was a getattr of it that
	 * found its name), or 0: a second attribute of it is looked up without reading them again.
	 */
	__u64 attrs_obj;
	/* The stack copy's page loop (copy_page_step): from, where in s.stack, bytes wanted, done. */
	__u64 cp_sp;
	__u64 cp_off;
	__u64 cp_want;
	__u64 cp_done;
};

/*
 * Scratch slots per CPU: the timer sample, the off-CPU sample the sys_exit program sends, and
 * the allocation sample of a uprobe.
 */
#define SCRATCH_CPU 0
#define SCRATCH_OFFCPU 1
#define SCRATCH_ALLOC 2

/*
 * SPANPROF_SCRATCH_SLOTS scratches per CPU, at CPU * SPANPROF_SCRATCH_SLOTS + slot: a plain array
 * because a per-CPU array's value is limited to 32 KiB and a sample with its stack copy is more.
 * User space sets max_entries to SPANPROF_SCRATCH_SLOTS times the number of possible CPUs. The
 * timer sample (slot 0) may interrupt the sys_exit program (slot 1) or a uprobe program (slot
 * 2); a perf event program does not run inside another and a tracing program that would nest
 * with itself is skipped; a uprobe program may be preempted by another on its CPU (preemptible
 * kernels), so alloc_event takes slot 2 with a busy flag.
 */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* Per-CPU counters, indexed by enum spanprof_error (spanprof_abi.h); user space sums them. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SPANPROF_ERR_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} errors SEC(".maps");

/* --event offcpu. */

/* Off-CPU state of the targets' threads: struct spanprof_offcpu_task (spanprof_abi.h). */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct spanprof_offcpu_task);
} offcpu_tasks SEC(".maps");

/* --event alloc and heap. */

SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SPANPROF_ALLOC_GAPS); /* filled by user space */
	__type(key, __u32);
	__type(value, __u64);
} alloc_gaps SEC(".maps");

struct alloc_cpu {
	__s64 until;  /* bytes to allocate before the next sample */
	__u64 serial; /* allocations sampled on this CPU */
	__u32 seeded; /* until was drawn once (a countdown starting at 0 would sample at once) */
	__u32 busy;   /* a sample is being made on this CPU (a preempted uprobe program) */
};

SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct alloc_cpu);
} alloc_cpus SEC(".maps");

/* A sampled allocation whose call has not returned yet (--event heap), by thread. */
struct alloc_call {
	__u64 alloc_id;
	__u64 size;
	__u64 memptr; /* posix_memalign: where the address will be written; else 0 */
	__u64 sp;     /* the stack pointer at the call's entry: its return has sp + 8 */
};

SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* tid */
	__type(value, struct alloc_call);
} alloc_calls SEC(".maps");

/*
 * --python-allocators: a thread inside pymalloc's arena allocator, with the size it maps: that
 * mmap is not counted (the objects carved from the arena are).
 */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tid */
	__type(value, __u64);
} arena_calls SEC(".maps");

/* --python-allocators: a block _PyObject_Realloc counted and may pass on to realloc, by thread. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tid */
	__type(value, __u64);
} py_reallocs SEC(".maps");

/* Sampled allocations not freed yet, by address (--event heap); read by user space at the end. */
SPANPROF_MAP struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct spanprof_alloc_key);
	__type(value, struct spanprof_live_alloc);
} alloc_live SEC(".maps");

#endif /* SPANPROF_MAPS_H */
