// SPDX-License-Identifier: GPL-2.0
/*
 * spanprof's eBPF programs: on-CPU sampling, the CPython frame walk, and following children
 * of profiled processes.
 *
 * Kept bounded: two bpf_get_stack calls per sample, a bpf_loop of at most
 * PY_THREAD_LOOPS steps to find a Python thread state (once per thread: the result is cached)
 * and one of at most PY_FRAME_LOOPS steps of two reads each to walk its frames, then one ring
 * buffer record. Everything that can fail is counted in `errors` so user space can report it.
 */
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "spanprof_abi.h"

#define EFAULT 14 /* include/uapi/asm-generic/errno-base.h */

char LICENSE[] SEC("license") = "GPL";

/*
 * Kernel types read here. CO-RE relocates the fields by name against the running
 * kernel's BTF, so these stubs stand in for a full vmlinux.h.
 */
struct thread_struct {
	unsigned long fsbase; /* x86_64: the thread's FS base, which glibc's pthread_self() is */
} __attribute__((preserve_access_index));

/*
 * A pending uretprobe of the thread (kernel/events/uprobes.c): the return address at `stack` (the
 * sp at the function's entry) was replaced with the uprobes trampoline's; `orig_ret_vaddr` is the
 * real one. Newest first.
 */
struct return_instance {
	unsigned long stack;
	unsigned long orig_ret_vaddr;
	struct return_instance *next;
} __attribute__((preserve_access_index));

struct uprobe_task {
	struct return_instance *return_instances;
} __attribute__((preserve_access_index));

/* A process's address space: where exec put its program's code (the load bias applied). */
struct mm_struct {
	unsigned long start_code;
	unsigned long end_code;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	unsigned int in_iowait : 1; /* set by io_schedule() around a wait for I/O */
	struct thread_struct thread;
	struct uprobe_task *utask;
	struct mm_struct *mm;
} __attribute__((preserve_access_index));

/* Pending uretprobes whose return addresses are put back in a stack copy, at most. */
#define URETPROBE_FIXUPS 8

/*
 * The registers a task entered the kernel with (bpf_task_pt_regs): its user-mode state. The
 * kernel's own names (the uapi `struct pt_regs` of bpf_perf_event.h has others); CO-RE drops the
 * `___kernel` flavor suffix when it matches the type.
 */
struct pt_regs___kernel {
	unsigned long bp;
	unsigned long di;
	unsigned long orig_ax; /* in a system call: its number */
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* include/linux/sched.h: a task leaving the CPU for good. */
#define TASK_DEAD 0x80

/*
 * The lowest _PyInterpreterFrame.owner of a frame that runs no Python function: the C-stack
 * shim of 3.12 and 3.13 (FRAME_OWNED_BY_CSTACK = 3), 3.14's interpreter base frame (3) and
 * C-stack shim (4), 3.15's entry shim (FRAME_OWNED_BY_INTERPRETER = 3).
 */
#define PY_OWNED_BY_SHIM 3
/* Tag bits of a _PyStackRef (3.14+ f_executable); objects are 8-byte aligned in every version. */
#define PY_STACKREF_TAG_MASK 7ULL
/* Steps of the frame walk: every frame, plus one C-stack shim per interpreter call at most. */
#define PY_FRAME_LOOPS (2 * SPANPROF_MAX_PY_FRAMES + 1)
/* Thread states visited to find the sampled thread's. */
#define PY_THREAD_LOOPS 1024

/* Set by user space before load (EbpfLoader::override_global). */
const volatile __u32 follow_children = 0;
/*
 * User space drains the ring buffer on a timer; it is woken early only when more than this many
 * bytes wait, so a sample does not cost a wake-up of user space (half the ring by default).
 */
const volatile __u64 wakeup_bytes = 2 * 1024 * 1024;
/*
 * --unwind dwarf: bytes of user stack copied per sample (a multiple of 8, at most
 * SPANPROF_MAX_STACK_COPY), unwound in user space; 0 (--unwind fp): the kernel's frame-pointer
 * walk instead.
 */
const volatile __u32 stack_copy_bytes = 0;
/*
 * Off-CPU sampling (--event offcpu): a blocked interval of d ns, d >= offcpu_min_ns, is kept
 * with weight d when d >= offcpu_period_ns, else with probability d / period and weight period
 * (an unbiased estimate of the time blocked in each stack, at about the cost of on-CPU samples).
 */
const volatile __u64 offcpu_period_ns = 10101010;
const volatile __u64 offcpu_min_ns = 5000;
/* --event wall: the time targets' threads wait runnable (preempted) is summed per thread. */
const volatile __u32 offcpu_runnable = 0;

/* Processes to profile, by tgid. User space adds targets; on_fork adds their children. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_target);
} target_pids SEC(".maps");

/* Sized by user space (--ring-buffer-size); this is the default. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} samples SEC(".maps");

/* CPython processes among the targets: offsets and addresses, written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_py_proc);
} py_procs SEC(".maps");

/* Where CPython processes keep span contexts: written by user space once it found them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct spanprof_span_proc);
} span_procs SEC(".maps");

/*
 * Bytes of stack copied for a process, when not stack_copy_bytes: user space raises it for a
 * process whose stacks the default copy truncates. Copied on fork, dropped on exec and exit.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} stack_copy_sizes SEC(".maps");

/*
 * The PyThreadState found for a thread, checked before each use (it may have been freed); 0 when
 * the search found none (a C thread), which is trusted for PY_NO_THREAD_RETRY units.
 */
struct py_tstate {
	__u64 tstate;
	__u32 tgid;
	__u32 stamp; /* bpf_ktime_get_ns() >> 20 (units of ~1 ms) of a negative entry */
};

/*
 * A thread without a thread state is searched for again after ~16 ms. Short, because a thread
 * Python just started has its PyThreadState in the list before it binds it to its own id: a
 * long wait would hide its first Python frames (a test saw ~250 ms of them go).
 */
#define PY_NO_THREAD_RETRY 16

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
	__type(value, struct py_tstate);
} py_threads SEC(".maps");

/* A lookup that met a failed read or garbage (not "no span"): counted in SPANPROF_ERR_SPAN_READ. */
#define SPAN_FAULT (-1)
/* Bytes read at once by the span reading: a dict keys header, a str up to a UUID's end. */
#define SPAN_BUF 96
/* One read of a type object, from tp_basicsize through tp_dictoffset. */
#define TYPE_BLOCK 272
/* One read of a dict's keys object: header, indices and the first entries of a small table. */
#define KEYS_BLOCK 256
/* Probes of one dict lookup, levels of one HAMT lookup: both far beyond what real tables need. */
#define DICT_PROBES 32
#define HAMT_LEVELS 8
#define COLLISION_PAIRS 16

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
};

/*
 * SCRATCH_SLOTS scratches per CPU, at CPU * SCRATCH_SLOTS + slot: a plain array because a
 * per-CPU array's value is limited to 32 KiB and a sample with its stack copy is more. User space
 * sets max_entries to SCRATCH_SLOTS times the number of possible CPUs. The timer sample (slot 0)
 * may interrupt the sys_exit program (slot 1) or a uprobe program (slot 2); a perf event
 * program does not run inside another and a tracing program that would nest with itself is
 * skipped; a uprobe program may be preempted by another on its CPU (preemptible kernels), so
 * alloc_event takes slot 2 with a busy flag.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");


struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SPANPROF_ERR_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} errors SEC(".maps");

static __always_inline void count_error(__u32 code)
{
	__u64 *n = bpf_map_lookup_elem(&errors, &code);

	if (n)
		*n += 1;
}

/*
 * Scratch slots per CPU: the timer sample, the off-CPU sample the sys_exit program sends, and
 * the allocation sample of a uprobe.
 */
#define SCRATCH_CPU 0
#define SCRATCH_OFFCPU 1
#define SCRATCH_ALLOC 2
#define SCRATCH_SLOTS 3

/* Adds `ns` to a per-CPU counter of the errors map that holds a time, not a count. */
static __always_inline void count_ns(__u32 code, __u64 ns)
{
	__u64 *n = bpf_map_lookup_elem(&errors, &code);

	if (n)
		*n += ns;
}

static __always_inline struct scratch *get_scratch(__u32 slot)
{
	__u32 key = bpf_get_smp_processor_id() * SCRATCH_SLOTS + slot;

	return bpf_map_lookup_elem(&scratch, &key);
}

/* The scratch of a bpf_loop callback: its caller passes the slot (w->slot) as the context. */
static __always_inline struct scratch *loop_scratch(void *ctx)
{
	return get_scratch(ctx ? *(__u32 *)ctx : SCRATCH_CPU);
}

/* A u64 at a user-given offset of a buffer read from the target (0 if out of bounds). */
static __always_inline __u64 load_u64(const __u8 *buf, __u32 off, __u32 size)
{
	if (off > size - 8)
		return 0;
	return *(const __u64 *)(buf + off);
}

static __always_inline __u32 load_u32(const __u8 *buf, __u32 off, __u32 size)
{
	if (off > size - 4)
		return 0;
	return *(const __u32 *)(buf + off);
}

static __always_inline __u8 load_u8(const __u8 *buf, __u32 off, __u32 size)
{
	if (off > size - 1)
		return 0;
	return buf[off];
}

static __always_inline int read_ptr(__u64 *out, __u64 addr)
{
	return bpf_probe_read_user(out, sizeof(*out), (const void *)addr);
}

/* One step of the thread-state search: is w->frame the sampled thread's? */
static long py_thread_step(__u64 i, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	__u64 v = 0;

	if (!w || w->frame == 0)
		return 1;
	if (read_ptr(&v, w->frame + w->cfg.tstate_thread)) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 1;
	}
	if (v == w->want) {
		w->status = SPANPROF_PY_OK;
		return 1;
	}
	if (read_ptr(&v, w->frame + w->cfg.tstate_next)) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 1;
	}
	w->frame = v;
	return 0;
}

