// SPDX-License-Identifier: GPL-2.0
/*
 * The CPython walk of a sampled thread: find its PyThreadState, then read its frames into the
 * sample, innermost first. The interpreter's layout comes from user space (struct
 * spanprof_py_proc in `py_procs`), so nothing here depends on a Python version.
 *
 * Bounds: the thread state is cached per thread (`py_threads`) and checked with one read; on a
 * miss a bpf_loop of at most PY_THREAD_LOOPS steps (two reads each) searches the interpreter's
 * thread list. The frames are a bpf_loop of at most PY_FRAME_LOOPS steps, each at most three
 * reads (the frame with the bytes below it in its page, the code object, before 3.12 its name),
 * usually fewer: frames next to each other come from one read, and a code object that repeats
 * is not read again. Failed reads end the walk and are counted (SPANPROF_ERR_PY_READ). A stack
 * deeper than a sample holds is walked on to its outermost frame (up to SPANPROF_PY_WALK_FRAMES),
 * its outermost frames kept in a ring (py_close_ring), the middle left out and counted.
 *
 * py_walk is a global BPF function (declared in python_walk.h), verified by the kernel once, on
 * its own, in each program that calls it: inlined, the walk was checked again on every path of
 * the sampling program that reached it, and made three fifths of the verifier's work (about
 * 0.25 s of CPU at every session's start). This unit has no program of its own.
 */
#include "python_walk.h"

/*
 * The lowest _PyInterpreterFrame.owner of a frame that runs no Python function: the C-stack
 * shim of 3.12 and 3.13 (FRAME_OWNED_BY_CSTACK = 3), 3.14's interpreter base frame (3) and
 * C-stack shim (4), 3.15's entry shim (FRAME_OWNED_BY_INTERPRETER = 3).
 */
#define PY_OWNED_BY_SHIM 3
/* Tag bits of a _PyStackRef (3.14+ f_executable); objects are 8-byte aligned in every version. */
#define PY_STACKREF_TAG_MASK 7ULL
/* Steps of the frame walk: every frame, plus one C-stack shim per interpreter call at most. */
#define PY_FRAME_LOOPS (2 * SPANPROF_PY_WALK_FRAMES + 1)
/*
 * Frames kept in walk order, innermost first; the frames after them go round a ring of the last
 * SPANPROF_PY_OUTER_FRAMES slots, so a stack deeper than a sample holds keeps its outermost
 * frames too (the entry point, the first callers).
 */
#define PY_INNER_FRAMES (SPANPROF_MAX_PY_FRAMES - SPANPROF_PY_OUTER_FRAMES)
_Static_assert((SPANPROF_PY_OUTER_FRAMES & (SPANPROF_PY_OUTER_FRAMES - 1)) == 0,
	       "the ring's size is a power of two");
_Static_assert(SPANPROF_PY_OUTER_FRAMES * SPANPROF_PY_FRAME_SIZE <= SPANPROF_PY_WINDOW,
	       "the ring is put in order through the window");
_Static_assert(SPANPROF_PY_FRAME_SIZE == 24, "py_close_ring copies a frame as three words");
/* Thread states visited to find the sampled thread's. */
#define PY_THREAD_LOOPS 1024

/*
 * A thread without a thread state is searched for again after ~16 ms. Short, because a thread
 * Python just started has its PyThreadState in the list before it binds it to its own id: a
 * long wait would hide its first Python frames (a test saw ~250 ms of them go).
 */
#define PY_NO_THREAD_RETRY 16

/* One step of the thread-state search: is w->frame the sampled thread's? */
static long py_thread_step(__u64 i, void *ctx)
{
	LOOP_TASK(ctx)
	struct scratch *w = loop_scratch(ctx);
	__u64 v = 0;

	if (!w || w->frame == 0)
		return 1;
	if (read_ptr(&v, w->frame + w->cfg.tstate_thread TASK_A)) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 1;
	}
	if (v == w->want) {
		w->status = SPANPROF_PY_OK;
		return 1;
	}
	if (read_ptr(&v, w->frame + w->cfg.tstate_next TASK_A)) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 1;
	}
	w->frame = v;
	return 0;
}

