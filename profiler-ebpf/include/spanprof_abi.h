/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The kernel/user ABI of spanprof: the one place that defines what the eBPF programs send to
 * user space. The Rust mirror is profiler-common/src/lib.rs; its tests compile static asserts
 * generated from the Rust layout against this header, so the two cannot drift apart silently.
 *
 * Rules: fixed-width types only, explicit padding, no bool, every struct a multiple of 8 bytes.
 */
#ifndef SPANPROF_ABI_H
#define SPANPROF_ABI_H

#ifdef __BPF__
#include <linux/types.h>
#else
#include <stdint.h>
typedef uint8_t __u8;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
#endif

/* perf's default kernel.perf_event_max_stack; bpf_get_stack never returns more. */
#define SPANPROF_MAX_STACK_DEPTH 127
#define SPANPROF_TASK_COMM_LEN 16

/* Record kinds, first field of every ring buffer record. */
#define SPANPROF_RECORD_SAMPLE 1

/* Indexes of the per-CPU error counters (map `errors`). */
enum spanprof_error {
	/* The ring buffer was full: the sample is lost (counted, reported). */
	SPANPROF_ERR_RINGBUF_FULL = 0,
	/* bpf_get_stack failed for the kernel stack. */
	SPANPROF_ERR_KSTACK = 1,
	/* bpf_get_stack failed for the user stack. */
	SPANPROF_ERR_USTACK = 2,
	/* A child process could not be added to `target_pids` (map full). */
	SPANPROF_ERR_PID_MAP_FULL = 3,
	SPANPROF_ERR_COUNT = 8,
};

/* Value of `target_pids`: why a process is profiled. */
#define SPANPROF_TARGET_EXPLICIT 1 /* named by the user (--pid, or the -- command) */
#define SPANPROF_TARGET_CHILD 2    /* forked by a profiled process */

struct spanprof_target {
	__u32 flags; /* SPANPROF_TARGET_* */
	__u32 parent_tgid; /* 0 for explicit targets */
};

/*
 * One on-CPU sample. The ring buffer record is variable-sized: the header, then only the frames
 * captured, kernel frames first. Its size is SPANPROF_SAMPLE_HEADER_SIZE + 8 * (k + u), where k
 * and u are kstack_len and ustack_len clamped to [0, SPANPROF_MAX_STACK_DEPTH].
 */
struct spanprof_sample {
	__u32 kind; /* SPANPROF_RECORD_SAMPLE */
	__u32 cpu;
	__u32 pid; /* tgid */
	__u32 tid;
	__u64 time_ns; /* bpf_ktime_get_ns(), CLOCK_MONOTONIC */
	/* Number of frames captured, or a negative errno from bpf_get_stack. */
	__s32 kstack_len;
	__s32 ustack_len;
	char comm[SPANPROF_TASK_COMM_LEN];
	/* Kernel frames, then user frames, each leaf first. */
	__u64 stack[2 * SPANPROF_MAX_STACK_DEPTH];
};

#define SPANPROF_SAMPLE_HEADER_SIZE 48

#endif /* SPANPROF_ABI_H */