/* One step of the frame walk: records w->frame (unless it is a shim) and moves to its caller. */
static long py_frame_step(__u64 i, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	__u32 size, off, flags = 0, d, len, rel, version;
	__u64 page, rel64;
	__u64 code, ip, start, filename, name, table;
	struct spanprof_py_frame *f;
	__s32 lasti, first;

	if (!w || w->frame == 0)
		return 1;
	size = w->cfg.frame_size;
	if (size > SPANPROF_PY_FRAME_BLOCK)
		size = SPANPROF_PY_FRAME_BLOCK;
	/* A frame whose end wraps the address space is garbage. */
	if (w->frame + size < w->frame)
		goto fault;
	if (w->frame < w->win_base || w->frame + size > w->win_base + w->win_len) {
		/*
		 * Not in the window read last: read this frame, and with a window the bytes below it
		 * in its page, where the frames it was called from usually are (a page is mapped if
		 * the frame is, so the read does not fail for want of memory below).
		 */
		start = w->frame;
		if (w->cfg.frame_window) {
			page = w->frame & ~4095ULL;
			start = w->frame + size > page + SPANPROF_PY_WINDOW ?
					w->frame + size - SPANPROF_PY_WINDOW :
					page;
		}
		len = w->frame + size - start;
		if (len > SPANPROF_PY_WINDOW)
			len = SPANPROF_PY_WINDOW;
		if (bpf_probe_read_user(w->win, len, (const void *)start))
			goto fault;
		w->win_base = start;
		w->win_len = len;
	}
	rel64 = w->frame - w->win_base;
	if (rel64 + size > w->win_len || rel64 > SPANPROF_PY_WINDOW)
		goto fault;
	rel = (__u32)rel64;
	if (w->cfg.entry_kind == SPANPROF_PY_ENTRY_SHIM &&
	    load_u8(w->win, rel + w->cfg.frame_entry, SPANPROF_PY_WINDOW) >= PY_OWNED_BY_SHIM) {
		/* The frame recorded last was the first one this interpreter call ran. */
		if (w->n > 0) {
			off = w->py_base + (w->n - 1) * SPANPROF_PY_FRAME_SIZE;
			if (off > sizeof(w->s.stack) + sizeof(w->s.py) - SPANPROF_PY_FRAME_SIZE)
				return 1;
			f = (struct spanprof_py_frame *)((__u8 *)w->s.stack + off);
			f->flags |= SPANPROF_PY_FRAME_ENTRY;
		}
		goto next;
	}
	if (w->n >= SPANPROF_MAX_PY_FRAMES) {
		w->s.py_status |= SPANPROF_PY_TRUNCATED;
		return 1;
	}
	code = load_u64(w->win, rel + w->cfg.frame_code, SPANPROF_PY_WINDOW) &
	       ~PY_STACKREF_TAG_MASK;
	if (code == 0)
		goto fault;
	switch (w->cfg.instr_kind) {
	case SPANPROF_PY_INSTR_POINTER:
		ip = load_u64(w->win, rel + w->cfg.frame_instr, SPANPROF_PY_WINDOW);
		start = code + w->cfg.code_adaptive;
		/* Before its first instruction a frame points one code unit before the start. */
		ip = ip > start ? ip - start : 0;
		lasti = ip > 0x7fffffff ? 0x7fffffff : (__s32)ip;
		break;
	case SPANPROF_PY_INSTR_LASTI_UNITS:
		lasti = (__s32)load_u32(w->win, rel + w->cfg.frame_instr, SPANPROF_PY_WINDOW);
		lasti = lasti < 0 ? 0 : (lasti > 0x3fffffff ? 0x3fffffff : lasti) * 2;
		break;
	default:
		lasti = (__s32)load_u32(w->win, rel + w->cfg.frame_instr, SPANPROF_PY_WINDOW);
		lasti = lasti < 0 ? 0 : lasti;
		break;
	}
	if (w->cfg.entry_kind == SPANPROF_PY_ENTRY_EVERY_FRAME ||
	    (w->cfg.entry_kind == SPANPROF_PY_ENTRY_FIELD &&
	     load_u8(w->win, rel + w->cfg.frame_entry, SPANPROF_PY_WINDOW)))
		flags = SPANPROF_PY_FRAME_ENTRY;

	/*
	 * The check value of the code object. A frame holds a reference to its code, so while the
	 * thread is stopped the object cannot change: a frame of the same code as the frame just
	 * read (direct recursion) keeps the value read for that one.
	 */
	if (code != w->last_code) {
		size = w->cfg.code_size;
		if (size > SPANPROF_PY_CODE_BLOCK)
			size = SPANPROF_PY_CODE_BLOCK;
		if (bpf_probe_read_user(w->code, size, (const void *)(code + w->cfg.code_firstlineno)))
			goto fault;
		first = (__s32)load_u32(w->code, 0, SPANPROF_PY_CODE_BLOCK);
		name = filename = table = version = 0;
		if (w->cfg.code_version != SPANPROF_PY_NO_OFFSET) {
			/*
			 * 3.12+: co_version, bumped for every code object CPython creates, tells a new
			 * object at a reused address apart by itself: the read stops there.
			 */
			version = load_u32(w->code, w->cfg.code_version - w->cfg.code_firstlineno,
					   SPANPROF_PY_CODE_BLOCK);
		} else {
			d = w->cfg.code_filename - w->cfg.code_firstlineno;
			filename = load_u64(w->code, d, SPANPROF_PY_CODE_BLOCK);
			d = w->cfg.code_name - w->cfg.code_firstlineno;
			name = load_u64(w->code, d, SPANPROF_PY_CODE_BLOCK);
			if (bpf_probe_read_user(w->name, sizeof(w->name),
						(const void *)(name + w->cfg.name_hash)))
				goto fault;
			d = w->cfg.name_data - w->cfg.name_hash;
			name = SPANPROF_PY_NAME(load_u64(w->name, 0, SPANPROF_PY_NAME_READ),
						load_u64(w->name, d, SPANPROF_PY_NAME_READ),
						load_u64(w->name, d + 8, SPANPROF_PY_NAME_READ));
			d = w->cfg.code_linetable - w->cfg.code_firstlineno;
			table = load_u64(w->code, d, SPANPROF_PY_CODE_BLOCK);
		}
		w->last_check = SPANPROF_PY_CHECK(name, filename, first, table, version);
	}

	off = w->py_base + w->n * SPANPROF_PY_FRAME_SIZE;
	if (off > sizeof(w->s.stack) + sizeof(w->s.py) - SPANPROF_PY_FRAME_SIZE)
		return 1;
	f = (struct spanprof_py_frame *)((__u8 *)w->s.stack + off);
	f->code = code;
	f->check = w->last_check;
	f->instr = (__u32)lasti;
	f->flags = flags;
	w->n++;
next:
	code = load_u64(w->win, rel + w->cfg.frame_previous, SPANPROF_PY_WINDOW);
	if (code == w->frame) {
		w->s.py_status |= SPANPROF_PY_TRUNCATED;
		return 1;
	}
	w->frame = code;
	return 0;
fault:
	w->s.py_status = SPANPROF_PY_READ_FAILED | SPANPROF_PY_TRUNCATED;
	return 1;
}

/*
 * The sampled thread's PyThreadState: the cached one if it still names this thread, else a
 * search of the interpreter's thread list. 0 when there is none (or a read failed).
 */
static __always_inline __u64 py_thread_state(struct scratch *w, __u32 tgid, __u32 tid)
{
	struct py_tstate *cached, fresh = {};
	__u32 stamp = (__u32)(bpf_ktime_get_ns() >> 20);
	__u64 v = 0, interp = 0;

	if (w->cfg.tstate_match == SPANPROF_PY_MATCH_NATIVE_TID) {
		w->want = tid;
	} else {
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();

		w->want = BPF_CORE_READ(task, thread.fsbase);
	}
	cached = bpf_map_lookup_elem(&py_threads, &tid);
	if (cached && cached->tgid == tgid) {
		if (cached->tstate == 0 && stamp - cached->stamp < PY_NO_THREAD_RETRY) {
			w->status = SPANPROF_PY_NO_THREAD;
			return 0;
		}
		if (cached->tstate && !read_ptr(&v, cached->tstate + w->cfg.tstate_thread) &&
		    v == w->want)
			return cached->tstate;
	}

	if (read_ptr(&interp, w->cfg.runtime_addr + w->cfg.runtime_interp_head) ||
	    (interp && read_ptr(&w->frame, interp + w->cfg.interp_threads_head))) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 0;
	}
	/* No interpreter yet (start-up) or any more (finalization): no thread state either. */
	w->status = SPANPROF_PY_NO_THREAD;
	if (!interp)
		return 0;
	{
		__u32 slot = w->slot;

		bpf_loop(PY_THREAD_LOOPS, py_thread_step, &slot, 0);
	}
	fresh.tgid = tgid;
	if (w->status != SPANPROF_PY_OK) {
		/*
		 * Searched to the end of the list: remember there is none, for a while. (A list
		 * longer than the search is not remembered: the next sample searches again.)
		 */
		if (w->status == SPANPROF_PY_NO_THREAD && w->frame == 0) {
			fresh.stamp = stamp;
			bpf_map_update_elem(&py_threads, &tid, &fresh, BPF_ANY);
		}
		return 0;
	}
	fresh.tstate = w->frame;
	bpf_map_update_elem(&py_threads, &tid, &fresh, BPF_ANY);
	return fresh.tstate;
}

/* Appends the Python frames of the sampled thread after the `native` native frames. */
static __always_inline void py_walk(struct scratch *w, const struct spanprof_py_proc *cfg,
				    __u32 tgid, __u32 tid, __u64 native)
{
	__u64 tstate, frame = 0;

	w->cfg = *cfg;
	w->n = 0;
	w->last_code = 0;
	w->win_base = 0;
	w->win_len = 0;
	w->py_base = native * sizeof(__u64);
	tstate = py_thread_state(w, tgid, tid);
	w->tstate = tstate;
	if (!tstate) {
		w->s.py_status = w->status;
		if (w->status == SPANPROF_PY_READ_FAILED)
			count_error(SPANPROF_ERR_PY_READ);
		return;
	}
	w->s.py_status = SPANPROF_PY_OK;
	if (read_ptr(&frame, tstate + w->cfg.tstate_frame))
		goto fault;
	if (frame && w->cfg.cframe_current != SPANPROF_PY_NO_OFFSET &&
	    read_ptr(&frame, frame + w->cfg.cframe_current))
		goto fault;
	w->frame = frame;
	{
		__u32 slot = w->slot;

		bpf_loop(PY_FRAME_LOOPS, py_frame_step, &slot, 0);
	}
	/* Steps ran out with frames left: a cycle, or shims beyond the bound. */
	if (w->frame && !(w->s.py_status & SPANPROF_PY_TRUNCATED))
		w->s.py_status |= SPANPROF_PY_TRUNCATED;
	w->s.py_len = w->n;
	if ((w->s.py_status & SPANPROF_PY_STATUS_MASK) == SPANPROF_PY_READ_FAILED)
		count_error(SPANPROF_ERR_PY_READ);
	return;
fault:
	w->s.py_status = SPANPROF_PY_READ_FAILED;
	count_error(SPANPROF_ERR_PY_READ);
}

/*
 * Span context. Everything below reads objects of the target's tracing libraries, found by user
 * space (span_procs), while the thread is stopped: OpenTelemetry's current span through the
 * thread's contextvars Context, OSProfiler's trace stack through its threading.local. Lookups
 * follow CPython's own algorithms (dict probing, HAMT levels), bounded, comparing keys by
 * identity (the interned names and the key objects user space found).
 */

/* Py_TPFLAGS_* (Include/object.h). */
#define PY_TPFLAGS_INLINE_VALUES (1ULL << 2)
#define PY_TPFLAGS_MANAGED_DICT (1ULL << 4)
/* Python/hamt.c: node layouts (the same in 3.8–3.13). */
#define HAMT_NODE_SIZE 16	/* ob_size (bitmap, collision nodes) */
#define HAMT_BITMAP 24		/* b_bitmap (u32) */
#define HAMT_BITMAP_ARRAY 32	/* b_array: key, value pairs */
#define HAMT_ARRAY_ARRAY 16	/* a_array[32] of nodes */
#define HAMT_COLLISION_ARRAY 32 /* c_array: key, value pairs; ob_size counts slots */
/* A compact str's state bits (Include/cpython/unicodeobject.h). */
#define PY_STR_COMPACT_ASCII (3U << 5)
#define PY_STR_LENGTH 16
#define PY_STR_STATE 32
#define PY_UUID_LEN 36
/* Modules/_collectionsmodule.c: deque and block layouts (3.8–3.13). */
#define DEQUE_SIZE 16
#define DEQUE_LEFTBLOCK 24 /* then rightblock, leftindex, rightindex */
#define DEQUE_BLOCKLEN 64
#define DEQUE_BLOCK_DATA 8 /* after leftlink */
/* Items of a trace stack read at once (a power of two). */
#define DEQUE_ITEMS 8
/* Objects: ob_type; a tuple's items; a PyLong's size or tag, then its 30-bit digits. */
#define PY_OB_TYPE 8
#define PY_LONG_SIZE 16
#define PY_LONG_DIGITS 24
#define PY_LONG_SHIFT 30
/* PyContextVar: var_cached, var_cached_tsid, var_cached_tsver (Include/internal/pycore_context.h). */
#define CONTEXTVAR_CACHED 32
/* A threading.local's dummy (<=3.12): its dict after PyObject_HEAD (Modules/_threadmodule.c). */
#define PY_LOCALDUMMY_DICT 16

