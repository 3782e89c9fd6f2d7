// SPDX-License-Identifier: GPL-2.0
/*
 * Allocations (--event alloc, heap): uprobes on the malloc family and mmap of the C library
 * (CPython's small objects come from arenas it maps). Sampled by bytes: a per-CPU countdown of
 * bytes to the next sample, reset after each sample to a gap drawn from an exponential
 * distribution whose mean is the sampling rate (alloc_gaps, filled by user space), so each byte
 * allocated has the same chance to be sampled and an allocation of s bytes is sampled with
 * probability 1 - exp(-s / rate); user space scales by its inverse. alloc_rate <= 1 samples
 * every allocation. With --event heap, a sampled allocation's address (from the uretprobe) is
 * kept in `alloc_live` until free, realloc or munmap takes it out.
 *
 * Bounds: every probed call traps (uprobes cannot be sampled), so the common path is short: a
 * hash lookup of the target and a per-CPU countdown (an mmap first reads its return address). A
 * sampled call adds send_sample's bounded work (SCRATCH_ALLOC scratch, taken with a busy flag)
 * and, for --event heap, one hash update; a free one hash lookup (and a delete when it was
 * sampled); every return one LRU lookup by thread; an mmap and a C library realloc one LRU
 * lookup each (--python-allocators' arena and realloc marks).
 */
#include "send_sample.h"

#define MAP_ANONYMOUS 0x20

/* The next gap of the byte countdown: exponentially distributed, of mean alloc_rate. */
static __always_inline __s64 draw_gap(void)
{
	__u32 gap = bpf_get_prandom_u32() % SPANPROF_ALLOC_GAPS;
	__u64 *next = bpf_map_lookup_elem(&alloc_gaps, &gap);

	return next ? (__s64)*next : (__s64)alloc_rate;
}

/*
 * One allocation of `size` bytes by the current thread: counted down, and when the countdown
 * runs out, sent as a sample with its user and Python stacks and span context. In user mode (a
 * uprobe), so there is no kernel stack. `caller` is the allocation function's return address
 * when it was read (mmap: user space tells CPython's arenas by it), else 0.
 */
static __always_inline int alloc_event(struct pt_regs *ctx, __u64 size, __u64 memptr, __u64 caller)
{
	__u64 id = bpf_get_current_pid_tgid(), serial;
	__u32 tgid = id >> 32, zero = 0;
	struct alloc_cpu *cpu;
	struct alloc_call call = {};
	struct spanprof_sample *s;
	struct scratch *w;

	if (!bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	cpu = bpf_map_lookup_elem(&alloc_cpus, &zero);
	if (!cpu)
		return 0;
	if (alloc_rate > 1) {
		if (!cpu->seeded) {
			cpu->until = draw_gap();
			cpu->seeded = 1;
		}
		cpu->until -= (__s64)size;
		if (cpu->until > 0)
			return 0;
		cpu->until = draw_gap();
	}
	/*
	 * Uprobe programs run preemptible on some kernels: a thread preempted in the middle of a
	 * sample must not share the CPU's scratch with the next one. (A plain flag: atomics that
	 * return a value need BPF v3 code; a preemption between the test and the set is the only
	 * window left.)
	 */
	if (cpu->busy) {
		count_error(SPANPROF_ERR_ALLOC_BUSY);
		return 0;
	}
	cpu->busy = 1;
	serial = ++cpu->serial;
	w = get_scratch(SCRATCH_ALLOC);
	if (w) {
		s = begin_sample(w, id, SCRATCH_ALLOC);
		s->event = SPANPROF_EVENT_ALLOC;
		s->weight = size;
		s->alloc_id = ((__u64)s->cpu << 56) | (serial & ((1ULL << 56) - 1));
		s->kstack_len = 0;
		s->syscall_arg0 = caller;
		if (alloc_heap) {
			call.alloc_id = s->alloc_id;
			call.size = size;
			call.memptr = memptr;
			call.sp = PT_REGS_SP(ctx);
			bpf_map_update_elem(&alloc_calls, &s->tid, &call, BPF_ANY);
		}
		send_sample(ctx, w, 0, 1);
	}
	cpu->busy = 0;
	return 0;
}

/*
 * A free of `addr` (--event heap): a sampled allocation leaves the live table. One lookup for
 * the others (the key holds the process, so no target check is needed; a delete of a missing
 * key would take the bucket's lock).
 */
static __always_inline void free_event(__u64 addr)
{
	struct spanprof_alloc_key key = { .tgid = bpf_get_current_pid_tgid() >> 32, .addr = addr };

	if (addr && bpf_map_lookup_elem(&alloc_live, &key))
		bpf_map_delete_elem(&alloc_live, &key);
}

/*
 * --python-allocators: a mark a thread leaves in `map` (by thread id) for the next call of
 * another probed function, and its taking. The arena allocator marks the arena size, so the
 * mmap it makes next is not counted (its objects are); _PyObject_Realloc marks a block it counted
 * and may pass on to the C library's realloc, whose probe must not count it again (a stale mark
 * is harmless: a pymalloc block is never the C library's). Out of line: the keys' stack slots
 * stay out of on_alloc's frame, which the sample path's deepest calls add to (the verifier's
 * 512-byte limit).
 */
static __noinline int mark_thread(void *map, __u64 value)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	bpf_map_update_elem(map, &tid, &value, BPF_ANY);
	return 0;
}

