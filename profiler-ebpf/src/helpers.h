/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Small helpers every unit shares: the error counters, the CPU's scratch, bounded loads from
 * buffers read from a target, and one pointer read of target memory. All inlined; none loops.
 */
#ifndef SPANPROF_HELPERS_H
#define SPANPROF_HELPERS_H

#include "maps.h"

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
	__u32 key = bpf_get_smp_processor_id() * SPANPROF_SCRATCH_SLOTS + slot;

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

static __always_inline int read_ptr(__u64 *out, __u64 addr)
{
	return bpf_probe_read_user(out, sizeof(*out), (const void *)addr);
}

#endif /* SPANPROF_HELPERS_H */
