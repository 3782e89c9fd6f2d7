// SPDX-License-Identifier: GPL-2.0
/*
 * Off-CPU sampling (--event offcpu, wall): sched_switch measures the intervals the targets'
 * threads spend blocked (and, for --event wall, waiting runnable) and keeps some by sampling;
 * the thread's next system call exit sends what was kept as one sample with its user and
 * Python stacks and span context, read in the thread's own context. State per thread is task
 * storage (`offcpu_tasks`, struct spanprof_offcpu_task).
 *
 * Bounds: on_switch does two task storage lookups, a hash lookup and, for a kept interval that
 * starts a pending sample, one bpf_get_task_stack; on_sys_exit one task storage lookup for
 * every system call exit on the host, and for a pending sample one kernel read of its saved
 * stack and send_sample's bounded work (SCRATCH_OFFCPU scratch).
 */
#include "send_sample.h"

/*
 * The blocked interval of `t` ends at `now`: kept or not by the sampling, and if kept added to
 * the thread's pending sample (intervals of one system call add up). `task` is the thread while
 * still switched out, whose saved kernel stack is where it blocked; NULL when that stack is
 * gone (the interval's end was found late), and the sample then has no kernel frames.
 */
static __always_inline void end_interval(struct spanprof_offcpu_task *t, __u64 now,
					 struct task_struct *task)
{
	__u64 start = t->off_ts, d = now - start, weight;
	long n = 0;

	t->off_ts = 0;
	/* Restarted after `now` was read: by the task iterator's pass (dump.task.c). */
	if (start >= now)
		return;
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