/* The slot of the n-th frame walked (0 innermost). */
static __always_inline __u32 py_slot(__u32 n)
{
	if (n < PY_INNER_FRAMES)
		return n;
	return PY_INNER_FRAMES + ((n - PY_INNER_FRAMES) & (SPANPROF_PY_OUTER_FRAMES - 1));
}

/*
 * One step of the frame walk: records w->frame (unless it is a shim) and moves to its caller; 1
 * ends the walk. A global function, checked once: as the loop's callback itself, the verifier
 * went over it a dozen times (a third of what it checked in each sampling program).
 */
__attribute__((noinline)) int py_frame(__u32 slot TASK_GP)
{
	struct scratch *w = get_scratch(slot);
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
		if (user_read(w->win, len, (const void *)start))
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
			off = w->py_base + py_slot(w->n - 1) * SPANPROF_PY_FRAME_SIZE;
			if (off > sizeof(w->s.stack) + sizeof(w->s.py) - SPANPROF_PY_FRAME_SIZE)
				return 1;
			f = (struct spanprof_py_frame *)((__u8 *)w->s.stack + off);
			f->flags |= SPANPROF_PY_FRAME_ENTRY;
		}
		goto next;
	}
	if (w->n >= SPANPROF_PY_WALK_FRAMES) {
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
		if (user_read(w->code, size, (const void *)(code + w->cfg.code_firstlineno)))
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
			if (user_read(w->name, sizeof(w->name),
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

	off = w->py_base + py_slot(w->n) * SPANPROF_PY_FRAME_SIZE;
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
	/*
	 * Frames read before the fault are kept, cut. None read: the thread's current frame was
	 * unreadable, not a cut stack (3.11/3.12 publish tstate->cframe a few instructions before
	 * filling it, as a call of the interpreter loop begins).
	 */
	w->s.py_status = SPANPROF_PY_READ_FAILED | (w->n ? SPANPROF_PY_TRUNCATED : 0);
	return 1;
}

static long py_frame_step(__u64 i, void *ctx)
{
	LOOP_TASK(ctx)
	int stop;

	if (!ctx)
		return 1;
	stop = py_frame(*(__u32 *)ctx TASK_A);
	/*
	 * A callback returns 0 or 1, and the verifier knows nothing of a global function's result:
	 * the test must stay (clang knows py_frame's results and would drop it).
	 */
	asm volatile("" : "+r"(stop));
	return stop != 0;
}

/*
 * The sampled thread's PyThreadState: the cached one if it still names this thread, else a
 * search of the interpreter's thread list. 0 when there is none (or a read failed).
 */
static __always_inline __u64 py_thread_state(struct scratch *w, __u32 tgid, __u32 tid TASK_P)
{
	struct py_tstate *cached, fresh = {};
	__u32 stamp = (__u32)(bpf_ktime_get_ns() >> 20);
	__u64 v = 0, interp = 0;

	if (w->cfg.tstate_match == SPANPROF_PY_MATCH_NATIVE_TID) {
		w->want = tid;
	} else {
		struct task_struct *cur = sampled_task();

		w->want = BPF_CORE_READ(cur, thread.fsbase);
	}
	cached = bpf_map_lookup_elem(&py_threads, &tid);
	if (cached && cached->tgid == tgid) {
		if (cached->tstate == 0 && stamp - cached->stamp < PY_NO_THREAD_RETRY) {
			w->status = SPANPROF_PY_NO_THREAD;
			return 0;
		}
		if (cached->tstate && !read_ptr(&v, cached->tstate + w->cfg.tstate_thread TASK_A) &&
		    v == w->want)
			return cached->tstate;
	}

	if (read_ptr(&interp, w->cfg.runtime_addr + w->cfg.runtime_interp_head TASK_A) ||
	    (interp && read_ptr(&w->frame, interp + w->cfg.interp_threads_head TASK_A))) {
		w->status = SPANPROF_PY_READ_FAILED;
		return 0;
	}
	/* No interpreter yet (start-up) or any more (finalization): no thread state either. */
	w->status = SPANPROF_PY_NO_THREAD;
	if (!interp)
		return 0;
	{
		__u32 slot = w->slot;

		bpf_loop_task(PY_THREAD_LOOPS, py_thread_step, &slot, 0);
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

/*
 * After a walk of more frames than a sample holds: puts the ring of outermost frames in walk
 * order (through the window, free once the walk is over) and says how many frames were left out.
 */
static __always_inline void py_close_ring(struct scratch *w)
{
	__u32 head = (w->n - PY_INNER_FRAMES) & (SPANPROF_PY_OUTER_FRAMES - 1);
	__u32 base = w->py_base + PY_INNER_FRAMES * SPANPROF_PY_FRAME_SIZE;
	__u32 skipped = w->n - SPANPROF_MAX_PY_FRAMES;
	__u32 j, from, off;

	w->n = SPANPROF_MAX_PY_FRAMES;
	if (skipped > 0xffff)
		skipped = 0xffff;
	w->s.py_status |= SPANPROF_PY_SKIPPED | (skipped << SPANPROF_PY_SKIPPED_SHIFT);
	if (head == 0)
		return;
	if (base > sizeof(w->s.stack) + sizeof(w->s.py) -
			   SPANPROF_PY_OUTER_FRAMES * SPANPROF_PY_FRAME_SIZE)
		return;
	__builtin_memcpy(w->win, (__u8 *)w->s.stack + base,
			 SPANPROF_PY_OUTER_FRAMES * SPANPROF_PY_FRAME_SIZE);
	for (j = 0; j < SPANPROF_PY_OUTER_FRAMES; j++) {
		from = ((head + j) & (SPANPROF_PY_OUTER_FRAMES - 1)) * SPANPROF_PY_FRAME_SIZE;
		off = base + j * SPANPROF_PY_FRAME_SIZE;
		if (off > sizeof(w->s.stack) + sizeof(w->s.py) - SPANPROF_PY_FRAME_SIZE)
			return;
		/* Word by word: a memcpy at a variable offset is byte by byte, 32 times over. */
		((__u64 *)((__u8 *)w->s.stack + off))[0] = load_u64(w->win, from, SPANPROF_PY_WINDOW);
		((__u64 *)((__u8 *)w->s.stack + off))[1] = load_u64(w->win, from + 8, SPANPROF_PY_WINDOW);
		((__u64 *)((__u8 *)w->s.stack + off))[2] = load_u64(w->win, from + 16, SPANPROF_PY_WINDOW);
	}
}

int py_walk(__u32 slot, __u64 native TASK_GP)
{
	struct scratch *w = get_scratch(slot);
	const struct spanprof_py_proc *cfg;
	__u64 tstate, frame = 0;
	__u32 tgid;

	if (!w)
		return 0;
	tgid = w->s.pid;
	cfg = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!cfg)
		return 0;
	w->cfg = *cfg;
	w->n = 0;
	w->last_code = 0;
	w->win_base = 0;
	w->win_len = 0;
	w->py_base = native * sizeof(__u64);
	tstate = py_thread_state(w, tgid, w->s.tid TASK_A);
	w->tstate = tstate;
	if (!tstate) {
		w->s.py_status = w->status;
		if (w->status == SPANPROF_PY_READ_FAILED)
			count_error(SPANPROF_ERR_PY_READ);
		return 0;
	}
	w->s.py_status = SPANPROF_PY_OK;
	if (read_ptr(&frame, tstate + w->cfg.tstate_frame TASK_A))
		goto fault;
	if (frame && w->cfg.cframe_current != SPANPROF_PY_NO_OFFSET &&
	    read_ptr(&frame, frame + w->cfg.cframe_current TASK_A))
		goto fault;
	w->frame = frame;
	bpf_loop_task(PY_FRAME_LOOPS, py_frame_step, &slot, 0);
	/* Steps ran out with frames left: a cycle, or shims beyond the bound. */
	if (w->frame && !(w->s.py_status & SPANPROF_PY_TRUNCATED))
		w->s.py_status |= SPANPROF_PY_TRUNCATED;
	if (w->n > SPANPROF_MAX_PY_FRAMES)
		py_close_ring(w);
	w->s.py_len = w->n;
	if ((w->s.py_status & SPANPROF_PY_STATUS_MASK) == SPANPROF_PY_READ_FAILED)
		count_error(SPANPROF_ERR_PY_READ);
	return 0;
fault:
	w->s.py_status = SPANPROF_PY_READ_FAILED;
	count_error(SPANPROF_ERR_PY_READ);
	return 0;
}
