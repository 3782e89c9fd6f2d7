// SPDX-License-Identifier: GPL-2.0
/*
 * spanprof's eBPF programs: on-CPU sampling and following children of profiled processes.
 *
 * Kept small and bounded: no loops, two bpf_get_stack calls per sample, one ring buffer record.
 * Everything that can fail is counted in `errors` so user space can report it.
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
struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

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

/* Where a sample is assembled before the used part is copied into the ring buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct spanprof_sample);
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

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 zero = 0;
	struct spanprof_sample *s;
	__u64 k, u, size;
	long n;

	if (tgid == 0 || !bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	s->kind = SPANPROF_RECORD_SAMPLE;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = tgid;
	s->tid = (__u32)id;
	s->time_ns = bpf_ktime_get_ns();
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

	/* Only the frames captured travel: a 10-frame stack is 128 bytes, not 2 KiB. */
	size = SPANPROF_SAMPLE_HEADER_SIZE + (k + u) * sizeof(__u64);
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
 * A process leaves the target set when its thread group leader exits, so a pid the kernel reuses
 * later is not profiled by mistake and fork-heavy commands do not fill the map. (A leader that
 * exits before its other threads ends profiling of those threads too: rare, and accepted.)
 */
SEC("raw_tp/sched_process_exit")
int BPF_PROG(on_process_exit, struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);

	if ((__u32)BPF_CORE_READ(task, pid) == tgid)
		bpf_map_delete_elem(&target_pids, &tgid);
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

	if (!follow_children)
		return 0;
	ptgid = BPF_CORE_READ(parent, tgid);
	ctgid = BPF_CORE_READ(child, tgid);
	if (ptgid == ctgid || !bpf_map_lookup_elem(&target_pids, &ptgid))
		return 0;
	t.flags = SPANPROF_TARGET_CHILD;
	t.parent_tgid = ptgid;
	if (bpf_map_update_elem(&target_pids, &ctgid, &t, BPF_ANY))
		count_error(SPANPROF_ERR_PID_MAP_FULL);
	return 0;
}
