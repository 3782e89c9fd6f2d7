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
 * The only kernel type read here. CO-RE relocates the field by name against the running
 * kernel's BTF, so this stub stands in for a full vmlinux.h.
 */
struct thread_struct {
	unsigned long fsbase; /* x86_64: the thread's FS base, which glibc's pthread_self() is */
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

/* FRAME_OWNED_BY_CSTACK, Include/internal/pycore_frame.h (3.12, 3.13). */
#define PY_OWNED_BY_CSTACK 3
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

/*
 * Where a sample is assembled before the used part is copied into the ring buffer, and the
 * state of the Python walk, which bpf_loop callbacks reach through this map.
 */
struct scratch {
	struct spanprof_sample s;
	struct spanprof_py_proc cfg;
	__u64 frame;  /* next frame to read; tstate during the thread search */
	__u64 want;   /* thread search: the value that identifies the sampled thread */
	__u64 last_code;  /* the code object read last in this walk, and its check value */
	__u64 last_check;
	__u32 py_base; /* byte offset of the Python frames in s.stack */
	__u32 n;       /* Python frames recorded */
	__u32 status;  /* SPANPROF_PY_* */
	__u32 _pad;
	__u64 win_base; /* target address of win[0] */
	__u32 win_len;  /* bytes of win that hold target memory */
	__u32 _pad2;
	__u8 win[SPANPROF_PY_WINDOW];
	__u8 code[SPANPROF_PY_CODE_BLOCK];
	__u8 name[SPANPROF_PY_NAME_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
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

static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
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
	struct scratch *w = get_scratch();
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
	struct scratch *w = get_scratch();
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
	    load_u8(w->win, rel + w->cfg.frame_entry, SPANPROF_PY_WINDOW) == PY_OWNED_BY_CSTACK) {
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
	code = load_u64(w->win, rel + w->cfg.frame_code, SPANPROF_PY_WINDOW);
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
	bpf_loop(PY_THREAD_LOOPS, py_thread_step, NULL, 0);
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
	bpf_loop(PY_FRAME_LOOPS, py_frame_step, NULL, 0);
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

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	const struct spanprof_py_proc *py;
	struct spanprof_sample *s;
	struct scratch *w;
	__u64 k, u, p, size;
	long n;

	if (tgid == 0 || !bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	w = get_scratch();
	if (!w)
		return 0;
	s = &w->s;
	s->kind = SPANPROF_RECORD_SAMPLE;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = tgid;
	s->tid = (__u32)id;
	s->time_ns = bpf_ktime_get_ns();
	s->py_len = 0;
	s->py_status = SPANPROF_PY_NONE;
	bpf_get_current_comm(s->comm, sizeof(s->comm));

	/* A sample taken in user mode has no kernel stack: 0 frames, or -EFAULT; neither is an error. */
	n = bpf_get_stack(ctx, s->stack, SPANPROF_MAX_STACK_DEPTH * sizeof(__u64), 0);
	if (n < 0 && n != -EFAULT)
		count_error(SPANPROF_ERR_KSTACK);
	s->kstack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	k = n > 0 ? (__u64)n / sizeof(__u64) : 0;
	if (k > SPANPROF_MAX_STACK_DEPTH)
		k = SPANPROF_MAX_STACK_DEPTH;

	n = bpf_get_stack(ctx, &s->stack[k], SPANPROF_MAX_STACK_DEPTH * sizeof(__u64),
			  BPF_F_USER_STACK);
	if (n < 0)
		count_error(SPANPROF_ERR_USTACK);
	s->ustack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	u = n > 0 ? (__u64)n / sizeof(__u64) : 0;
	if (u > SPANPROF_MAX_STACK_DEPTH)
		u = SPANPROF_MAX_STACK_DEPTH;

	py = bpf_map_lookup_elem(&py_procs, &tgid);
	if (py)
		py_walk(w, py, tgid, (__u32)id, k + u);
	p = s->py_len;
	if (p > SPANPROF_MAX_PY_FRAMES)
		p = SPANPROF_MAX_PY_FRAMES;

	/* Only the frames captured travel: a 10-frame stack is 136 bytes, not 14 KiB. */
	size = SPANPROF_SAMPLE_HEADER_SIZE + (k + u) * sizeof(__u64) + p * SPANPROF_PY_FRAME_SIZE;
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (bpf_ringbuf_output(&samples, s, size,
			       bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > wakeup_bytes ?
				       BPF_RB_FORCE_WAKEUP :
				       BPF_RB_NO_WAKEUP))
		count_error(SPANPROF_ERR_RINGBUF_FULL);
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

	if (!bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	bpf_map_delete_elem(&py_procs, &tgid);
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

	if ((__u32)BPF_CORE_READ(task, pid) == tgid) {
		bpf_map_delete_elem(&target_pids, &tgid);
		bpf_map_delete_elem(&py_procs, &tgid);
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
	return 0;
}
