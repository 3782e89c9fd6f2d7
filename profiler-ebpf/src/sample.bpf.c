// SPDX-License-Identifier: GPL-2.0
/*
 * On-CPU sampling: the perf_event program attached to the software cpu-clock event of every
 * CPU, at the session's frequency. A sample of a thread of a target (`target_pids`) is its
 * kernel stack, then what send_sample.h adds (user stack or stack copy, Python frames, span
 * context), sent as one ring buffer record.
 *
 * Bounds: one hash lookup to filter, one bpf_get_stack for the kernel stack (none for a sample
 * taken in user mode), then send_sample's bounded work. A perf_event program does not run inside
 * another on its CPU: it has the CPU's SCRATCH_CPU scratch to itself.
 */
#include "send_sample.h"

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

	/*
	 * A sample taken in user mode (privilege level 3 in the code segment selector) has no
	 * kernel stack, and bpf_get_stack is not asked to find none: the call cost 1.5-2.4 µs of a
	 * sample at 99 Hz (measured with a program that stops before it and one that stops after
	 * it). In kernel mode, 0 frames or -EFAULT are not errors either. NB: `cs` of the uapi
	 * pt_regs (linux/bpf_perf_event.h) is a whole word, as the context's access rules want;
	 * a vmlinux.h's pt_regs (6.9+) has a 2-byte `cs` the verifier would refuse to load.
	 */
	if ((ctx->regs.cs & 3) == 3)
		n = 0;
	else
		n = bpf_get_stack(ctx, s->stack, SPANPROF_MAX_STACK_DEPTH * sizeof(__u64), 0);
	if (n < 0 && n != -EFAULT)
		count_error(SPANPROF_ERR_KSTACK);
	s->kstack_len = n < 0 ? (__s32)n : (__s32)(n / sizeof(__u64));
	send_sample(ctx, w, n > 0 ? (__u64)n / sizeof(__u64) : 0, 1);
	return 0;
}