static __always_inline __u64 span_u64(struct scratch *w, __u32 off)
{
	return load_u64(w->buf, off, SPAN_BUF);
}

/*
 * Reads 8 or 16 bytes of a keys object: from the block read with its header when they are in
 * it, else from the target.
 */
static __always_inline int keys_read(struct scratch *w, __u64 addr, __u64 *out, __u32 len)
{
	__u64 off = addr - w->kbase;

	if (addr >= w->kbase && off <= KEYS_BLOCK - 16 && off + len <= w->klen) {
		out[0] = load_u64(w->kblock, (__u32)off, KEYS_BLOCK);
		if (len > 8)
			out[1] = load_u64(w->kblock, (__u32)off + 8, KEYS_BLOCK);
		return 0;
	}
	return bpf_probe_read_user(out, len > 8 ? 16 : 8, (const void *)addr);
}

/* One probe of a dict lookup (CPython's open addressing: i = i*5 + perturb + 1). */
static long dict_probe_step(__u64 n, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 v = 0, kv[2] = {};
	__s64 ix;

	if (!w)
		return 1;
	q = &w->q;
	if (keys_read(w, q->index + q->i * q->width, &v, 8)) {
		q->status = SPAN_FAULT;
		return 1;
	}
	switch (q->width) {
	case 1:
		ix = (__s8)v;
		break;
	case 2:
		ix = (__s16)v;
		break;
	case 4:
		ix = (__s32)v;
		break;
	default:
		ix = (__s64)v;
		break;
	}
	if (ix == -1) /* DKIX_EMPTY: the key is not in the table */
		return 1;
	if (ix >= 0 && ix < q->nentries) {
		if (keys_read(w, q->entries + (__u64)ix * q->esize + q->koff, kv, 16)) {
			q->status = SPAN_FAULT;
			return 1;
		}
		if (kv[0] == q->key) {
			if (q->values && read_ptr(&kv[1], q->values + (__u64)ix * 8)) {
				q->status = SPAN_FAULT;
				return 1;
			}
			q->result = kv[1];
			q->status = 1;
			return 1;
		}
	}
	q->perturb >>= 5;
	q->i = (q->i * 5 + q->perturb + 1) & q->mask;
	return 0;
}

/*
 * The value under `key` (compared by identity; `hash` its hash) in the keys object already read
 * into w->kblock (at w->kbase), with split `values` (0 for a combined table). 0 when absent;
 * SPAN_FAULT in w->q.status on garbage.
 */
static __always_inline __u64 keys_find(struct scratch *w, __u64 values, __u64 key, __u64 hash)
{
	struct lookup *q = &w->q;
	__u64 size, index_bytes, keys = w->kbase;
	__u32 log2, log2_index, kind;

	q->status = SPAN_FAULT;
	q->result = 0;
	__builtin_memcpy(w->buf, w->kblock, 40);
	if (w->scfg.dict_kind == SPANPROF_DICT_SIZE) {
		/* dk_refcnt, dk_size, dk_lookup, dk_usable, dk_nentries, dk_indices */
		size = span_u64(w, 8);
		if (size < 8 || size > (1ULL << 30) || (size & (size - 1)))
			return 0;
		q->width = size <= 0xff ? 1 : size <= 0xffff ? 2 : 4;
		q->nentries = (__u32)span_u64(w, 32);
		q->index = keys + 40;
		q->entries = q->index + size * q->width;
		q->esize = 24;
		q->koff = 8;
	} else {
		/* dk_refcnt, dk_log2_size, dk_log2_index_bytes, dk_kind, .., dk_nentries@24 */
		log2 = w->buf[8];
		log2_index = w->buf[9];
		kind = w->buf[10];
		if (log2 < 3 || log2 > 30 || log2_index < log2 || log2_index > log2 + 3)
			return 0;
		size = 1ULL << log2;
		index_bytes = 1ULL << log2_index;
		q->width = (__u32)(index_bytes >> log2);
		q->nentries = (__u32)span_u64(w, 24);
		q->index = keys + 32;
		q->entries = q->index + index_bytes;
		/* DICT_KEYS_GENERAL (0) entries carry the hash; unicode ones do not. */
		q->esize = kind == 0 ? 24 : 16;
		q->koff = kind == 0 ? 8 : 0;
	}
	if (q->nentries > size)
		return 0;
	q->values = values ? values + w->scfg.dict_values : 0;
	q->key = key;
	q->hash = hash;
	q->mask = size - 1;
	q->i = hash & q->mask;
	q->perturb = hash;
	q->status = 0;
	{
		__u32 slot = w->slot;

		bpf_loop(DICT_PROBES, dict_probe_step, &slot, 0);
	}
	return q->status == 1 ? q->result : 0;
}

/* keys_find in the keys object `keys`, read first. */
static __always_inline __u64 keys_get(struct scratch *w, __u64 keys, __u64 values, __u64 key,
				      __u64 hash)
{
	w->q.status = SPAN_FAULT;
	w->q.result = 0;
	w->attrs_obj = 0;
	if (!keys)
		return 0;
	/*
	 * The header with what follows it: a small table's indices and entries come in the same
	 * read. A keys object that ends near the end of a mapping takes the header alone.
	 */
	w->kbase = keys;
	w->kvalues = values;
	w->klen = KEYS_BLOCK;
	if (bpf_probe_read_user(w->kblock, KEYS_BLOCK, (const void *)keys)) {
		w->klen = 40;
		if (bpf_probe_read_user(w->kblock, 40, (const void *)keys))
			return 0;
	}
	return keys_find(w, values, key, hash);
}

/* dict[key] for a dict object (a subclass too: the dict part comes first). */
static __always_inline __u64 dict_get(struct scratch *w, __u64 dict, __u64 key, __u64 hash)
{
	__u64 kv[2] = {}; /* ma_keys, ma_values */

	if (!dict || bpf_probe_read_user(kv, sizeof(kv), (const void *)(dict + 32))) {
		w->q.status = SPAN_FAULT;
		return 0;
	}
	return keys_get(w, kv[0], kv[1], key, hash);
}

/* obj.name for an instance attribute (from the instance's dict or values), or 0. */
static __always_inline __u64 attr_lookup(struct scratch *w, __u64 obj, __u64 name, __u64 hash)
{
	__u64 type = 0, flags, v = 0, keys = 0, pre[2] = {}, tlen;
	__u32 first = w->scfg.type_basicsize, last = w->scfg.type_dictoffset;
	__s64 off = 0;
	__u8 valid = 0;

	w->q.status = SPAN_FAULT;
	/* tp_basicsize, tp_flags and tp_dictoffset in one read of the type object. */
	if (last < first || w->scfg.type_flags < first || w->scfg.type_flags > last)
		return 0;
	tlen = (__u64)last + 8 - first;
	asm volatile("" : "+r"(tlen)); /* the bound is checked on the register used */
	if (tlen > TYPE_BLOCK)
		return 0;
	if (!obj || read_ptr(&type, obj + PY_OB_TYPE) || !type ||
	    bpf_probe_read_user(w->tblock, tlen, (const void *)(type + first)))
		return 0;
	flags = load_u64(w->tblock, w->scfg.type_flags - first, TYPE_BLOCK);
	if (w->scfg.attr_kind == SPANPROF_ATTR_DICTOFFSET || !(flags & PY_TPFLAGS_MANAGED_DICT)) {
		off = (__s64)load_u64(w->tblock, last - first, TYPE_BLOCK);
		if (off <= 0 || off > 4096 || read_ptr(&v, obj + off))
			return 0;
		return dict_get(w, v, name, hash);
	}
	/* A managed dict: the pre-header before the object holds the dict or the values. */
	if (bpf_probe_read_user(pre, sizeof(pre), (const void *)(obj - 32)))
		return 0;
	switch (w->scfg.attr_kind) {
	case SPANPROF_ATTR_MANAGED: /* 3.11: values at -32, dict at -24 */
		if (pre[1])
			return dict_get(w, pre[1], name, hash);
		v = pre[0];
		break;
	case SPANPROF_ATTR_TAGGED: /* 3.12: -24 holds the dict, or the values' address - 1 */
		if (!(pre[1] & 1))
			return pre[1] ? dict_get(w, pre[1], name, hash) : 0;
		v = pre[1] + 1;
		break;
	default: /* 3.13: dict at -24, else values inline after the object */
		if (pre[1])
			return dict_get(w, pre[1], name, hash);
		off = (__s64)load_u64(w->tblock, 0, TYPE_BLOCK);
		if (!(flags & PY_TPFLAGS_INLINE_VALUES) || off <= 0 || off > 4096)
			return 0;
		v = obj + off;
		/* PyDictValues.valid: 0 once the values moved to a dict. */
		if (bpf_probe_read_user(&valid, 1, (const void *)(v + 3)) || !valid)
			return 0;
		break;
	}
	if (!v || read_ptr(&keys, type + w->scfg.type_cached_keys))
		return 0;
	return keys_get(w, keys, v, name, hash);
}

/* attr_lookup, noting whose attributes' keys are left in w->kblock when it found the name. */
static __always_inline __u64 getattr(struct scratch *w, __u64 obj, __u64 name, __u64 hash)
{
	__u64 v = attr_lookup(w, obj, name, hash);

	if (v)
		w->attrs_obj = obj;
	return v;
}

#define HAMT_BITMAP_NODE 1
#define HAMT_ARRAY_NODE 2
#define HAMT_COLLISION_NODE 3
/* The first 8 bytes of the node types' tp_name, little-endian: "hamt_bit", "hamt_arr", "hamt_col". */
#define HAMT_NAME_BITMAP 0x7469625f746d6168ULL
#define HAMT_NAME_ARRAY 0x7272615f746d6168ULL
#define HAMT_NAME_COLLISION 0x6c6f635f746d6168ULL
#define PY_TYPE_NAME 24 /* offsetof(PyTypeObject, tp_name) */

/*
 * Which HAMT node `type` is: by the addresses of the node types when user space found them in
 * the symbol table, else by the type's name (stripped interpreters). 0: not a HAMT node.
 */
static __always_inline __u32 hamt_kind(struct scratch *w, __u64 type)
{
	__u64 name = 0, text = 0;

	if (type == w->scfg.hamt_bitmap_type)
		return HAMT_BITMAP_NODE;
	if (type == w->scfg.hamt_array_type)
		return HAMT_ARRAY_NODE;
	if (type == w->scfg.hamt_collision_type)
		return HAMT_COLLISION_NODE;
	if (read_ptr(&name, type + PY_TYPE_NAME) || read_ptr(&text, name))
		return 0;
	switch (text) {
	case HAMT_NAME_BITMAP:
		return HAMT_BITMAP_NODE;
	case HAMT_NAME_ARRAY:
		return HAMT_ARRAY_NODE;
	case HAMT_NAME_COLLISION:
		return HAMT_COLLISION_NODE;
	}
	return 0;
}