/* Whether the thread's mark in `map` is `value`; any mark is taken. */
static __noinline int take_thread_mark(void *map, __u64 value)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 *mark = bpf_map_lookup_elem(map, &tid);
	int same;

	if (!mark)
		return 0;
	same = *mark == value;
	bpf_map_delete_elem(map, &tid);
	return same;
}

/* glibc hands an alignment of at most MALLOC_ALIGNMENT (16 on x86_64) to its malloc. */
#define GLIBC_MALLOC_ALIGNMENT 16

/*
 * Every allocation function, one program (each program that inlines the sample code costs the
 * verifier ~180 ms at load): the attach cookie says which function it is (SPANPROF_ALLOC_* in its
 * top 4 bits) and so where the size is. For mmap the rest holds mmap's link-time address (bits
 * 30..59) and the end of the C library's code (bits 0..29): the library's run-time base is the
 * probe's address minus the first, and calls from inside the library are not counted (malloc's
 * own large chunks, counted by the malloc probe; pthread_create's thread stacks). Only anonymous
 * mappings are allocations (file mappings are code and data); CPython's arenas of small objects
 * are such mappings. With --python-allocators, pymalloc's functions are probed too (their
 * requests of 512 bytes or less: the larger ones reach the C library) and an arena's mmap is
 * not counted.
 */
SEC("uprobe")
int BPF_KPROBE(on_alloc, __u64 a0, __u64 a1, __u64 a2, __u64 a3)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), data = cookie & ((1ULL << 60) - 1);
	__u64 size, memptr = 0, limit, base, caller = 0;

	/* The sample code is inlined once, after the switch (each copy costs the verifier). */
	switch (cookie >> 60) {
	case SPANPROF_ALLOC_MALLOC: /* malloc(size) */
		size = a0;
		break;
	case SPANPROF_ALLOC_CALLOC: /* calloc(n, size) */
		/* It fails on overflow: nothing is allocated. (The barrier keeps clang from turning
		 * the division into a 128-bit multiplication, which BPF does not have.) */
		if (a1) {
			limit = ~0ULL / a1;
			asm volatile("" : "+r"(limit));
			if (a0 > limit)
				return 0;
		}
		size = a0 * a1;
		break;
	case SPANPROF_ALLOC_REALLOC: /* realloc(ptr, size) */
		/* glibc's realloc(NULL, n) is its malloc(n), whose probe counts it. */
		if (!a0)
			return 0;
		/* Counted by _PyObject_Realloc's probe (--python-allocators), which passed it on. */
		if (take_thread_mark(&py_reallocs, a0))
			return 0;
		if (alloc_heap)
			free_event(a0);
		size = a1;
		break;
	case SPANPROF_ALLOC_MEMALIGN: /* aligned_alloc(alignment, size), memalign(alignment, size) */
		if (a0 <= GLIBC_MALLOC_ALIGNMENT)
			return 0;
		size = a1;
		break;
	case SPANPROF_ALLOC_POSIX_MEMALIGN: /* posix_memalign(memptr, alignment, size) */
		if (a1 <= GLIBC_MALLOC_ALIGNMENT)
			return 0;
		size = a2;
		memptr = a0;
		break;
	case SPANPROF_ALLOC_MMAP: /* mmap(addr, length, prot, flags, fd, offset) */
		if (!(a3 & MAP_ANONYMOUS))
			return 0;
		/* pymalloc's arena, whose objects the CPython probes count (--python-allocators). */
		if (take_thread_mark(&arena_calls, a1))
			return 0;
		if (data) {
			base = PT_REGS_IP(ctx) - (data >> 30);
			if (!bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx)) &&
			    caller >= base && caller < base + (data & ((1ULL << 30) - 1)))
				return 0;
		}
		size = a1;
		break;
	case SPANPROF_ALLOC_PY_MALLOC: /* _PyObject_Malloc(ctx, size) */
		/* Not a block _PyObject_Realloc moves (counted by its own probe). */
		limit = (__u64)(__s64)(__s32)data;
		base = PT_REGS_IP(ctx) + limit;
		if ((data >> 32) &&
		    !bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx)) &&
		    caller >= base && caller < base + (data >> 32)) {
			return 0;
		}
		caller = 0;
		size = a1;
		break;
	case SPANPROF_ALLOC_PY_CALLOC: /* _PyObject_Calloc(ctx, nelem, elsize) */
		if (a2) {
			limit = ~0ULL / a2;
			asm volatile("" : "+r"(limit));
			if (a1 > limit)
				return 0;
		}
		size = a1 * a2;
		break;
	case SPANPROF_ALLOC_PY_REALLOC: /* _PyObject_Realloc(ctx, ptr, size) */
		/*
		 * realloc(NULL, n) jumps to _PyObject_Malloc, whose probe counts it, from 3.9; 3.8
		 * inlines it (the cookie's bit 0).
		 */
		if (!a1) {
			if (!(data & 1))
				return 0;
		} else {
			if (alloc_heap)
				free_event(a1);
			/* A block of the C library's it shrinks to a small size goes on to realloc. */
			if (a2 && a2 <= SPANPROF_PY_SMALL_REQUEST)
				mark_thread(&py_reallocs, a1);
		}
		size = a2;
		break;
	case SPANPROF_ALLOC_PY_ARENA: /* _PyObject_ArenaMmap(ctx, size), _PyMem_ArenaAlloc */
		/* The arena size is in the cookie: the same function maps 3.11+'s frame stacks. */
		if (a1 == data)
			return mark_thread(&arena_calls, a1);
		return 0;
	default:
		return 0;
	}
	/* Larger requests (and 0) go to the C library's allocator, whose probes count them. */
	if ((cookie >> 60) >= SPANPROF_ALLOC_PY_MALLOC &&
	    (size == 0 || size > SPANPROF_PY_SMALL_REQUEST))
		return 0;
	return alloc_event(ctx, size, memptr, caller);
}

