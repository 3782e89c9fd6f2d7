// SPDX-License-Identifier: GPL-2.0
/*
 * The copy of a sampled thread's user stack for --unwind dwarf (declared in send_sample.h), a
 * global BPF function verified once on its own in each sampling program. No program of its own.
 *
 * Bounds: at most SPANPROF_MAX_STACK_COPY bytes (one read for the main thread's stack, else one
 * read per page), then at most URETPROBE_FIXUPS return addresses put back.
 */
#include "send_sample.h"

/* Pending uretprobes whose return addresses are put back in a stack copy, at most. */
#define URETPROBE_FIXUPS 8

/*
 * Bytes of the main thread's stack copied above its initial stack pointer (mm->start_stack,
 * where argc is): _start's own frame is within a few words of it, and argv, envp and the auxv
 * above it are mapped.
 */
#define MAIN_STACK_SLACK 256

/* Pages of a stack copy at most: one that does not start on a page boundary spans one more. */
#define COPY_PAGES (SPANPROF_MAX_STACK_COPY / 4096 + 1)

/*
 * One page of the stack copy (to the page's end, or to the size wanted), as a bpf_loop callback:
 * checked by the verifier once, where a loop in copy_user_stack was checked for every path into
 * it (a third of on_cpu_sample's instructions). 1 ends the copy: all of it done, or an
 * unreadable page.
 */
static long copy_page_step(__u64 i, void *ctx)
{
	LOOP_TASK(ctx)
	struct scratch *w = loop_scratch(ctx);
	__u64 done, want, len, off;

	if (!w)
		return 1;
	done = w->cp_done;
	want = w->cp_want;
	off = w->cp_off;
	if (done >= want || done >= SPANPROF_MAX_STACK_COPY ||
	    off > sizeof(w->s.stack) + sizeof(w->s.py) + sizeof(w->s.span))
		return 1;
	len = 4096 - ((w->cp_sp + done) & 4095);
	if (len > want - done)
		len = want - done;
	/*
	 * For the verifier: the destination ends within s.ustack plus a page (ustack_slack). A
	 * kernel before 6.8 learns no bound from the comparison of two registers above, and clang
	 * would drop a check it can prove redundant.
	 */
	asm volatile("" : "+r"(len));
	if (len == 0 || len > 4096)
		return 1;
	if (user_read((__u8 *)w->s.stack + off + done, len, (const void *)(w->cp_sp + done)))
		return 1;
	w->cp_done = done + len;
	return 0;
}

/*
 * See send_sample.h. The main thread's stack ends at its initial stack pointer (plus
 * MAIN_STACK_SLACK): a sample within the copy size of it copies just that, in one read, and the
 * copy is marked as reaching the top. Any other stack is copied page by page up to the first
 * unreadable page: a thread's stack is mapped with its thread's TLS above it and often nothing
 * readable after that, and one read across the end would copy up to the fault, clear the whole
 * destination, then be done again page by page.
 */
int copy_user_stack(__u32 at, __u64 off TASK_GP)
{
	struct scratch *w = get_scratch(at);
#ifndef SPANPROF_TASK_READS
	struct task_struct *task = bpf_get_current_task_btf();
#endif
	struct pt_regs___kernel *regs = (struct pt_regs___kernel *)bpf_task_pt_regs(task);
	struct spanprof_sample *s;
	struct return_instance *ri;
	const __u32 *size;
	__u64 slot, ret, sp, want, done = 0, top;
	int whole = 0;
	__u32 tgid;
	__u8 *dst;
	int i;

	if (!w)
		return 0;
	s = &w->s;
	tgid = s->pid;
	size = bpf_map_lookup_elem(&stack_copy_sizes, &tgid);
	want = (size ? *size : stack_copy_bytes) & ~7U;
#ifdef SPANPROF_TASK_READS
	/*
	 * --unwind fp: the kernel walks the frame pointers of the current thread only; the task
	 * iterator copies another's stack (16 KiB, --unwind dwarf's default), unwound in user space.
	 */
	if (!want)
		want = 16384;
#endif

	if (want > SPANPROF_MAX_STACK_COPY)
		want = SPANPROF_MAX_STACK_COPY;
	if (!regs) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_NO_REGS;
		return 0;
	}
	s->user_ip = BPF_CORE_READ(regs, ip);
	sp = BPF_CORE_READ(regs, sp);
	s->user_sp = sp;
	s->user_bp = BPF_CORE_READ(regs, bp);
	if (!sp || !s->user_ip) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_NO_REGS;
		return 0;
	}
	if (off > sizeof(s->stack) + sizeof(s->py) + sizeof(s->span))
		return 0;
	dst = (__u8 *)s->stack + off;
	top = BPF_CORE_READ(task, mm, start_stack);
	if (top && sp < top && top - sp + MAIN_STACK_SLACK <= want) {
		want = (top - sp + MAIN_STACK_SLACK) & ~7ULL;
		whole = 1;
	}
	/*
	 * For the verifier: it was no more than that, but a kernel before 6.8 does not learn a
	 * bound from the comparison of two registers above, and clang would drop a check it can
	 * prove redundant.
	 */
	asm volatile("" : "+r"(want));
	if (want > SPANPROF_MAX_STACK_COPY)
		want = SPANPROF_MAX_STACK_COPY;
	/*
	 * Whether the copy reaches the top goes into the record now and is read back at the end:
	 * kept in a register to the end, it had the verifier check what follows once more.
	 */
	s->ustack_copy_status = whole ? SPANPROF_USTACK_COPY_SHORT : 0;
	if (whole && user_read(dst, want, (const void *)sp) == 0) {
		done = want;
	} else {
		__u32 loop_slot = at;

		w->cp_sp = sp;
		w->cp_off = off;
		w->cp_want = want;
		w->cp_done = 0;
		bpf_loop_task(COPY_PAGES, copy_page_step, &loop_slot, 0);
		done = w->cp_done;
		if (done > want)
			done = want;
	}
	if (done == 0) {
		s->ustack_copy_status = SPANPROF_USTACK_COPY_FAULT;
		return 0;
	}
	s->ustack_copy_status = SPANPROF_USTACK_COPY_OK |
				((done < want ? SPANPROF_USTACK_COPY_SHORT : 0) |
				 (*(volatile __u32 *)&s->ustack_copy_status & SPANPROF_USTACK_COPY_SHORT));
	s->ustack_copy_len = done;
	/*
	 * A function with a pending uretprobe (--event heap's on the allocation functions) returns
	 * to the uprobes trampoline, not to its caller: put the caller back, or the unwinder stops
	 * there (realloc(NULL) calling malloc showed [unknown] (?+0x7fffffffdfff)). The length is
	 * read back from the record, so the verifier checks this loop once, not once for each path
	 * that set it (the one-read copy, the page loop, the comparisons with `want`).
	 */
	done = *(volatile __u32 *)&s->ustack_copy_len;
	ri = BPF_CORE_READ(task, utask, return_instances);
	for (i = 0; i < URETPROBE_FIXUPS && ri; i++) {
		slot = BPF_CORE_READ(ri, stack);
		if (slot >= sp && slot - sp + 8 <= done && slot - sp <= SPANPROF_MAX_STACK_COPY - 8) {
			ret = BPF_CORE_READ(ri, orig_ret_vaddr);
			*(__u64 *)(dst + ((slot - sp) & (SPANPROF_MAX_STACK_COPY - 1))) = ret;
		}
		ri = BPF_CORE_READ(ri, next);
	}
	return 0;
}