/* One level of a HAMT lookup (Python/hamt.c: 5 bits of the hash per level). */
static long hamt_step(__u64 n, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 hdr[4] = {}, kv[2] = {}, type, node = 0;
	__u32 bitmap, bit, idx, slots, i, kind;

	if (!w)
		return 1;
	q = &w->q;
	q->status = SPAN_FAULT;
	if (!q->node || q->shift > 30 ||
	    bpf_probe_read_user(hdr, sizeof(hdr), (const void *)q->node))
		return 1;
	type = hdr[1];
	idx = (__u32)(q->hash >> q->shift) & 31;
	kind = hamt_kind(w, type);
	if (kind == HAMT_BITMAP_NODE) {
		bitmap = (__u32)hdr[3];
		bit = 1U << idx;
		q->status = 0;
		if (!(bitmap & bit))
			return 1;
		idx = __builtin_popcount(bitmap & (bit - 1));
		if (bpf_probe_read_user(kv, sizeof(kv),
					(const void *)(q->node + HAMT_BITMAP_ARRAY + idx * 16))) {
			q->status = SPAN_FAULT;
			return 1;
		}
		if (kv[0] == 0) { /* a sub-node */
			q->node = kv[1];
			q->shift += 5;
			return 0;
		}
		if (kv[0] == q->key) {
			q->result = kv[1];
			q->status = 1;
		}
		return 1;
	}
	if (kind == HAMT_ARRAY_NODE) {
		if (read_ptr(&node, q->node + HAMT_ARRAY_ARRAY + idx * 8))
			return 1;
		q->status = 0;
		q->node = node;
		q->shift += 5;
		return node ? 0 : 1;
	}
	if (kind == HAMT_COLLISION_NODE) {
		slots = (__u32)hdr[2];
		q->status = 0;
		for (i = 0; i < COLLISION_PAIRS; i++) {
			if (2 * i + 1 >= slots)
				break;
			if (bpf_probe_read_user(kv, sizeof(kv),
						(const void *)(q->node + HAMT_COLLISION_ARRAY + i * 16))) {
				q->status = SPAN_FAULT;
				return 1;
			}
			if (kv[0] == q->key) {
				q->result = kv[1];
				q->status = 1;
				return 1;
			}
		}
		return 1;
	}
	return 1; /* not a HAMT node: garbage */
}

/* The value of `key` in the HAMT whose root node is `root`, or 0. */
static __always_inline __u64 hamt_get(struct scratch *w, __u64 root, __u64 key, __u32 hash)
{
	struct lookup *q = &w->q;

	q->node = root;
	q->key = key;
	q->hash = hash;
	q->shift = 0;
	q->result = 0;
	q->status = SPAN_FAULT;
	{
		__u32 slot = w->slot;

		bpf_loop(HAMT_LEVELS, hamt_step, &slot, 0);
	}
	return q->status == 1 ? q->result : 0;
}

/* A non-negative int of at most `bytes` (8 or 16) bytes, stored big-endian at `out`. */
static __always_inline int read_int(struct scratch *w, __u64 obj, __u8 *out, __u32 bytes)
{
	struct {
		__u64 size;
		__u32 d[6];
	} v = {};
	__u64 hi, lo, len;
	__u32 ndigits;

	/*
	 * The size and 5 digits in one read: a 128-bit id has 5, and a shorter int's object is
	 * rounded up to a 16-byte allocation, so the read rarely passes the end of a mapping; when
	 * it does, the size first, then only the digits it says.
	 */
	if (bpf_probe_read_user(&v, 8 + 5 * sizeof(__u32), (const void *)(obj + PY_LONG_SIZE))) {
		if (read_ptr(&v.size, obj + PY_LONG_SIZE))
			return SPAN_FAULT;
		v.d[0] = 0xffffffff; /* not read yet */
	}
	if (w->scfg.long_kind == SPANPROF_LONG_TAG) {
		if ((v.size & 3) == 2) /* negative */
			return SPAN_FAULT;
		ndigits = (__u32)(v.size >> 3);
	} else {
		if ((__s64)v.size < 0)
			return SPAN_FAULT;
		ndigits = (__u32)v.size;
	}
	/* 128 bits take 5 digits of 30 bits; 64 bits take 3. */
	if (ndigits > (bytes == 16 ? 5 : 3))
		return SPAN_FAULT;
	if (v.d[0] == 0xffffffff) { /* a digit has 30 bits: the read above failed */
		__builtin_memset(v.d, 0, sizeof(v.d));
		len = (__u64)ndigits * sizeof(__u32);
		/* Opaque to the compiler, so the bound below is checked on the register used. */
		asm volatile("" : "+r"(len));
		if (len > 5 * sizeof(__u32))
			return SPAN_FAULT;
		if (len && bpf_probe_read_user(v.d, len, (const void *)(obj + PY_LONG_DIGITS)))
			return SPAN_FAULT;
	}
	/* Digits past ndigits belong to the next object. */
	if (ndigits < 5)
		v.d[4] = 0;
	if (ndigits < 4)
		v.d[3] = 0;
	if (ndigits < 3)
		v.d[2] = 0;
	if (ndigits < 2)
		v.d[1] = 0;
	if (ndigits < 1)
		v.d[0] = 0;
	lo = (__u64)v.d[0] | (__u64)v.d[1] << 30 | (__u64)v.d[2] << 60;
	hi = (__u64)v.d[2] >> 4 | (__u64)v.d[3] << 26 | (__u64)v.d[4] << 56;
	if (bytes == 8) {
		if (hi)
			return SPAN_FAULT;
		*(__u64 *)out = __builtin_bswap64(lo);
		return 0;
	}
	*(__u64 *)out = __builtin_bswap64(hi);
	*(__u64 *)(out + 8) = __builtin_bswap64(lo);
	return 0;
}

static __always_inline int hex_nibble(__u8 c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The UUID text (8-4-4-4-12 hex digits) at `at` in `buf` (of `size` bytes), into 16 bytes. */
static __always_inline int parse_uuid(const __u8 *buf, __u32 size, __u32 at, __u8 *out)
{
	__u32 i, j = 0;
	int hi, lo;

	for (i = 0; i < PY_UUID_LEN; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (load_u8(buf, at + i, size) != '-')
				return SPAN_FAULT;
			continue;
		}
		hi = hex_nibble(load_u8(buf, at + i, size));
		i++;
		lo = hex_nibble(load_u8(buf, at + i, size));
		if (hi < 0 || lo < 0 || j >= 16)
			return SPAN_FAULT;
		out[j++] = (__u8)(hi << 4 | lo);
	}
	return 0;
}

/* A str holding a UUID, parsed into 16 bytes at `out`. */
static __always_inline int read_uuid(struct scratch *w, __u64 str, __u8 *out)
{
	__u32 data = w->scfg.str_data, len;

	if (data < PY_STR_STATE + 4 || data > SPAN_BUF - PY_UUID_LEN + PY_STR_LENGTH)
		return SPAN_FAULT;
	/* From the length to the end of 36 characters: no byte past the object. */
	len = data - PY_STR_LENGTH + PY_UUID_LEN;
	if (!str || len > SPAN_BUF ||
	    bpf_probe_read_user(w->buf, len, (const void *)(str + PY_STR_LENGTH)))
		return SPAN_FAULT;
	if (span_u64(w, 0) != PY_UUID_LEN ||
	    (load_u32(w->buf, PY_STR_STATE - PY_STR_LENGTH, SPAN_BUF) & PY_STR_COMPACT_ASCII) !=
		    PY_STR_COMPACT_ASCII)
		return SPAN_FAULT;
	return parse_uuid(w->buf, SPAN_BUF, data - PY_STR_LENGTH, out);
}

/* OTEP 4947 record: trace_id[16] span_id[8] valid trace_flags attrs_size:u16, then attrs. */
#define CTX_RECORD_HEADER 28
#define CTX_VALID 24
#define CTX_ATTRS_SIZE 26
/* Attribute bytes read at most, and entries looked at (key:u8 len:u8 value[len] each). */
#define CTX_ATTRS_READ 256
#define CTX_ATTRS_ENTRIES 8
/* glibc x86_64: tcbhead_t.dtv, at FS base + 8; 16-byte DTV entries; an unallocated block. */
#define TCB_DTV 8
#define DTV_ENTRY 16
#define DTV_UNALLOCATED ((__u64)-1)

/* spanprof.python_context: the address of the thread's PyContext, 16 hex digits. */
#define CTX_PY_CONTEXT_LEN 16

/* 16 hex digits at `at` in w->win (garbage digits give garbage, never a fault). */
static __always_inline __u64 parse_hex64(const __u8 *buf, __u32 at)
{
	__u64 v = 0;
	__u32 i;
	int d;

	for (i = 0; i < CTX_PY_CONTEXT_LEN; i++) {
		d = hex_nibble(load_u8(buf, at + i, SPANPROF_PY_WINDOW));
		v = v << 4 | (__u64)(d < 0 ? 0 : d);
	}
	return v;
}

/*
 * One attribute of a thread context record (in w->win; w->q.i the offset, w->q.nentries the
 * size): an OSProfiler id is parsed into w->span, and its bit set in w->q.status (1 base,
 * 2 trace point, 4 parent); the Python context into w->q.result (bit 8). A key repeated: the
 * last one wins, as OTEP 4947 says.
 */
static long ctx_attr_step(__u64 n, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	__u32 off, key, len, size;
	__u8 *out = 0;
	int bit = 0;

	if (!w)
		return 1;
	off = (__u32)w->q.i;
	size = w->q.nentries;
	if (off + 2 > size || size > CTX_ATTRS_READ)
		return 1;
	key = load_u8(w->win, off, SPANPROF_PY_WINDOW);
	len = load_u8(w->win, off + 1, SPANPROF_PY_WINDOW);
	off += 2;
	if (off + len > size)
		return 1;
	w->q.i = off + len;
	if (key == SPANPROF_NO_KEY)
		return 0;
	if (key == w->scfg.osp_keys[3] && len == CTX_PY_CONTEXT_LEN) {
		w->q.result = parse_hex64(w->win, off);
		w->q.status |= 8;
		return 0;
	}
	if (len != PY_UUID_LEN)
		return 0;
	if (key == w->scfg.osp_keys[0]) {
		out = w->span.osp_base;
		bit = 1;
	} else if (key == w->scfg.osp_keys[1]) {
		out = w->span.osp_current;
		bit = 2;
	} else if (key == w->scfg.osp_keys[2]) {
		out = w->span.osp_parent;
		bit = 4;
	}
	if (out && !parse_uuid(w->win, SPANPROF_PY_WINDOW, off, out))
		w->q.status |= bit;
	return 0;
}

/*
 * The thread context record the process publishes for this thread (OTEP 4947), if any: its
 * OpenTelemetry ids, and the OSProfiler ids among its attributes.
 */
