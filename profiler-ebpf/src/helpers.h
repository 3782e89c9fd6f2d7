/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Small helpers every unit shares: the error counters, the CPU's scratch, bounded loads from
 * buffers read from a target, and one pointer read of target memory. All inlined; none loops.
 */
#ifndef SPANPROF_HELPERS_H
#define SPANPROF_HELPERS_H

#include "maps.h"

/*
 * Whose memory the walks read. A sampling program runs in the sampled thread: it reads its own
 * process's memory (bpf_probe_read_user). `spanprof dump`'s task iterator (dump.task.c) runs in
 * spanprof's thread and reads another process's: build.rs compiles python_walk.bpf.c,
 * span_read.bpf.c and user_stack.bpf.c a second time with SPANPROF_TASK_READS, where every
 * function that reads takes the thread's task as one more argument (TASK_P, passed on with
 * TASK_A; a global function's is tagged trusted, TASK_GP), reads with bpf_copy_from_user_task
 * (a sleepable helper), and is renamed with a _task suffix so that both builds link into one
 * object. A bpf_loop callback gets the task from its context (LOOP_TASK). In the sampling build
 * all of this is empty.
 */
#ifdef SPANPROF_TASK_READS
#define TASK_P , struct task_struct *task
#define TASK_GP , struct task_struct *task __attribute__((btf_decl_tag("arg:trusted")))
#define TASK_A , task
#define user_read(dst, len, src) bpf_copy_from_user_task((dst), (len), (const void *)(src), task, 0)
/* The context of a bpf_loop callback: the scratch slot first, as loop_scratch reads it. */
struct loop_ctx {
	__u32 slot;
	__u32 _pad;
	struct task_struct *task;
};
#define bpf_loop_task(n, cb, slotp, flags)                                                         \
	bpf_loop((n), (cb), &(struct loop_ctx){ .slot = *(slotp), .task = task }, (flags))
#define LOOP_TASK(ctx) struct task_struct *task = ((struct loop_ctx *)(ctx))->task;
/* The task whose thread registers (fsbase) are read. */
#define sampled_task() (task)
#define IS_TASK_READS 1
#define py_frame py_frame_task
#define py_walk py_walk_task
#define uuid_at uuid_at_task
#define hex64_at hex64_at_task
#define span_name span_name_task
#define span_published span_published_task
#define span_otel span_otel_task
#define span_osp span_osp_task
#define span_thread_name span_thread_name_task
#define read_span read_span_task
#define copy_user_stack copy_user_stack_task
#define keys_find keys_find_task
#else
#define TASK_P
#define TASK_GP
#define TASK_A
#define user_read(dst, len, src) bpf_probe_read_user((dst), (len), (const void *)(src))
#define bpf_loop_task(n, cb, slotp, flags) bpf_loop((n), (cb), (slotp), (flags))
#define LOOP_TASK(ctx)
#define sampled_task() ((struct task_struct *)bpf_get_current_task())
#define IS_TASK_READS 0
#endif

static __always_inline void count_error(__u32 code)
{
	__u64 *n = bpf_map_lookup_elem(&errors, &code);

	if (n)
		*n += 1;
}

/* Adds `ns` to a per-CPU counter of the errors map that holds a time, not a count. */
static __always_inline void count_ns(__u32 code, __u64 ns)
{
	__u64 *n = bpf_map_lookup_elem(&errors, &code);

	if (n)
		*n += ns;
}

static __always_inline struct scratch *get_scratch(__u32 slot)
{
#ifdef SPANPROF_TASK_READS
	/*
	 * The iterator's own scratch, after every CPU's: it may sleep, and others run meanwhile.
	 * Its slot is 0 (the slot is added all the same: an argument a function does not use is
	 * passed as garbage by clang, which the verifier refuses for a global function's).
	 */
	__u32 key = dump_scratch_key + slot;
#else
	__u32 key = bpf_get_smp_processor_id() * SPANPROF_SCRATCH_SLOTS + slot;
#endif

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

static __always_inline int read_ptr(__u64 *out, __u64 addr TASK_P)
{
	return user_read(out, sizeof(*out), (const void *)addr);
}

#endif /* SPANPROF_HELPERS_H */
