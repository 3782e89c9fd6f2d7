/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A sample, from its header to its ring buffer record, as the three sampling units (sample,
 * offcpu, alloc) send it once they have put its kernel frames in place: the user stack (the
 * kernel's frame-pointer walk, or a copy of the stack for --unwind dwarf), the Python frames,
 * the span context, then one bpf_ringbuf_output of only the parts captured.
 *
 * Bounds: one bpf_get_stack of at most SPANPROF_MAX_STACK_DEPTH frames, or a stack copy of at
 * most SPANPROF_MAX_STACK_COPY bytes (one read for the main thread's stack, else one read per
 * page) with at most a few return addresses put back (user_stack.bpf.c); the Python walk
 * (python_walk.bpf.c) and the span readers (span_read.bpf.c), each bounded on its own; one
 * record.
 */
#ifndef SPANPROF_SEND_SAMPLE_H
#define SPANPROF_SEND_SAMPLE_H

#include "python_walk.h"
#include "span_read.h"

/*
 * Blocked time from which an off-CPU sample wakes user space at once (100 ms): at most ten
 * wake-ups a second per blocked thread.
 */
#define OFFCPU_WAKE_NS 100000000ULL

/*
 * --unwind dwarf: the thread's user registers, and its stack from the user sp upwards into the
 * record at byte `off` of the stacks of the sample in the scratch of `slot` (right after the
 * span context). A global function (user_stack.bpf.c), verified once on its own: inlined, it
 * was checked again on every path of the sampling program that reached it (its loop that puts
 * back return addresses, once for every length the copy could end with: two thirds of the
 * verifier's work on each sampling program). Returns 0.
 */
int copy_user_stack(__u32 slot, __u64 off TASK_GP);

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
 * `ctx` is the program's context, for bpf_get_stack. Returns 0 when the record was sent, else
 * nonzero (the ring buffer was full: counted).
 */
static __always_inline int send_sample(void *ctx, struct scratch *w, __u64 k, int user TASK_P)
{
	struct spanprof_sample *s = &w->s;
	struct spanprof_target *t;
	struct task_struct *cur;
	__u32 tgid = s->pid, seen;
	__u64 u, p, size, off, ip, wake = BPF_RB_NO_WAKEUP;
	long n = 0;

	if (k > SPANPROF_MAX_STACK_DEPTH)
		k = SPANPROF_MAX_STACK_DEPTH;
	/*
	 * --unwind dwarf copies the stack instead (below), after the parts that go before it. The
	 * kernel walks the frame pointers of the current thread only: a dump always copies.
	 */
#ifndef SPANPROF_TASK_READS
	if (user && !stack_copy_bytes)
		n = bpf_get_stack(ctx, &s->stack[k], SPANPROF_MAX_STACK_DEPTH * sizeof(__u64),
				  BPF_F_USER_STACK);
#endif
	if (n < 0)
		count_error(SPANPROF_ERR_USTACK);
	s->ustack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	u = n > 0 ? (__u64)n / sizeof(__u64) : 0;
	if (u > SPANPROF_MAX_STACK_DEPTH)
		u = SPANPROF_MAX_STACK_DEPTH;

	if (user)
		py_walk(w->slot, k + u TASK_A);
	p = s->py_len;
	if (p > SPANPROF_MAX_PY_FRAMES)
		p = SPANPROF_MAX_PY_FRAMES;
	/*
	 * Any process with a `span_procs` entry: a Python process's objects, or the thread context
	 * a process of any language publishes (w->tstate is 0 outside Python: only that is read).
	 */
	if (user && read_span(w->slot, (k + u) * sizeof(__u64) + p * SPANPROF_PY_FRAME_SIZE TASK_A))
		s->span_len = sizeof(w->span);

	off = (k + u) * sizeof(__u64) + p * SPANPROF_PY_FRAME_SIZE + s->span_len;
	if (user && (stack_copy_bytes || IS_TASK_READS))
		copy_user_stack(w->slot, off TASK_A);

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
#ifdef SPANPROF_TASK_READS
		cur = task;
#else
		cur = bpf_get_current_task_btf();
#endif
		if (ip && ip >= BPF_CORE_READ(cur, mm, start_code) &&
		    ip < BPF_CORE_READ(cur, mm, end_code))
			seen |= SPANPROF_TARGET_SEEN_MAIN;
		if (seen & ~t->flags) {
			t->flags |= seen;
			wake = BPF_RB_FORCE_WAKEUP;
		}
	}
	/*
	 * A long wait wakes user space too: its Python frames are named from the process's memory,
	 * and the wait a process ends with (joining its threads, a last sleep) is often over only
	 * milliseconds before the interpreter frees its code objects and exits. At most one wake-up
	 * per OFFCPU_WAKE_NS of a thread's blocked time.
	 */
	if (s->event == SPANPROF_EVENT_OFFCPU && s->blocked_ns >= OFFCPU_WAKE_NS)
		wake = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > wakeup_bytes)
		wake = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wake)) {
		count_error(SPANPROF_ERR_RINGBUF_FULL);
		return 1;
	}
	return 0;
}

#endif /* SPANPROF_SEND_SAMPLE_H */