static __always_inline int published_ctx(struct scratch *w)
{
	const struct spanprof_span_proc *c = &w->scfg;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 fs = BPF_CORE_READ(task, thread.fsbase), addr, rec = 0, dtv = 0, block = 0, len = 0;
	__u32 size, found, otel;
	__u64 ctx = 0;

	if (c->tls_kind == SPANPROF_TLS_STATIC) {
		addr = fs + c->tls_offset;
	} else {
		if (read_ptr(&dtv, fs + TCB_DTV) || !dtv || read_ptr(&len, dtv - DTV_ENTRY))
			return SPAN_FAULT;
		/*
		 * dtv[-1] counts the slots: a thread whose DTV predates the module's dlopen has no
		 * slot for it yet (its first access of the module's TLS makes one).
		 */
		if (c->tls_module > len)
			return 0;
		if (read_ptr(&block, dtv + c->tls_module * DTV_ENTRY))
			return SPAN_FAULT;
		/* The thread never touched the module's TLS: nothing published. */
		if (block < 4096 || block == DTV_UNALLOCATED)
			return 0;
		addr = block + c->tls_offset;
	}
	if (read_ptr(&rec, addr))
		return SPAN_FAULT;
	if (!rec)
		return 0;
	if (bpf_probe_read_user(w->buf, CTX_RECORD_HEADER, (const void *)rec))
		return SPAN_FAULT;
	if (w->buf[CTX_VALID] != 1) /* being written, or not valid */
		return 0;
	otel = (span_u64(w, 0) | span_u64(w, 8)) != 0;
	if (otel) {
		__builtin_memcpy(w->span.trace_id, w->buf, 16);
		__builtin_memcpy(w->span.span_id, w->buf + 16, 8);
	}
	size = load_u32(w->buf, CTX_ATTRS_SIZE, SPAN_BUF) & 0xffff;
	found = 0;
	if (size && (c->osp_keys[1] != SPANPROF_NO_KEY || c->osp_keys[3] != SPANPROF_NO_KEY)) {
		if (size > CTX_ATTRS_READ)
			size = CTX_ATTRS_READ;
		if (bpf_probe_read_user(w->win, size, (const void *)(rec + CTX_RECORD_HEADER)))
			return SPAN_FAULT;
		w->q.i = 0;
		w->q.nentries = size;
		w->q.status = 0;
		w->q.result = 0;
		{
			__u32 slot = w->slot;

			bpf_loop(CTX_ATTRS_ENTRIES, ctx_attr_step, &slot, 0);
		}
		found = (__u32)w->q.status;
	}
	/*
	 * The OpenTelemetry ids belong to the Python context they were published in: a thread now
	 * in another one (an asyncio task switch, Context.run) has moved on without the publisher
	 * knowing, and the span is read from the interpreter instead.
	 */
	if (otel && (found & 8) && w->tstate &&
	    (read_ptr(&ctx, w->tstate + c->tstate_context) || ctx != w->q.result))
		otel = 0;
	if (otel)
		w->span.flags |= SPANPROF_SPAN_OTEL | SPANPROF_SPAN_PUBLISHED;
	if ((found & 3) == 3) {
		w->span.flags |= SPANPROF_SPAN_OSP | SPANPROF_SPAN_PUBLISHED;
		if (found & 4)
			w->span.flags |= SPANPROF_SPAN_OSP_PARENT;
	}
	return 0;
}

/* OpenTelemetry's current span of the thread: Context[span key]._context, a SpanContext. */
static __always_inline int otel_span(struct scratch *w, __u64 tstate)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, ids[2] = {}, ts[3] = {}, var[3] = {}, again[3] = {};

	/* PyThreadState: context, context_ver, id; PyContextVar: var_cached, _tsid, _tsver. */
	if (bpf_probe_read_user(ts, sizeof(ts), (const void *)(tstate + c->tstate_context)) ||
	    bpf_probe_read_user(var, sizeof(var), (const void *)(c->otel_var + CONTEXTVAR_CACHED)))
		return SPAN_FAULT;
	if (!ts[0]) /* the thread never used contextvars */
		return 0;
	/*
	 * The value the ContextVar cached for this thread at this version of its context, which
	 * CPython's own ContextVar.get() returns: no HAMT walk. Another thread (holding the GIL
	 * while this one may not) can be rewriting the three fields: they are read again, and used
	 * only if nothing changed in between.
	 */
	if (var[0] && var[1] == ts[2] && var[2] == ts[1] &&
	    !bpf_probe_read_user(again, sizeof(again),
				 (const void *)(c->otel_var + CONTEXTVAR_CACHED)) &&
	    again[0] == var[0] && again[1] == var[1] && again[2] == var[2]) {
		v = var[0];
	} else {
		if (read_ptr(&v, ts[0] + c->context_vars) || !v || read_ptr(&v, v + c->hamt_root))
			return SPAN_FAULT;
		v = hamt_get(w, v, c->otel_var, c->otel_var_hash);
		if (!v) /* the thread never set OpenTelemetry's context */
			return w->q.status;
	}
	v = dict_get(w, v, c->otel_key, c->otel_key_hash);
	if (!v) /* no current span */
		return w->q.status;
	w->name_obj[0] = v;
	v = getattr(w, v, c->context_name, c->context_name_hash);
	if (!v || bpf_probe_read_user(ids, sizeof(ids), (const void *)(v + c->tuple_items)))
		return SPAN_FAULT;
	if (read_int(w, ids[0], w->span.trace_id, 16) || read_int(w, ids[1], w->span.span_id, 8))
		return SPAN_FAULT;
	/* INVALID_SPAN's zero ids: not a span. */
	if (!load_u64(w->span.span_id, 0, 8) ||
	    !(load_u64(w->span.trace_id, 0, 16) | load_u64(w->span.trace_id, 8, 16)))
		return 0;
	w->span.flags |= SPANPROF_SPAN_OTEL;
	return 0;
}

/* The str at position `i` of a deque, given its first block and first index. */
static __always_inline __u64 deque_item(__u64 block, __u64 first, __u64 i)
{
	__u64 v = 0, pos = first + i;

	/* Trace stacks are short: follow at most one block link. */
	if (pos >= DEQUE_BLOCKLEN) {
		if (read_ptr(&block, block + 8 + DEQUE_BLOCKLEN * 8) || !block)
			return 0;
		pos -= DEQUE_BLOCKLEN;
		if (pos >= DEQUE_BLOCKLEN)
			return 0;
	}
	if (read_ptr(&v, block + DEQUE_BLOCK_DATA + pos * 8))
		return 0;
	return v;
}

/* OSProfiler's trace stack of the thread: base id first, the current trace point last. */
static __always_inline int osp_trace(struct scratch *w, __u64 tstate)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, d[5] = {}, n, left, right, lefti, righti, str, len, items[DEQUE_ITEMS] = {};

	if (read_ptr(&v, tstate + c->tstate_local))
		return SPAN_FAULT;
	if (!v) /* no thread dict, or no local key: the thread never used a threading.local */
		return 0;
	if (c->local_kind == SPANPROF_LOCAL_TSTATE_DICT) {
		v = dict_get(w, v, c->osp_local, c->osp_local_hash);
		if (!v)
			return w->q.status; /* this thread never used OSProfiler's local */
		if (read_ptr(&v, v + PY_LOCALDUMMY_DICT))
			return SPAN_FAULT;
	} else {
		/* 3.13: the local's dicts, keyed by the thread's key object (hashed by address). */
		v = dict_get(w, c->osp_local, v, v >> 4 | v << 60);
		if (!v)
			return w->q.status;
	}
	v = dict_get(w, v, c->osp_profiler_name, c->osp_profiler_name_hash);
	if (!v)
		return w->q.status;
	/* `profiler` is None between requests (profiler.clean()). */
	if (read_ptr(&str, v + PY_OB_TYPE))
		return SPAN_FAULT;
	if (str != c->osp_profiler_type)
		return 0;
	w->name_obj[1] = v;
	v = getattr(w, v, c->osp_stack_name, c->osp_stack_name_hash);
	if (!v || bpf_probe_read_user(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
		return SPAN_FAULT;
	n = d[0];
	left = d[1];
	right = d[2];
	lefti = d[3];
	righti = d[4];
	if (n == 0)
		return 0;
	if (n > 2 * DEQUE_BLOCKLEN || lefti >= DEQUE_BLOCKLEN || righti >= DEQUE_BLOCKLEN ||
	    !left || !right)
		return SPAN_FAULT;
	if (left == right && n <= DEQUE_ITEMS && lefti + n <= DEQUE_BLOCKLEN) {
		/* The usual short stack in one block: its items in one read. */
		len = n * 8;
		asm volatile("" : "+r"(len)); /* the bound is checked on the register used */
		if (len > sizeof(items) ||
		    bpf_probe_read_user(items, len, (const void *)(left + DEQUE_BLOCK_DATA + lefti * 8)))
			return SPAN_FAULT;
	} else {
		items[0] = deque_item(left, lefti, 0);
		items[DEQUE_ITEMS - 1] = deque_item(left, lefti, n - 1);
		if (n >= 2)
			items[DEQUE_ITEMS - 2] = deque_item(left, lefti, n - 2);
		n = DEQUE_ITEMS;
	}
	if (read_uuid(w, items[0], w->span.osp_base) ||
	    read_uuid(w, items[(n - 1) & (DEQUE_ITEMS - 1)], w->span.osp_current))
		return SPAN_FAULT;
	w->span.flags |= SPANPROF_SPAN_OSP;
	if (n >= 2 && !read_uuid(w, items[(n - 2) & (DEQUE_ITEMS - 1)], w->span.osp_parent))
		w->span.flags |= SPANPROF_SPAN_OSP_PARENT;
	return 0;
}

/*
 * The str `str` as a name: into out[SPANPROF_SPAN_NAME_MAX], its length into *out_len (0: no
 * name). Only an exact str (ob_type is str_type) that is compact ASCII gives a name, of which
 * the first SPANPROF_SPAN_NAME_MAX bytes are kept: a non-ASCII name, a str subclass or another
 * object gives none. Two reads: the header, then no more data than the str holds.
 */
static __always_inline int read_name(struct scratch *w, __u64 str, __u8 *out, __u8 *out_len)
{
	__u64 hdr[4] = {}; /* ob_type, length, hash, state (Include/cpython/unicodeobject.h) */
	__u64 n, data = w->scfg.str_data;

	*out_len = 0;
	if (!str || bpf_probe_read_user(hdr, sizeof(hdr), (const void *)(str + PY_OB_TYPE)))
		return SPAN_FAULT;
	if (hdr[0] != w->scfg.str_type ||
	    ((__u32)hdr[3] & PY_STR_COMPACT_ASCII) != PY_STR_COMPACT_ASCII)
		return 0;
	n = hdr[1] < SPANPROF_SPAN_NAME_MAX ? hdr[1] : SPANPROF_SPAN_NAME_MAX;
	asm volatile("" : "+r"(n)); /* the bound is checked on the register used */
	if (n == 0 || n > SPANPROF_SPAN_NAME_MAX)
		return 0;
	if (data < PY_STR_STATE + 4 || data > 64 ||
	    bpf_probe_read_user(out, n, (const void *)(str + data)))
		return SPAN_FAULT;
	*out_len = (__u8)n;
	return 0;
}

/*
 * The name of the OpenTelemetry span (osp == 0: its `_name`, set by the SDK's ReadableSpan) or
 * of OSProfiler's current trace point (osp == 1: the last item of the _Profiler's `_name`
 * deque, which start() appends to and stop() pops), of the object the id reader left in
 * w->name_obj. A global function like the readers below: one more getattr inlined into them
 * would be verified once per path through each.
 */
__attribute__((noinline)) int span_name(__u32 slot, __u32 osp)
{
	struct scratch *w = get_scratch(slot);
	__u64 v, obj, d[5] = {}, str = 0;
	int err;

	if (!w)
		return 0;
	obj = osp ? w->name_obj[1] : w->name_obj[0];
	/*
	 * The id reader's last lookup was usually an attribute of this object (`_context`,
	 * `_trace_stack`): the same keys, still in kblock, and values.
	 */
	if (obj && obj == w->attrs_obj)
		v = keys_find(w, w->kvalues, w->scfg.name_attr, w->scfg.name_attr_hash);
	else
		v = getattr(w, obj, w->scfg.name_attr, w->scfg.name_attr_hash);
	if (!v) /* a span without `_name` (NonRecordingSpan), or a fault */
		return w->q.status;
	if (!osp) {
		err = read_name(w, v, w->span.otel_name, &w->span.otel_name_len);
		if (!err && w->span.otel_name_len)
			w->span.flags |= SPANPROF_SPAN_OTEL_NAME;
		return err;
	}
	/* deque: ob_size, leftblock, rightblock, leftindex, rightindex; the last item at the right. */
	if (bpf_probe_read_user(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
		return SPAN_FAULT;
	if (d[0] == 0) /* no trace point started since init() */
		return 0;
	if (!d[2] || d[4] >= DEQUE_BLOCKLEN ||
	    read_ptr(&str, d[2] + DEQUE_BLOCK_DATA + d[4] * 8))
		return SPAN_FAULT;
	err = read_name(w, str, w->span.osp_name, &w->span.osp_name_len);
	if (!err && w->span.osp_name_len)
		w->span.flags |= SPANPROF_SPAN_OSP_NAME;
	return err;
}

/*
 * The three readers as global functions: the verifier checks each once, on its own, instead of
 * once per path through the sampling program (together, inlined, they took 800k of its 1M
 * instructions and 17 s to load). They find their state in the scratch map; 0 or SPAN_FAULT.
 */
__attribute__((noinline)) int span_published(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w ? published_ctx(w) : 0;
}

__attribute__((noinline)) int span_otel(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? otel_span(w, w->tstate) : 0;
}

__attribute__((noinline)) int span_osp(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? osp_trace(w, w->tstate) : 0;
}

/*
 * Reads the span context of the thread whose PyThreadState is w->tstate into w->span; returns
 * its size in the record (0: no span).
 */
static __always_inline __u32 read_span(struct scratch *w, __u32 tgid)
{
	const struct spanprof_span_proc *cfg;
	int bad = 0;

	cfg = bpf_map_lookup_elem(&span_procs, &tgid);
	if (!cfg)
		return 0;
	w->scfg = *cfg;
	__builtin_memset(&w->span, 0, sizeof(w->span));
	w->name_obj[0] = 0;
	w->name_obj[1] = 0;
	w->attrs_obj = 0;
	/*
	 * What the process publishes itself is the cheapest to read, and read first. Names only of
	 * what was read from the interpreter (a published context carries none, and its ids are
	 * not read again from the objects), each right after its ids: its object's keys are still
	 * in the scratch.
	 */
	if (w->scfg.tls_kind != SPANPROF_TLS_NONE && span_published(w->slot))
		bad = 1;
	if (w->scfg.otel_var && !(w->span.flags & SPANPROF_SPAN_OTEL) && span_otel(w->slot))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OTEL) && w->name_obj[0] &&
	    span_name(w->slot, 0))
		bad = 1;
	if (w->scfg.osp_local && !(w->span.flags & SPANPROF_SPAN_OSP) && span_osp(w->slot))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OSP) && w->name_obj[1] &&
	    span_name(w->slot, 1))
		bad = 1;
	if (bad)
		count_error(SPANPROF_ERR_SPAN_READ);
	return w->span.flags ? sizeof(struct spanprof_span) : 0;
}

