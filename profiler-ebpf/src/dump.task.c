// SPDX-License-Identifier: GPL-2.0
/*
 * `spanprof dump`: a sleepable task iterator that sends, for every thread of a target
 * (target_pids) that is off its CPU, the record an off-CPU sample would be: its kernel stack,
 * its user registers and stack copy, its Python frames and span context, read from its process's
 * memory with bpf_copy_from_user_task (helpers.h: this unit is built with SPANPROF_TASK_READS
 * only). A thread that is runnable (preempted, waiting for a CPU) gets a timer sample's record
 * instead: its saved registers are as stable. A thread on a CPU is left to the timer sampler:
 * its saved registers are not where it is now. The reads race with the thread only if it runs
 * meanwhile (then its record mixes two moments, as a sample of a running thread may).
 *
 * In an off-CPU session (offcpu_enabled) it counts instead the intervals still open: a blocked
 * thread of a target whose interval started (on_switch, or user space at the start for threads
 * blocked before it) gets a record of the time from then to now, sampled as any interval
 * (offcpu.bpf.c), and its interval goes on from now: what a session's end or a daemon's window
 * would otherwise leave out, a thread stuck for the whole session included.
 *
 * Bounds: one hash lookup per task of the system, then for a target's blocked thread one task
 * storage lookup, one bpf_get_task_stack and send_sample's bounded work, in the iterator's own
 * scratch.
 */
#include "send_sample.h"

/*
 * The weight of the open interval of `task` up to now, 0 when the sampling does not keep it (or
 * none is open); the interval then starts again at now, and `*start` is where it began. Not
 * atomic (atomics that return a value need BPF v3 code): a thread that wakes on another CPU
 * between this read and write has its interval counted here and by on_switch, and keeps a
 * start it will end at its next system call exit (counted as SPANPROF_ERR_OFFCPU_LATE); the
 * window is these few instructions, once per pass. on_switch drops an interval restarted after
 * its own clock read.
 */
static __always_inline __u64 open_interval(struct spanprof_offcpu_task *t, __u64 *start,
					   __u64 *blocked, __u32 *flags)
{
	__u64 now = bpf_ktime_get_ns(), d;

	*start = t->off_ts;
	if (!*start || *start >= now)
		return 0;
	d = now - *start;
	t->off_ts = now;
	*blocked = d;
	*flags = t->off_flags;
	if (d < offcpu_min_ns)
		return 0;
	if (d >= offcpu_period_ns)
		return d;
	/* As end_interval: kept with probability d / period, weight period. */
	if ((__u64)bpf_get_prandom_u32() * offcpu_period_ns < (d << 32))
		return offcpu_period_ns;
	return 0;
}

SEC("iter.s/task")
int dump_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct pt_regs___kernel *regs;
	struct spanprof_sample *s;
	struct scratch *w;
	struct spanprof_offcpu_task *t = 0;
	__u32 tgid, state, flags = 0;
	__u64 k, weight = 0, blocked = 0, start = 0, restarted = 0;
	long n;

	if (!task)
		return 0;
	tgid = task->tgid;
	if (tgid == 0 || !bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	state = task->__state;
	if ((state & TASK_DEAD) || task->on_cpu)
		return 0;
	if (offcpu_enabled) {
		if (!state)
			return 0;
		t = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);
		if (!t)
			return 0;
		weight = open_interval(t, &start, &blocked, &flags);
		if (!weight)
			return 0;
		restarted = t->off_ts;
	}
	w = get_scratch(0);
	if (!w)
		return 0;
	s = begin_sample(w, ((__u64)tgid << 32) | (__u32)task->pid, 0);
	bpf_probe_read_kernel_str(s->comm, sizeof(s->comm), task->comm);
	if (offcpu_enabled) {
		s->event = SPANPROF_EVENT_OFFCPU;
		s->weight = weight;
		s->blocked_ns = blocked;
		s->offcpu_flags = flags;
	} else {
		/* Blocked: not an interval, a weight of 1 ns (the records' count is the threads'). */
		s->event = state ? SPANPROF_EVENT_OFFCPU : SPANPROF_EVENT_CPU;
		s->weight = state ? 1 : 0;
		s->offcpu_flags = BPF_CORE_READ_BITFIELD_PROBED(task, in_iowait) ?
					  SPANPROF_OFFCPU_IOWAIT :
					  0;
	}
	regs = (struct pt_regs___kernel *)bpf_task_pt_regs(task);
	if (regs) {
		s->syscall_nr = (__s32)BPF_CORE_READ(regs, orig_ax);
		s->syscall_arg0 = BPF_CORE_READ(regs, di);
	}
	n = bpf_get_task_stack(task, s->stack, SPANPROF_MAX_STACK_DEPTH * sizeof(__u64), 0);
	if (n < 0)
		count_error(SPANPROF_ERR_KSTACK);
	s->kstack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	k = n > 0 ? (__u64)n / sizeof(__u64) : 0;
	/* Not sent (the ring buffer full): the interval is left to be counted later, whole. */
	if (send_sample(ctx, w, k, 1 TASK_A) && offcpu_enabled) {
		t = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);
		if (t && t->off_ts == restarted)
			t->off_ts = start;
	}
	return 0;
}
