/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every unit of spanprof's eBPF object includes first: libbpf's headers, the kernel/user
 * ABI (spanprof_abi.h), and the few kernel types the programs read. Declarations only.
 */
#ifndef SPANPROF_KERNEL_H
#define SPANPROF_KERNEL_H

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "spanprof_abi.h"

#define EFAULT 14 /* include/uapi/asm-generic/errno-base.h */

/*
 * Kernel types read here. CO-RE relocates the fields by name against the running
 * kernel's BTF, so these stubs stand in for a full vmlinux.h.
 */
struct thread_struct {
	unsigned long fsbase; /* x86_64: the thread's FS base, which glibc's pthread_self() is */
} __attribute__((preserve_access_index));

/*
 * A pending uretprobe of the thread (kernel/events/uprobes.c): the return address at `stack` (the
 * sp at the function's entry) was replaced with the uprobes trampoline's; `orig_ret_vaddr` is the
 * real one. Newest first.
 */
struct return_instance {
	unsigned long stack;
	unsigned long orig_ret_vaddr;
	struct return_instance *next;
} __attribute__((preserve_access_index));

struct uprobe_task {
	struct return_instance *return_instances;
} __attribute__((preserve_access_index));

/* A process's address space: where exec put its program's code (the load bias applied). */
struct mm_struct {
	unsigned long start_code;
	unsigned long end_code;
	unsigned long start_stack; /* the main thread's initial stack pointer (argc) */
} __attribute__((preserve_access_index));

/* A kuid_t or kgid_t (a struct of one id, so that the two are not mixed). */
struct spanprof_kid {
	unsigned int val;
};

/* The capability set of 6.3+ (before: two 32-bit words, `cap`, not read here). */
struct spanprof_kcap {
	unsigned long long val;
};

/* A task's credentials (include/linux/cred.h): what an exec may have changed. */
struct cred {
	struct spanprof_kid uid, gid, suid, sgid, euid, egid;
	struct spanprof_kcap cap_permitted;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	unsigned int __state; /* 0: running or runnable; else why it is off the CPU (5.14+) */
	int on_cpu;	      /* on a CPU now (its saved registers are not where it is) */
	char comm[16];
	unsigned int in_iowait : 1; /* set by io_schedule() around a wait for I/O */
	struct thread_struct thread;
	struct uprobe_task *utask;
	struct mm_struct *mm;
	const struct cred *cred;
} __attribute__((preserve_access_index));

/*
 * The registers a task entered the kernel with (bpf_task_pt_regs): its user-mode state. The
 * kernel's own names (the uapi `struct pt_regs` of bpf_perf_event.h has others); CO-RE drops the
 * `___kernel` flavor suffix when it matches the type.
 */
struct pt_regs___kernel {
	unsigned long bp;
	unsigned long di;
	unsigned long orig_ax; /* in a system call: its number */
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* The context of a task iterator program (kernel/bpf/task_iter.c): one task per run. */
struct bpf_iter_meta {
	void *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task; /* NULL at the end */
} __attribute__((preserve_access_index));

/* include/linux/sched.h: a task leaving the CPU for good. */
#define TASK_DEAD 0x80

#endif /* SPANPROF_KERNEL_H */