/*
 * --unwind dwarf: the thread's user registers, and its stack from the user sp upwards into the
 * record at byte `off` of s->stack (right after the span context). One read when the whole size
 * is mapped; at the top of a stack (the main thread's, whose last page is followed by nothing)
 * page by page, up to the first unreadable page.
 */
static __always_inline void copy_user_stack(struct spanprof_sample *s, __u64 off, __u32 tgid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs___kernel *regs = (struct pt_regs___kernel *)bpf_task_pt_regs(task);
	struct return_instance *ri;
	__u64 slot, ret;
	const __u32 *size = bpf_map_lookup_elem(&stack_copy_sizes, &tgid);
	__u64 sp, want = (size ? *size : stack_copy_bytes) & ~7U, done = 0, len;
	__u8 *dst;
	int i;

	if (want > SPANPROF_MAX_STACK_COPY)
		want = SPANPROF_MAX_STACK_COPY;
	if (!regs) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_NO_REGS;
		return;
	}
	s->user_ip = BPF_CORE_READ(regs, ip);
	sp = BPF_CORE_READ(regs, sp);
	s->user_sp = sp;
	s->user_bp = BPF_CORE_READ(regs, bp);
	if (!sp || !s->user_ip) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_NO_REGS;
		return;
	}
	if (off > sizeof(s->stack) + sizeof(s->py) + sizeof(s->span))
		return;
	dst = (__u8 *)s->stack + off;
	if (want && bpf_probe_read_user(dst, want, (const void *)sp) == 0) {
		done = want;
	} else {
		len = 4096 - (sp & 4095);
		for (i = 0; i < SPANPROF_MAX_STACK_COPY / 4096 + 1; i++) {
			if (done >= want || done >= SPANPROF_MAX_STACK_COPY)
				break;
			if (len > want - done)
				len = want - done;
			if (len > 4096)
				len = 4096;
			if (bpf_probe_read_user(dst + done, len, (const void *)(sp + done)))
				break;
			done += len;
			len = 4096;
		}
	}
	if (done == 0) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_FAULT;
		return;
	}
	/*
	 * A function with a pending uretprobe (--event heap's on the allocation functions) returns
	 * to the uprobes trampoline, not to its caller: put the caller back, or the unwinder stops
	 * there (realloc(NULL) calling malloc showed [unknown] (?+0x7fffffffdfff)).
	 */
	ri = BPF_CORE_READ(task, utask, return_instances);
	for (i = 0; i < URETPROBE_FIXUPS && ri; i++) {
		slot = BPF_CORE_READ(ri, stack);
		if (slot >= sp && slot - sp + 8 <= done && slot - sp <= SPANPROF_MAX_STACK_COPY - 8) {
			ret = BPF_CORE_READ(ri, orig_ret_vaddr);
			*(__u64 *)(dst + ((slot - sp) & (SPANPROF_MAX_STACK_COPY - 1))) = ret;
		}
		ri = BPF_CORE_READ(ri, next);
	}
	s->ustack_copy_status =
		SPANPROF_USTACK_COPY_OK | (done < want ? SPANPROF_USTACK_COPY_SHORT : 0);
	s->ustack_copy_len = done;
}

/* Starts the sample of the current thread in w: the header, up to its stacks. */
static __always_inline struct spanprof_sample *begin_sample(struct scratch *w, __u64 id,
							    __u32 slot)
{
	struct spanprof_sample *s = &w->s;

	w->slot = slot;
	s->kind = SPANPROF_RECORD_SAMPLE;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = id >> 32;
	s->tid = (__u32)id;
	s->time_ns = bpf_ktime_get_ns();
	s->py_len = 0;
	s->py_status = SPANPROF_PY_NONE;
	s->span_len = 0;
	s->ustack_copy_len = 0;
	s->ustack_copy_status = SPANPROF_USTACK_COPY_NONE;
	s->user_ip = 0;
	s->user_sp = 0;
	s->user_bp = 0;
	s->event = SPANPROF_EVENT_CPU;
	s->weight = 0;
	s->alloc_id = 0;
	s->blocked_ns = 0;
	s->syscall_nr = -1;
	s->offcpu_flags = 0;
	s->syscall_arg0 = 0;
	w->tstate = 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	return s;
}

/*
 * Finishes and sends the sample in w, whose k kernel frames are in place: the user stack (frame
 * pointers, or the stack copy), the Python frames and the span context when `user` is set, then
 * one ring buffer record of only what was captured (a 10-frame stack is 176 bytes, not 47 KiB).
 * `ctx` is the program's context, for bpf_get_stack.
 */
static __always_inline void send_sample(void *ctx, struct scratch *w, __u64 k, int user)
{
	struct spanprof_sample *s = &w->s;
	const struct spanprof_py_proc *py = 0;
	struct spanprof_target *t;
	struct task_struct *task;
	__u32 tgid = s->pid, seen;
	__u64 u, p, size, off, ip, wake = BPF_RB_NO_WAKEUP;
	long n = 0;

	if (k > SPANPROF_MAX_STACK_DEPTH)
		k = SPANPROF_MAX_STACK_DEPTH;
	/* --unwind dwarf copies the stack instead (below), after the parts that go before it. */
	if (user && !stack_copy_bytes)
		n = bpf_get_stack(ctx, &s->stack[k], SPANPROF_MAX_STACK_DEPTH * sizeof(__u64),
				  BPF_F_USER_STACK);
	if (n < 0)
		count_error(SPANPROF_ERR_USTACK);
	s->ustack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	u = n > 0 ? (__u64)n / sizeof(__u64) : 0;
	if (u > SPANPROF_MAX_STACK_DEPTH)
		u = SPANPROF_MAX_STACK_DEPTH;

	if (user)
		py = bpf_map_lookup_elem(&py_procs, &tgid);
	if (py)
		py_walk(w, py, tgid, s->tid, k + u);
	p = s->py_len;
	if (p > SPANPROF_MAX_PY_FRAMES)
		p = SPANPROF_MAX_PY_FRAMES;
	if (py && read_span(w, tgid)) {
		/* Right after the frames (the `span` member only reserves the room). */
		off = (k + u) * sizeof(__u64) + p * SPANPROF_PY_FRAME_SIZE;
		if (off <= sizeof(s->stack) + sizeof(s->py)) {
			__builtin_memcpy((__u8 *)s->stack + off, &w->span, sizeof(w->span));
			s->span_len = sizeof(w->span);
		}
	}

	off = (k + u) * sizeof(__u64) + p * SPANPROF_PY_FRAME_SIZE + s->span_len;
	if (user && stack_copy_bytes)
		copy_user_stack(s, off, tgid);

	size = SPANPROF_SAMPLE_HEADER_SIZE + off + s->ustack_copy_len;
	if (size > sizeof(*s))
		size = sizeof(*s);
	/*
	 * The first sample of a process (since it was forked or exec'd) wakes user space at once,
	 * which then reads the process's memory map and opens its modules while it lives: a
	 * short-lived child would otherwise often exit before the next drain, and its addresses
	 * could no longer be tied to a file. So does its first sample in its program's own code:
	 * by then the dynamic loader has mapped its libraries, which a first sample taken in the
	 * loader would not have seen. At most two wake-ups per program, then; two samples racing
	 * here both wake it: harmless.
	 */
	t = bpf_map_lookup_elem(&target_pids, &tgid);
	if (t) {
		seen = SPANPROF_TARGET_SEEN;
		ip = stack_copy_bytes ? s->user_ip : (u ? s->stack[k & (SPANPROF_MAX_STACK_DEPTH - 1)] : 0);
		task = bpf_get_current_task_btf();
		if (ip && ip >= BPF_CORE_READ(task, mm, start_code) &&
		    ip < BPF_CORE_READ(task, mm, end_code))
			seen |= SPANPROF_TARGET_SEEN_MAIN;
		if (seen & ~t->flags) {
			t->flags |= seen;
			wake = BPF_RB_FORCE_WAKEUP;
		}
	}
	if (bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > wakeup_bytes)
		wake = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wake))
		count_error(SPANPROF_ERR_RINGBUF_FULL);
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct spanprof_sample *s;
	struct scratch *w;
	long n;

	if (tgid == 0 || !bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	w = get_scratch(SCRATCH_CPU);
	if (!w)
		return 0;
	s = begin_sample(w, id, SCRATCH_CPU);

	/* A sample taken in user mode has no kernel stack: 0 frames, or -EFAULT; neither is an error. */
	n = bpf_get_stack(ctx, s->stack, SPANPROF_MAX_STACK_DEPTH * sizeof(__u64), 0);
	if (n < 0 && n != -EFAULT)
		count_error(SPANPROF_ERR_KSTACK);
	s->kstack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	send_sample(ctx, w, n > 0 ? (__u64)n / sizeof(__u64) : 0, 1);
	return 0;
}

