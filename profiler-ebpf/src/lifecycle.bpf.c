// SPDX-License-Identifier: GPL-2.0
/*
 * The targets' lifecycle, in the kernel so that nothing is missed while user space catches up:
 * fork adds the children of targets (--follow-children) with their parent's Python and span
 * configuration; exec forgets what belonged to the old program and tells user space; the exit
 * of a thread group leader removes the process and tells user space.
 *
 * Bounds: raw tracepoints on every fork, exec and exit on the host; a hash lookup to filter,
 * then a fixed handful of map updates or deletes and at most one ring buffer record.
 */
#include "helpers.h"

/* Forgets process `tgid`: no longer a target, nothing kept of its program. */
static __always_inline void forget_process(__u32 tgid)
{
	bpf_map_delete_elem(&target_pids, &tgid);
	bpf_map_delete_elem(&py_procs, &tgid);
	bpf_map_delete_elem(&span_procs, &tgid);
	bpf_map_delete_elem(&stack_copy_sizes, &tgid);
}

/*
 * Whether the program `task` just exec'd runs with credentials a guarded spanprof may not read
 * (see guard_exec): any of its user and group ids other than spanprof's, or a capability
 * spanprof lacks. The capability set is read on 6.3+ only (its layout before differs).
 */
static __always_inline int other_credentials(struct task_struct *task)
{
	const struct cred *c = BPF_CORE_READ(task, cred);
	__u32 uid = guard_uid, gid = guard_gid;

	if (BPF_CORE_READ(c, uid.val) != uid || BPF_CORE_READ(c, euid.val) != uid ||
	    BPF_CORE_READ(c, suid.val) != uid || BPF_CORE_READ(c, gid.val) != gid ||
	    BPF_CORE_READ(c, egid.val) != gid || BPF_CORE_READ(c, sgid.val) != gid)
		return 1;
	if (bpf_core_field_exists(c->cap_permitted.val))
		return (BPF_CORE_READ(c, cap_permitted.val) & ~guard_caps) != 0;
	return 0;
}

/*
 * execve replaces the address space: the process's CPython (if any) is gone, and user space,
 * told by an exec record, looks again. A guarded spanprof (guard_exec) drops a target whose
 * new program has other credentials, before it runs, and tells user space.
 */
SEC("raw_tp/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, int old_pid)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32, old = (__u32)old_pid;
	struct spanprof_exec e = {};
	struct spanprof_target *t = bpf_map_lookup_elem(&target_pids, &tgid);

	if (!t)
		return 0;
	if (guard_exec && other_credentials(task)) {
		forget_process(tgid);
		bpf_map_delete_elem(&py_threads, &old);
		bpf_map_delete_elem(&py_threads, &tgid);
		e.kind = SPANPROF_RECORD_REFUSED;
		e.pid = tgid;
		e.time_ns = bpf_ktime_get_ns();
		if (bpf_ringbuf_output(&samples, &e, sizeof(e), BPF_RB_FORCE_WAKEUP))
			count_error(SPANPROF_ERR_RINGBUF_FULL);
		return 0;
	}
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
	/*
	 * User space looks for the new program's interpreter at once (and again every few ms
	 * while the dynamic loader maps it): its first Python code is walked, not its 50th ms.
	 */
	if (bpf_ringbuf_output(&samples, &e, sizeof(e), BPF_RB_FORCE_WAKEUP))
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
		forget_process(tgid);
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