/* munmap(addr, length). */
SEC("uprobe")
int BPF_KPROBE(on_munmap, __u64 addr)
{
	free_event(addr);
	return 0;
}

/* free(ptr); _PyObject_Free(ctx, ptr) with the cookie SPANPROF_ALLOC_PY_FREE. */
SEC("uprobe")
int BPF_KPROBE(on_free, __u64 a0, __u64 a1)
{
	free_event(bpf_get_attach_cookie(ctx) >> 60 == SPANPROF_ALLOC_PY_FREE ? a1 : a0);
	return 0;
}

/*
 * The return of every allocation function (--event heap): a sampled call's address, now known,
 * goes into the live table. Cheap for the others: one lookup by thread id.
 */
SEC("uretprobe")
int BPF_KRETPROBE(on_alloc_return, __u64 ret)
{
	__u64 id = bpf_get_current_pid_tgid(), addr = ret;
	__u32 tid = (__u32)id;
	struct spanprof_live_alloc live = {};
	struct spanprof_alloc_key key = { .tgid = id >> 32 };
	struct alloc_call *call;

	call = bpf_map_lookup_elem(&alloc_calls, &tid);
	if (!call)
		return 0;
	/*
	 * The return of the sampled call itself, not of one it made (malloc maps large chunks with
	 * mmap, whose return is probed too): its stack pointer is one return address above the
	 * entry's.
	 */
	if (PT_REGS_SP(ctx) != call->sp + 8)
		return 0;
	live.alloc_id = call->alloc_id;
	live.size = call->size;
	if (call->memptr) {
		/* posix_memalign returns 0 on success and writes the address. */
		addr = 0;
		if (ret != 0 || bpf_probe_read_user(&addr, sizeof(addr), (void *)call->memptr))
			addr = 0;
	}
	bpf_map_delete_elem(&alloc_calls, &tid);
	/* A failed mmap returns MAP_FAILED (-1), a failed malloc NULL. */
	if (addr >= ~4095ULL)
		addr = 0;
	key.addr = addr;
	if (addr && bpf_map_update_elem(&alloc_live, &key, &live, BPF_ANY))
		count_error(SPANPROF_ERR_HEAP_FULL);
	return 0;
}