/* Off-CPU state of the targets' threads: struct spanprof_offcpu_task (spanprof_abi.h). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct spanprof_offcpu_task);
} offcpu_tasks SEC(".maps");

/*
 * The blocked interval of `t` ends at `now`: kept or not by the sampling, and if kept added to
 * the thread's pending sample (intervals of one system call add up). `task` is the thread while
 * still switched out, whose saved kernel stack is where it blocked; NULL when that stack is
 * gone (the interval's end was found late), and the sample then has no kernel frames.
 */
static __always_inline void end_interval(struct spanprof_offcpu_task *t, __u64 now,
					 struct task_struct *task)
{
	__u64 d = now - t->off_ts, weight;
	long n = 0;

	t->off_ts = 0;
	if (d < offcpu_min_ns)
		return;
	if (d >= offcpu_period_ns)
		weight = d;
	/* Kept with probability d / period: d < period <= 1e9 < 2^30, so neither side overflows. */
	else if ((__u64)bpf_get_prandom_u32() * offcpu_period_ns < (d << 32))
		weight = offcpu_period_ns;
	else
		return;
	/*
	 * User registers of 0 are unknown (a thread user space found blocked when the session
	 * began): that interval belongs with any later one of the same system call.
	 */
	if (t->weight_ns && (t->pending_ip || t->pending_sp) &&
	    (t->pending_ip != t->off_ip || t->pending_sp != t->off_sp)) {
		/* Blocked outside a system call, and now elsewhere: the older one cannot be sent. */
		count_error(SPANPROF_ERR_OFFCPU_DROPPED);
		t->weight_ns = 0;
	}
	if (!t->weight_ns) {
		if (task) {
			n = bpf_get_task_stack(task, t->kstack, sizeof(t->kstack), 0);
			if (n < 0)
				count_error(SPANPROF_ERR_KSTACK);
		}
		t->kstack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
		t->pending_ip = t->off_ip;
		t->pending_sp = t->off_sp;
		t->blocked_ns = 0;
		t->flags = 0;
	}
	t->weight_ns += weight;
	t->blocked_ns += d;
	t->flags |= t->off_flags;
}

/*
 * Every context switch (--event offcpu): `prev` of a profiled process blocking starts an
 * interval; `next` coming back ends its interval, which the sampling keeps or not. Bounded: two
 * storage lookups, a hash lookup, and for a kept interval that starts a pending sample one
 * bpf_get_task_stack of `next` (still switched out: its saved stack is where it blocked).
 */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	struct pt_regs___kernel *regs;
	int blocked;
	struct spanprof_offcpu_task *t;
	__u32 tgid;

	/* Blocked, not preempted: waiting for something, not for a CPU. */
	blocked = !preempt && prev_state;
	tgid = BPF_CORE_READ(prev, tgid);
	if (!blocked && !offcpu_runnable && tgid && !(prev_state & TASK_DEAD) &&
	    bpf_map_lookup_elem(&target_pids, &tgid)) {
		/*
		 * Preempted while still marked blocked: it was running, so its switch back in was
		 * missed (see on_sys_exit). The interval ends here, before the preemption's wait
		 * could be added to it; its system call's exit sends it.
		 */
		t = bpf_task_storage_get(&offcpu_tasks, prev, 0, 0);
		if (t && t->off_ts) {
			count_error(SPANPROF_ERR_OFFCPU_LATE);
			end_interval(t, now, 0);
		}
	}
	if ((blocked || offcpu_runnable) && !(prev_state & TASK_DEAD)) {
		if (tgid && bpf_map_lookup_elem(&target_pids, &tgid)) {
			t = bpf_task_storage_get(&offcpu_tasks, prev, 0,
						 BPF_LOCAL_STORAGE_GET_F_CREATE);
			if (!t) {
				count_error(SPANPROF_ERR_OFFCPU_STORAGE);
			} else if (blocked) {
				if (t->off_ts)
					count_error(SPANPROF_ERR_OFFCPU_MISSED);
				regs = (struct pt_regs___kernel *)bpf_task_pt_regs(prev);
				t->off_ts = now;
				t->off_flags = BPF_CORE_READ_BITFIELD_PROBED(prev, in_iowait) ?
						       SPANPROF_OFFCPU_IOWAIT :
						       0;
				t->off_ip = regs ? BPF_CORE_READ(regs, ip) : 0;
				t->off_sp = regs ? BPF_CORE_READ(regs, sp) : 0;
			} else {
				/* As above: a missed switch back in ends at this preemption. */
				if (t->off_ts) {
					count_error(SPANPROF_ERR_OFFCPU_LATE);
					end_interval(t, now, 0);
				}
				t->runnable_ts = now;
			}
		}
	}

	t = bpf_task_storage_get(&offcpu_tasks, next, 0, 0);
	if (!t)
		return 0;
	if (t->runnable_ts) {
		/* Summed per CPU, so threads that exit before the end still count. */
		count_ns(SPANPROF_ERR_RUNNABLE_NS, now - t->runnable_ts);
		t->runnable_ts = 0;
	}
	if (t->off_ts)
		end_interval(t, now, next);
	return 0;
}

/*
 * Every system call's exit: a thread with pending off-CPU intervals is back, in its own context
 * with the user registers it blocked with, so its stacks are read as a timer sample's are. A
 * thread that blocked outside a system call (a page fault) and is now elsewhere gets a record
 * of its kernel stack only (SPANPROF_OFFCPU_NO_USER).
 */
SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs___kernel *regs, long ret)
{
	struct spanprof_offcpu_task *t;
	struct spanprof_sample *s;
	struct scratch *w;
	__u64 k;
	int user;

	t = bpf_task_storage_get(&offcpu_tasks, bpf_get_current_task_btf(), 0, 0);
	if (!t)
		return 0;
	if (t->off_ts) {
		/*
		 * Running, yet still marked blocked: its switch back in was not seen (this kernel
		 * switched it in without on_switch finding its state; rare, under load). Its system
		 * call returns now, a moment after it woke: the interval ends here, its user stack and
		 * system call are known, the kernel stack it blocked in is not.
		 */
		count_error(SPANPROF_ERR_OFFCPU_LATE);
		end_interval(t, bpf_ktime_get_ns(), 0);
	}
	if (!t->weight_ns)
		return 0;
	w = get_scratch(SCRATCH_OFFCPU);
	if (!w)
		return 0;
	s = begin_sample(w, bpf_get_current_pid_tgid(), SCRATCH_OFFCPU);
	/* Unknown registers (0: blocked since before the session, in a system call): its own. */
	user = (!t->pending_ip && !t->pending_sp) ||
	       (BPF_CORE_READ(regs, ip) == t->pending_ip && BPF_CORE_READ(regs, sp) == t->pending_sp);
	s->event = SPANPROF_EVENT_OFFCPU;
	s->weight = t->weight_ns;
	s->blocked_ns = t->blocked_ns;
	s->offcpu_flags = t->flags | (user ? 0 : SPANPROF_OFFCPU_NO_USER);
	if (user) {
		s->syscall_nr = (__s32)BPF_CORE_READ(regs, orig_ax);
		s->syscall_arg0 = BPF_CORE_READ(regs, di);
	}
	t->weight_ns = 0;
	s->kstack_len = t->kstack_len;
	k = t->kstack_len > 0 ? (__u64)t->kstack_len : 0;
	if (k > SPANPROF_MAX_STACK_DEPTH)
		k = SPANPROF_MAX_STACK_DEPTH;
	if (k && bpf_probe_read_kernel(s->stack, k * sizeof(__u64), t->kstack))
		k = 0;
	send_sample(ctx, w, k, user);
	return 0;
}

/*
 * Allocations (--event alloc, heap): uprobes on the malloc family and mmap of the C library
 * (CPython's small objects come from arenas it maps). Sampled by bytes: a per-CPU countdown of
 * bytes to the next sample, reset after each sample to a gap drawn from an exponential
 * distribution whose mean is the sampling rate (alloc_gaps, filled by user space), so each byte
 * allocated has the same chance to be sampled and an allocation of s bytes is sampled with
 * probability 1 - exp(-s / rate); user space scales by its inverse. alloc_rate <= 1 samples
 * every allocation.
 */
const volatile __u64 alloc_rate = 524288;
/* --event heap: sampled allocations are tracked to their free (uretprobes and free uprobes). */
const volatile __u32 alloc_heap = 0;

#define ALLOC_GAPS 256

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ALLOC_GAPS);
	__type(key, __u32);
	__type(value, __u64);
} alloc_gaps SEC(".maps");

struct alloc_cpu {
	__s64 until;  /* bytes to allocate before the next sample */
	__u64 serial; /* allocations sampled on this CPU */
	__u32 seeded; /* until was drawn once (a countdown starting at 0 would sample at once) */
	__u32 busy;   /* a sample is being made on this CPU (a preempted uprobe program) */
};

#define MAP_ANONYMOUS 0x20

struct {
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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* tid */
	__type(value, struct alloc_call);
} alloc_calls SEC(".maps");

/* Sampled allocations not freed yet, by address (--event heap); read by user space at the end. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct spanprof_alloc_key);
	__type(value, struct spanprof_live_alloc);
} alloc_live SEC(".maps");

/* The next gap of the byte countdown: exponentially distributed, of mean alloc_rate. */
static __always_inline __s64 draw_gap(void)
{
	__u32 gap = bpf_get_prandom_u32() % ALLOC_GAPS;
	__u64 *next = bpf_map_lookup_elem(&alloc_gaps, &gap);

	return next ? (__s64)*next : (__s64)alloc_rate;
}

/*
 * One allocation of `size` bytes by the current thread: counted down, and when the countdown
 * runs out, sent as a sample with its user and Python stacks and span context. In user mode (a
 * uprobe), so there is no kernel stack.
 */
static __always_inline int alloc_event(struct pt_regs *ctx, __u64 size, __u64 memptr)
{
	__u64 id = bpf_get_current_pid_tgid(), serial;
	__u32 tgid = id >> 32, zero = 0;
	struct alloc_cpu *cpu;
	struct alloc_call call = {};
	struct spanprof_sample *s;
	struct scratch *w;

	if (!bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	cpu = bpf_map_lookup_elem(&alloc_cpus, &zero);
	if (!cpu)
		return 0;
	if (alloc_rate > 1) {
		if (!cpu->seeded) {
			cpu->until = draw_gap();
			cpu->seeded = 1;
		}
		cpu->until -= (__s64)size;
		if (cpu->until > 0)
			return 0;
		cpu->until = draw_gap();
	}
	/*
	 * Uprobe programs run preemptible on some kernels: a thread preempted in the middle of a
	 * sample must not share the CPU's scratch with the next one. (A plain flag: atomics that
	 * return a value need BPF v3 code; a preemption between the test and the set is the only
	 * window left.)
	 */
	if (cpu->busy) {
		count_error(SPANPROF_ERR_ALLOC_BUSY);
		return 0;
	}
	cpu->busy = 1;
	serial = ++cpu->serial;
	w = get_scratch(SCRATCH_ALLOC);
	if (w) {
		s = begin_sample(w, id, SCRATCH_ALLOC);
		s->event = SPANPROF_EVENT_ALLOC;
		s->weight = size;
		s->alloc_id = ((__u64)s->cpu << 56) | (serial & ((1ULL << 56) - 1));
		s->kstack_len = 0;
		if (alloc_heap) {
			call.alloc_id = s->alloc_id;
			call.size = size;
			call.memptr = memptr;
			call.sp = PT_REGS_SP(ctx);
			bpf_map_update_elem(&alloc_calls, &s->tid, &call, BPF_ANY);
		}
		send_sample(ctx, w, 0, 1);
	}
	cpu->busy = 0;
	return 0;
}

/* A free of `addr` (--event heap): a sampled allocation leaves the live table. */
static __always_inline void free_event(__u64 addr)
{
	struct spanprof_alloc_key key = { .tgid = bpf_get_current_pid_tgid() >> 32, .addr = addr };

	if (addr && bpf_map_lookup_elem(&target_pids, &key.tgid))
		bpf_map_delete_elem(&alloc_live, &key);
}

/* glibc hands an alignment of at most MALLOC_ALIGNMENT (16 on x86_64) to its malloc. */
#define GLIBC_MALLOC_ALIGNMENT 16

/*
 * Every allocation function, one program (each program that inlines the sample code costs the
 * verifier ~180 ms at load): the attach cookie says which function it is (SPANPROF_ALLOC_* in its
 * top 4 bits) and so where the size is. For mmap the rest holds mmap's link-time address (bits
 * 30..59) and the end of the C library's code (bits 0..29): the library's run-time base is the
 * probe's address minus the first, and calls from inside the library are not counted (malloc's
 * own large chunks, counted by the malloc probe; pthread_create's thread stacks). Only anonymous
 * mappings are allocations (file mappings are code and data); CPython's arenas of small objects
 * are such mappings.
 */
SEC("uprobe")
int BPF_KPROBE(on_alloc, __u64 a0, __u64 a1, __u64 a2, __u64 a3)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), data = cookie & ((1ULL << 60) - 1);
	__u64 size, memptr = 0, limit, base, caller = 0;

	/* The sample code is inlined once, after the switch (each copy costs the verifier). */
	switch (cookie >> 60) {
	case SPANPROF_ALLOC_MALLOC: /* malloc(size) */
		size = a0;
		break;
	case SPANPROF_ALLOC_CALLOC: /* calloc(n, size) */
		/* It fails on overflow: nothing is allocated. (The barrier keeps clang from turning
		 * the division into a 128-bit multiplication, which BPF does not have.) */
		if (a1) {
			limit = ~0ULL / a1;
			asm volatile("" : "+r"(limit));
			if (a0 > limit)
				return 0;
		}
		size = a0 * a1;
		break;
	case SPANPROF_ALLOC_REALLOC: /* realloc(ptr, size) */
		/* glibc's realloc(NULL, n) is its malloc(n), whose probe counts it. */
		if (!a0)
			return 0;
		if (alloc_heap)
			free_event(a0);
		size = a1;
		break;
	case SPANPROF_ALLOC_MEMALIGN: /* aligned_alloc(alignment, size), memalign(alignment, size) */
		if (a0 <= GLIBC_MALLOC_ALIGNMENT)
			return 0;
		size = a1;
		break;
	case SPANPROF_ALLOC_POSIX_MEMALIGN: /* posix_memalign(memptr, alignment, size) */
		if (a1 <= GLIBC_MALLOC_ALIGNMENT)
			return 0;
		size = a2;
		memptr = a0;
		break;
	case SPANPROF_ALLOC_MMAP: /* mmap(addr, length, prot, flags, fd, offset) */
		if (!(a3 & MAP_ANONYMOUS))
			return 0;
		if (data) {
			base = PT_REGS_IP(ctx) - (data >> 30);
			if (!bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx)) &&
			    caller >= base && caller < base + (data & ((1ULL << 30) - 1)))
				return 0;
		}
		size = a1;
		break;
	default:
		return 0;
	}
	return alloc_event(ctx, size, memptr);
}

/* munmap(addr, length). */
SEC("uprobe")
int BPF_KPROBE(on_munmap, __u64 addr)
{
	free_event(addr);
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(on_free, __u64 ptr)
{
	free_event(ptr);
	return 0;
}

/*
 * The return of every allocation function (--event heap): a sampled call's address, now known,
 * goes into the live table. Cheap for the others: one lookup by thread id.
 */
SEC("uretprobe")
int BPF_KRETPROBE(on_alloc_return, __u64 ret)
{
	__u64 id = bpf_get_current_pid_tgid(), addr = ret;
	__u32 tid = (__u32)id;
	struct spanprof_live_alloc live = {};
	struct spanprof_alloc_key key = { .tgid = id >> 32 };
	struct alloc_call *call;

	call = bpf_map_lookup_elem(&alloc_calls, &tid);
	if (!call)
		return 0;
	/*
	 * The return of the sampled call itself, not of one it made (malloc maps large chunks with
	 * mmap, whose return is probed too): its stack pointer is one return address above the
	 * entry's.
	 */
	if (PT_REGS_SP(ctx) != call->sp + 8)
		return 0;
	live.alloc_id = call->alloc_id;
	live.size = call->size;
	if (call->memptr) {
		/* posix_memalign returns 0 on success and writes the address. */
		addr = 0;
		if (ret != 0 || bpf_probe_read_user(&addr, sizeof(addr), (void *)call->memptr))
			addr = 0;
	}
	bpf_map_delete_elem(&alloc_calls, &tid);
	/* A failed mmap returns MAP_FAILED (-1), a failed malloc NULL. */
	if (addr >= ~4095ULL)
		addr = 0;
	key.addr = addr;
	if (addr && bpf_map_update_elem(&alloc_live, &key, &live, BPF_ANY))
		count_error(SPANPROF_ERR_HEAP_FULL);
	return 0;
}

/*
 * execve replaces the address space: the process's CPython (if any) is gone, and user space,
 * told by an exec record, looks again.
 */
SEC("raw_tp/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, int old_pid)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32, old = (__u32)old_pid;
	struct spanprof_exec e = {};
	struct spanprof_target *t = bpf_map_lookup_elem(&target_pids, &tgid);

	if (!t)
		return 0;
	/* A new program: its first samples wake user space again (see send_sample). */
	t->flags &= ~(SPANPROF_TARGET_SEEN | SPANPROF_TARGET_SEEN_MAIN);
	bpf_map_delete_elem(&py_procs, &tgid);
	bpf_map_delete_elem(&span_procs, &tgid);
	bpf_map_delete_elem(&stack_copy_sizes, &tgid);
	/*
	 * What was found of the thread's Python thread state belongs to the old program (a fork
	 * child of a Python process, sampled before its exec, found none): forget it. The thread
	 * that called exec had id old_pid; it now has the tgid.
	 */
	bpf_map_delete_elem(&py_threads, &old);
	bpf_map_delete_elem(&py_threads, &tgid);
	e.kind = SPANPROF_RECORD_EXEC;
	e.pid = tgid;
	e.time_ns = bpf_ktime_get_ns();
	if (bpf_ringbuf_output(&samples, &e, sizeof(e), 0))
		count_error(SPANPROF_ERR_RINGBUF_FULL);
	return 0;
}

/*
 * A process leaves the target set when its thread group leader exits, so a pid the kernel reuses
 * later is not profiled by mistake and fork-heavy commands do not fill the map. (A leader that
 * exits before its other threads ends profiling of those threads too: rare, and accepted.)
 */
SEC("raw_tp/sched_process_exit")
int BPF_PROG(on_process_exit, struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct spanprof_exec e = {};

	if ((__u32)BPF_CORE_READ(task, pid) == tgid) {
		/*
		 * User space drops what it kept to name the process's addresses once it has read
		 * this record: its samples are all before it.
		 */
		if (bpf_map_lookup_elem(&target_pids, &tgid)) {
			e.kind = SPANPROF_RECORD_EXIT;
			e.pid = tgid;
			e.time_ns = bpf_ktime_get_ns();
			if (bpf_ringbuf_output(&samples, &e, sizeof(e), 0))
				count_error(SPANPROF_ERR_RINGBUF_FULL);
		}
		bpf_map_delete_elem(&target_pids, &tgid);
		bpf_map_delete_elem(&py_procs, &tgid);
		bpf_map_delete_elem(&span_procs, &tgid);
		bpf_map_delete_elem(&stack_copy_sizes, &tgid);
	}
	return 0;
}

/*
 * sched_process_fork fires for new threads too; only a new thread group (a process) is added.
 * Done in the kernel so no child can run unprofiled while user space catches up.
 */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid, ctgid;
	struct spanprof_target t = {};
	const struct spanprof_py_proc *py;
	const struct spanprof_span_proc *spans;
	const __u32 *copy;

	if (!follow_children)
		return 0;
	ptgid = BPF_CORE_READ(parent, tgid);
	ctgid = BPF_CORE_READ(child, tgid);
	if (ptgid == ctgid || !bpf_map_lookup_elem(&target_pids, &ptgid))
		return 0;
	t.flags = SPANPROF_TARGET_CHILD;
	t.parent_tgid = ptgid;
	if (bpf_map_update_elem(&target_pids, &ctgid, &t, BPF_ANY)) {
		count_error(SPANPROF_ERR_PID_MAP_FULL);
		return 0;
	}
	/*
	 * A forked child has its parent's address space: same interpreter, same addresses. A
	 * non-Python parent's child must not inherit an entry a former owner of its pid left.
	 */
	py = bpf_map_lookup_elem(&py_procs, &ptgid);
	if (py)
		bpf_map_update_elem(&py_procs, &ctgid, py, BPF_ANY);
	else
		bpf_map_delete_elem(&py_procs, &ctgid);
	/* The tracing libraries' objects too are where they were in the parent. */
	spans = bpf_map_lookup_elem(&span_procs, &ptgid);
	if (spans)
		bpf_map_update_elem(&span_procs, &ctgid, spans, BPF_ANY);
	else
		bpf_map_delete_elem(&span_procs, &ctgid);
	/* And its stack as deep: a size raised for the parent holds for the child. */
	copy = bpf_map_lookup_elem(&stack_copy_sizes, &ptgid);
	if (copy)
		bpf_map_update_elem(&stack_copy_sizes, &ctgid, copy, BPF_ANY);
	else
		bpf_map_delete_elem(&stack_copy_sizes, &ctgid);
	return 0;
}
