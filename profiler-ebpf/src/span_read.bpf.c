// SPDX-License-Identifier: GPL-2.0
/*
 * Span reading: the OpenTelemetry and OSProfiler ids of the sampled thread, and their names,
 * read from the target's memory while the thread is stopped (objects read later from user space
 * may be freed and reused). Global BPF functions (declared in span_read.h and py_objects.h):
 * read_span, which every sampling program calls, the four readers it calls and CPython's key
 * lookup (keys_find); this unit has no program of its own.
 *
 * Bounds: every lookup is a bpf_loop with a fixed bound: a dict lookup at most DICT_PROBES
 * probes of at most three reads, a HAMT lookup at most HAMT_LEVELS levels (a collision node at
 * most COLLISION_PAIRS reads), a published thread context record at most CTX_ATTRS_ENTRIES
 * attributes from one read of CTX_ATTRS_READ bytes. Each reader makes a fixed number of such
 * lookups (OpenTelemetry: one HAMT and one dict lookup, one attribute; OSProfiler: up to two dict
 * lookups and one attribute, then up to three deque items and UUIDs; a name: one attribute and
 * up to four reads). Reads are bpf_probe_read_user of fixed maximum sizes into the scratch.
 */
#include "span_read.h"
#include "py_objects.h"

/* Levels of one HAMT lookup: far beyond what real tables need. */
#define HAMT_LEVELS 8
#define COLLISION_PAIRS 16

/*
 * Span context. Everything below reads objects of the target's tracing libraries, found by user
 * space (span_procs), while the thread is stopped: OpenTelemetry's current span through the
 * thread's contextvars Context, OSProfiler's trace stack through its threading.local (or the
 * running greenlet's, under eventlet or gevent). Lookups follow CPython's own algorithms (dict
 * probing in py_objects.h, HAMT levels), bounded, comparing keys by identity (the interned names
 * and the key objects user space found), or by their stored hash where the hash names the key
 * (a greenlet's weakref or id), the key then checked.
 */

/* Python/hamt.c: node layouts (the same in 3.8–3.13). */
#define HAMT_NODE_SIZE 16	/* ob_size (bitmap, collision nodes) */
#define HAMT_BITMAP 24		/* b_bitmap (u32) */
#define HAMT_BITMAP_ARRAY 32	/* b_array: key, value pairs */
#define HAMT_ARRAY_ARRAY 16	/* a_array[32] of nodes */
#define HAMT_COLLISION_ARRAY 32 /* c_array: key, value pairs; ob_size counts slots */
/* A compact str's state bits (Include/cpython/unicodeobject.h). */
#define PY_STR_COMPACT_ASCII (3U << 5)
#define PY_STR_LENGTH 16
#define PY_STR_STATE 32
#define PY_UUID_LEN 36
/* Modules/_collectionsmodule.c: deque and block layouts (3.8–3.13). */
#define DEQUE_SIZE 16
#define DEQUE_LEFTBLOCK 24 /* then rightblock, leftindex, rightindex */
#define DEQUE_BLOCKLEN 64
#define DEQUE_BLOCK_DATA 8 /* after leftlink */
/* Items of a trace stack read at once (a power of two). */
#define DEQUE_ITEMS 8
/* A PyLong's size or tag, then its 30-bit digits. */
#define PY_LONG_SIZE 16
#define PY_LONG_DIGITS 24
#define PY_LONG_SHIFT 30
/* PyContextVar: var_cached, var_cached_tsid, var_cached_tsver (Include/internal/pycore_context.h). */
#define CONTEXTVAR_CACHED 32
/* A threading.local's dummy (<=3.12): its dict after PyObject_HEAD (Modules/_threadmodule.c). */
#define PY_LOCALDUMMY_DICT 16

#define HAMT_BITMAP_NODE 1
#define HAMT_ARRAY_NODE 2
#define HAMT_COLLISION_NODE 3
/* The first 8 bytes of the node types' tp_name, little-endian: "hamt_bit", "hamt_arr", "hamt_col". */
#define HAMT_NAME_BITMAP 0x7469625f746d6168ULL
#define HAMT_NAME_ARRAY 0x7272615f746d6168ULL
#define HAMT_NAME_COLLISION 0x6c6f635f746d6168ULL
#define PY_TYPE_NAME 24 /* offsetof(PyTypeObject, tp_name) */

/*
 * Which HAMT node `type` is: by the addresses of the node types when user space found them in
 * the symbol table, else by the type's name (stripped interpreters). 0: not a HAMT node.
 */
static __always_inline __u32 hamt_kind(struct scratch *w, __u64 type TASK_P)
{
	__u64 name = 0, text = 0;

	if (type == w->scfg.hamt_bitmap_type)
		return HAMT_BITMAP_NODE;
	if (type == w->scfg.hamt_array_type)
		return HAMT_ARRAY_NODE;
	if (type == w->scfg.hamt_collision_type)
		return HAMT_COLLISION_NODE;
	if (read_ptr(&name, type + PY_TYPE_NAME TASK_A) || read_ptr(&text, name TASK_A))
		return 0;
	switch (text) {
	case HAMT_NAME_BITMAP:
		return HAMT_BITMAP_NODE;
	case HAMT_NAME_ARRAY:
		return HAMT_ARRAY_NODE;
	case HAMT_NAME_COLLISION:
		return HAMT_COLLISION_NODE;
	}
	return 0;
}

/* One level of a HAMT lookup (Python/hamt.c: 5 bits of the hash per level). */
static long hamt_step(__u64 n, void *ctx)
{
	LOOP_TASK(ctx)
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 hdr[4] = {}, kv[2] = {}, type, node = 0;
	__u32 bitmap, bit, idx, slots, i, kind;

	if (!w)
		return 1;
	q = &w->q;
	q->status = SPAN_FAULT;
	if (!q->node || q->shift > 30 ||
	    user_read(hdr, sizeof(hdr), (const void *)q->node))
		return 1;
	type = hdr[1];
	idx = (__u32)(q->hash >> q->shift) & 31;
	kind = hamt_kind(w, type TASK_A);
	if (kind == HAMT_BITMAP_NODE) {
		bitmap = (__u32)hdr[3];
		bit = 1U << idx;
		q->status = 0;
		if (!(bitmap & bit))
			return 1;
		idx = __builtin_popcount(bitmap & (bit - 1));
		if (user_read(kv, sizeof(kv),
					(const void *)(q->node + HAMT_BITMAP_ARRAY + idx * 16))) {
			q->status = SPAN_FAULT;
			return 1;
		}
		if (kv[0] == 0) { /* a sub-node */
			q->node = kv[1];
			q->shift += 5;
			return 0;
		}
		if (kv[0] == q->key) {
			q->result = kv[1];
			q->status = 1;
		}
		return 1;
	}
	if (kind == HAMT_ARRAY_NODE) {
		if (read_ptr(&node, q->node + HAMT_ARRAY_ARRAY + idx * 8 TASK_A))
			return 1;
		q->status = 0;
		q->node = node;
		q->shift += 5;
		return node ? 0 : 1;
	}
	if (kind == HAMT_COLLISION_NODE) {
		slots = (__u32)hdr[2];
		q->status = 0;
		for (i = 0; i < COLLISION_PAIRS; i++) {
			if (2 * i + 1 >= slots)
				break;
			if (user_read(kv, sizeof(kv),
						(const void *)(q->node + HAMT_COLLISION_ARRAY + i * 16))) {
				q->status = SPAN_FAULT;
				return 1;
			}
			if (kv[0] == q->key) {
				q->result = kv[1];
				q->status = 1;
				return 1;
			}
		}
		return 1;
	}
	return 1; /* not a HAMT node: garbage */
}

/* The value of `key` in the HAMT whose root node is `root`, or 0. */
static __always_inline __u64 hamt_get(struct scratch *w, __u64 root, __u64 key, __u32 hash TASK_P)
{
	struct lookup *q = &w->q;

	q->node = root;
	q->key = key;
	q->hash = hash;
	q->shift = 0;
	q->result = 0;
	q->status = SPAN_FAULT;
	{
		__u32 slot = w->slot;

		bpf_loop_task(HAMT_LEVELS, hamt_step, &slot, 0);
	}
	return q->status == 1 ? q->result : 0;
}

/* A non-negative int of at most `bytes` (8 or 16) bytes, stored big-endian at `out`. */
static __always_inline int read_int(struct scratch *w, __u64 obj, __u8 *out, __u32 bytes TASK_P)
{
	struct {
		__u64 size;
		__u32 d[6];
	} v = {};
	__u64 hi, lo, len;
	__u32 ndigits;

	/*
	 * The size and 5 digits in one read: a 128-bit id has 5, and a shorter int's object is
	 * rounded up to a 16-byte allocation, so the read rarely passes the end of a mapping; when
	 * it does, the size first, then only the digits it says.
	 */
	if (user_read(&v, 8 + 5 * sizeof(__u32), (const void *)(obj + PY_LONG_SIZE))) {
		if (read_ptr(&v.size, obj + PY_LONG_SIZE TASK_A))
			return SPAN_FAULT;
		v.d[0] = 0xffffffff; /* not read yet */
	}
	if (w->scfg.long_kind == SPANPROF_LONG_TAG) {
		if ((v.size & 3) == 2) /* negative */
			return SPAN_FAULT;
		ndigits = (__u32)(v.size >> 3);
	} else {
		if ((__s64)v.size < 0)
			return SPAN_FAULT;
		ndigits = (__u32)v.size;
	}
	/* 128 bits take 5 digits of 30 bits; 64 bits take 3. */
	if (ndigits > (bytes == 16 ? 5 : 3))
		return SPAN_FAULT;
	if (v.d[0] == 0xffffffff) { /* a digit has 30 bits: the read above failed */
		__builtin_memset(v.d, 0, sizeof(v.d));
		len = (__u64)ndigits * sizeof(__u32);
		/* Opaque to the compiler, so the bound below is checked on the register used. */
		asm volatile("" : "+r"(len));
		if (len > 5 * sizeof(__u32))
			return SPAN_FAULT;
		if (len && user_read(v.d, len, (const void *)(obj + PY_LONG_DIGITS)))
			return SPAN_FAULT;
	}
	/* Digits past ndigits belong to the next object. */
	if (ndigits < 5)
		v.d[4] = 0;
	if (ndigits < 4)
		v.d[3] = 0;
	if (ndigits < 3)
		v.d[2] = 0;
	if (ndigits < 2)
		v.d[1] = 0;
	if (ndigits < 1)
		v.d[0] = 0;
	lo = (__u64)v.d[0] | (__u64)v.d[1] << 30 | (__u64)v.d[2] << 60;
	hi = (__u64)v.d[2] >> 4 | (__u64)v.d[3] << 26 | (__u64)v.d[4] << 56;
	if (bytes == 8) {
		if (hi)
			return SPAN_FAULT;
		*(__u64 *)out = __builtin_bswap64(lo);
		return 0;
	}
	*(__u64 *)out = __builtin_bswap64(hi);
	*(__u64 *)(out + 8) = __builtin_bswap64(lo);
	return 0;
}

/*
 * 1 when `c` is not a hex digit, and its value when it is, both without a branch: the branches
 * of a nibble test (three ranges) let the verifier walk every UUID's characters on paths of
 * their own, and the UUID parses were a fifth of what it checked in each sampling program.
 */
static __always_inline __u64 not_hex(__u64 c)
{
	__s64 d = (__s64)c - '0', l = (__s64)(c | 0x20) - 'a';

	/* Out of [0, 9] (or [0, 5]): d or 9 - d (l or 5 - l) is negative. */
	return ((__u64)(d | (9 - d)) >> 63) & ((__u64)(l | (5 - l)) >> 63);
}

static __always_inline __u8 hex_value(__u64 c)
{
	return ((c & 0xf) + 9 * (c >> 6)) & 0xf;
}

/* Where uuid_at puts an id: w->span's OSProfiler ids. */
#define UUID_BASE 0
#define UUID_CURRENT 1
#define UUID_PARENT 2

/*
 * The UUID text (8-4-4-4-12 hex digits) at `at` in w->buf of the scratch of `slot`, into the
 * OSProfiler id `which` (UUID_*) of w->span, which garbage leaves as it was (an id read before it
 * stays whole). 0, or SPAN_FAULT. A global function, checked once: inlined, its loop was checked
 * again for every id and every buffer it was called with, 96 times over in span_published().
 */
__attribute__((noinline)) int uuid_at(__u32 slot, __u32 at, __u32 which)
{
	struct scratch *w = get_scratch(slot);
	const __u8 *p;
	__u64 bad, hi, lo, off = at;
	__u8 id[16];
	__u32 i, pos;

	if (!w)
		return SPAN_FAULT;
	asm volatile("" : "+r"(off)); /* the bound is checked on the register used */
	if (off > SPAN_BUF - PY_UUID_LEN)
		return SPAN_FAULT;
	p = w->buf + off;
	bad = (p[8] ^ '-') | (p[13] ^ '-') | (p[18] ^ '-') | (p[23] ^ '-');
	/* Not unrolled: unrolled, the loads were hoisted and spilled past the 512-byte stack. */
#pragma clang loop unroll(disable)
	for (i = 0; i < 16; i++) {
		/* Byte i's two digits: 2i, past the dashes before them (after bytes 4, 6, 8, 10). */
		pos = 2 * i + (i >= 4) + (i >= 6) + (i >= 8) + (i >= 10);
		hi = p[pos];
		lo = p[pos + 1];
		bad |= not_hex(hi) | not_hex(lo);
		id[i] = (__u8)(hex_value(hi) << 4 | hex_value(lo));
	}
	if (bad)
		return SPAN_FAULT;
	if (which == UUID_BASE)
		__builtin_memcpy(w->span.osp_base, id, sizeof(id));
	else if (which == UUID_CURRENT)
		__builtin_memcpy(w->span.osp_current, id, sizeof(id));
	else
		__builtin_memcpy(w->span.osp_parent, id, sizeof(id));
	return 0;
}

/* A str holding a UUID, parsed into the OSProfiler id `which` (UUID_*). */
static __always_inline int read_uuid(struct scratch *w, __u64 str, __u32 which TASK_P)
{
	__u32 data = w->scfg.str_data, len;

	if (data < PY_STR_STATE + 4 || data > SPAN_BUF - PY_UUID_LEN + PY_STR_LENGTH)
		return SPAN_FAULT;
	/* From the length to the end of 36 characters: no byte past the object. */
	len = data - PY_STR_LENGTH + PY_UUID_LEN;
	if (!str || len > SPAN_BUF ||
	    user_read(w->buf, len, (const void *)(str + PY_STR_LENGTH)))
		return SPAN_FAULT;
	if (span_u64(w, 0) != PY_UUID_LEN ||
	    (load_u32(w->buf, PY_STR_STATE - PY_STR_LENGTH, SPAN_BUF) & PY_STR_COMPACT_ASCII) !=
		    PY_STR_COMPACT_ASCII)
		return SPAN_FAULT;
	return uuid_at(w->slot, data - PY_STR_LENGTH, which);
}

/* OTEP 4947 record: trace_id[16] span_id[8] valid trace_flags attrs_size:u16, then attrs. */
#define CTX_RECORD_HEADER 28
#define CTX_VALID 24
#define CTX_ATTRS_SIZE 26
/* Attribute bytes read at most, and entries looked at (key:u8 len:u8 value[len] each). */
#define CTX_ATTRS_READ 256
#define CTX_ATTRS_ENTRIES 8
/* glibc x86_64: tcbhead_t.dtv, at FS base + 8; 16-byte DTV entries; an unallocated block. */
#define TCB_DTV 8
#define DTV_ENTRY 16
#define DTV_UNALLOCATED ((__u64)-1)

/*
 * Where this thread's copy of a TLS variable is (`kind` SPANPROF_TLS_*): into *addr, 0; 1 when
 * the thread has none (its DTV has no block for the module yet: it never touched the module's
 * TLS); SPAN_FAULT on garbage.
 */
static __always_inline int tls_addr(__u32 kind, __s64 offset, __u64 module, __u64 *addr TASK_P)
{
	struct task_struct *cur = sampled_task();
	__u64 fs = BPF_CORE_READ(cur, thread.fsbase), dtv = 0, block = 0, len = 0;

	if (kind == SPANPROF_TLS_STATIC) {
		*addr = fs + offset;
		return 0;
	}
	if (kind != SPANPROF_TLS_DTV)
		return 1;
	if (read_ptr(&dtv, fs + TCB_DTV TASK_A) || !dtv || read_ptr(&len, dtv - DTV_ENTRY TASK_A))
		return SPAN_FAULT;
	/*
	 * dtv[-1] counts the slots: a thread whose DTV predates the module's dlopen has no slot for
	 * it yet (its first access of the module's TLS makes one).
	 */
	if (module > len)
		return 1;
	if (read_ptr(&block, dtv + module * DTV_ENTRY TASK_A))
		return SPAN_FAULT;
	if (block < 4096 || block == DTV_UNALLOCATED)
		return 1;
	*addr = block + offset;
	return 0;
}

/* spanprof.python_context: the address of the thread's PyContext, 16 hex digits. */
#define CTX_PY_CONTEXT_LEN 16

/*
 * 16 hex digits at `at` (garbage digits give garbage, never a fault). Branch-free,
 * by hex_value: any byte that is not a digit gives some nibble (kept to 4 bits, so it never
 * spills into the next digit). A branch per digit let the verifier on 6.18.44 walk its paths
 * apart: span_published() went over the 1,000,000-instruction limit and no program loaded. The
 * digits are in w->win of the scratch of `slot`. A global function, checked once.
 */
__attribute__((noinline)) __u64 hex64_at(__u32 slot, __u32 at)
{
	struct scratch *w = get_scratch(slot);
	__u64 v = 0;
	__u32 i, c;

	if (!w)
		return 0;
	for (i = 0; i < CTX_PY_CONTEXT_LEN; i++) {
		c = load_u8(w->win, at + i, SPANPROF_PY_WINDOW);
		v = v << 4 | hex_value(c);
	}
	return v;
}

/*
 * One attribute of a thread context record (in w->win; w->q.i the offset, w->q.nentries the
 * size): an OSProfiler id is parsed into w->span, and its bit set in w->q.status (1 base,
 * 2 trace point, 4 parent); the Python context into w->q.result (bit 8). A key repeated: the
 * last one wins, as OTEP 4947 says.
 */
static long ctx_attr_step(__u64 n, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	__u32 off, key, len, size, which = 0;
	int bit = 0;

	if (!w)
		return 1;
	off = (__u32)w->q.i;
	size = w->q.nentries;
	if (off + 2 > size || size > CTX_ATTRS_READ)
		return 1;
	key = load_u8(w->win, off, SPANPROF_PY_WINDOW);
	len = load_u8(w->win, off + 1, SPANPROF_PY_WINDOW);
	off += 2;
	if (off + len > size)
		return 1;
	w->q.i = off + len;
	if (key == SPANPROF_NO_KEY)
		return 0;
	if (key == w->scfg.osp_keys[3] && len == CTX_PY_CONTEXT_LEN) {
		w->q.result = hex64_at(w->slot, off);
		w->q.status |= 8;
		return 0;
	}
	if (len != PY_UUID_LEN)
		return 0;
	if (key == w->scfg.osp_keys[0]) {
		which = UUID_BASE;
		bit = 1;
	} else if (key == w->scfg.osp_keys[1]) {
		which = UUID_CURRENT;
		bit = 2;
	} else if (key == w->scfg.osp_keys[2]) {
		which = UUID_PARENT;
		bit = 4;
	}
	/* The text into w->buf, free while the attributes are walked, where uuid_at reads. */
	if (bit && off <= SPANPROF_PY_WINDOW - PY_UUID_LEN &&
	    !bpf_probe_read_kernel(w->buf, PY_UUID_LEN, w->win + off) &&
	    !uuid_at(w->slot, 0, which))
		w->q.status |= bit;
	return 0;
}

/*
 * The thread context record the process publishes for this thread (OTEP 4947), if any: its
 * OpenTelemetry ids, and the OSProfiler ids among its attributes.
 */
static __always_inline int published_ctx(struct scratch *w TASK_P)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 addr = 0, rec = 0, ctx = 0;
	__u32 size, found, otel;
	int err;

	/* No block: the thread never touched the module's TLS, nothing published. */
	err = tls_addr(c->tls_kind, c->tls_offset, c->tls_module, &addr TASK_A);
	if (err)
		return err == SPAN_FAULT ? SPAN_FAULT : 0;
	if (read_ptr(&rec, addr TASK_A))
		return SPAN_FAULT;
	if (!rec)
		return 0;
	if (user_read(w->buf, CTX_RECORD_HEADER, (const void *)rec))
		return SPAN_FAULT;
	if (w->buf[CTX_VALID] != 1) /* being written, or not valid */
		return 0;
	otel = (span_u64(w, 0) | span_u64(w, 8)) != 0;
	if (otel) {
		__builtin_memcpy(w->span.trace_id, w->buf, 16);
		__builtin_memcpy(w->span.span_id, w->buf + 16, 8);
	}
	size = load_u32(w->buf, CTX_ATTRS_SIZE, SPAN_BUF) & 0xffff;
	found = 0;
	if (size && (c->osp_keys[1] != SPANPROF_NO_KEY || c->osp_keys[3] != SPANPROF_NO_KEY)) {
		if (size > CTX_ATTRS_READ)
			size = CTX_ATTRS_READ;
		if (user_read(w->win, size, (const void *)(rec + CTX_RECORD_HEADER)))
			return SPAN_FAULT;
		w->q.i = 0;
		w->q.nentries = size;
		w->q.status = 0;
		w->q.result = 0;
		{
			__u32 slot = w->slot;

			bpf_loop_task(CTX_ATTRS_ENTRIES, ctx_attr_step, &slot, 0);
		}
		found = (__u32)w->q.status;
	}
	/*
	 * The OpenTelemetry ids belong to the Python context they were published in: a thread now
	 * in another one (an asyncio task switch, Context.run) has moved on without the publisher
	 * knowing, and the span is read from the interpreter instead.
	 */
	if (otel && (found & 8) && w->tstate &&
	    (read_ptr(&ctx, w->tstate + c->tstate_context TASK_A) || ctx != w->q.result))
		otel = 0;
	if (otel)
		w->span.flags |= SPANPROF_SPAN_OTEL | SPANPROF_SPAN_PUBLISHED;
	if ((found & 3) == 3) {
		w->span.flags |= SPANPROF_SPAN_OSP | SPANPROF_SPAN_PUBLISHED;
		if (found & 4)
			w->span.flags |= SPANPROF_SPAN_OSP_PARENT;
	}
	return 0;
}

/* OpenTelemetry's current span of the thread: Context[span key]._context, a SpanContext. */
static __always_inline int otel_span(struct scratch *w, __u64 tstate TASK_P)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, ids[2] = {}, ts[3] = {}, var[3] = {}, again[3] = {};

	/* PyThreadState: context, context_ver, id; PyContextVar: var_cached, _tsid, _tsver. */
	if (user_read(ts, sizeof(ts), (const void *)(tstate + c->tstate_context)) ||
	    user_read(var, sizeof(var), (const void *)(c->otel_var + CONTEXTVAR_CACHED)))
		return SPAN_FAULT;
	if (!ts[0]) /* the thread never used contextvars */
		return 0;
	/*
	 * The value the ContextVar cached for this thread at this version of its context, which
	 * CPython's own ContextVar.get() returns: no HAMT walk. Another thread (holding the GIL
	 * while this one may not) can be rewriting the three fields: they are read again, and used
	 * only if nothing changed in between.
	 */
	if (var[0] && var[1] == ts[2] && var[2] == ts[1] &&
	    !user_read(again, sizeof(again),
				 (const void *)(c->otel_var + CONTEXTVAR_CACHED)) &&
	    again[0] == var[0] && again[1] == var[1] && again[2] == var[2]) {
		v = var[0];
	} else {
		if (read_ptr(&v, ts[0] + c->context_vars TASK_A) || !v || read_ptr(&v, v + c->hamt_root TASK_A))
			return SPAN_FAULT;
		v = hamt_get(w, v, c->otel_var, c->otel_var_hash TASK_A);
		if (!v) /* the thread never set OpenTelemetry's context */
			return w->q.status;
	}
	v = dict_get(w, v, c->otel_key, c->otel_key_hash TASK_A);
	if (!v) /* no current span */
		return w->q.status;
	w->name_obj[0] = v;
	v = getattr(w, v, c->context_name, c->context_name_hash TASK_A);
	if (!v || user_read(ids, sizeof(ids), (const void *)(v + c->tuple_items)))
		return SPAN_FAULT;
	if (read_int(w, ids[0], w->span.trace_id, 16 TASK_A) || read_int(w, ids[1], w->span.span_id, 8 TASK_A))
		return SPAN_FAULT;
	/* INVALID_SPAN's zero ids: not a span. */
	if (!load_u64(w->span.span_id, 0, 8) ||
	    !(load_u64(w->span.trace_id, 0, 16) | load_u64(w->span.trace_id, 8, 16)))
		return 0;
	w->span.flags |= SPANPROF_SPAN_OTEL;
	return 0;
}

/* The str at position `i` of a deque, given its first block and first index. */
static __always_inline __u64 deque_item(__u64 block, __u64 first, __u64 i TASK_P)
{
	__u64 v = 0, pos = first + i;

	/* Trace stacks are short: follow at most one block link. */
	if (pos >= DEQUE_BLOCKLEN) {
		if (read_ptr(&block, block + 8 + DEQUE_BLOCKLEN * 8 TASK_A) || !block)
			return 0;
		pos -= DEQUE_BLOCKLEN;
		if (pos >= DEQUE_BLOCKLEN)
			return 0;
	}
	if (read_ptr(&v, block + DEQUE_BLOCK_DATA + pos * 8 TASK_A))
		return 0;
	return v;
}

#define PY_WEAKREF_OBJECT 16 /* offsetof(PyWeakReference, wr_object) */

/*
 * The greenlet running on this thread: greenlet's thread-local ThreadState pointer (1 until
 * the thread first uses greenlets, 0 once its state is gone) points to the main greenlet (of
 * type green_type: else this is not greenlet's state) and then the current one. 0 when there
 * is none; SPAN_FAULT in w->q.status on garbage.
 */
static __always_inline __u64 current_greenlet(struct scratch *w TASK_P)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 addr = 0, state = 0, g[2] = {}, type = 0;
	int err;

	w->q.status = 0;
	err = tls_addr(c->green_tls_kind, c->green_tls_offset, c->green_tls_module, &addr TASK_A);
	if (err) {
		w->q.status = err == SPAN_FAULT ? SPAN_FAULT : 0;
		return 0;
	}
	if (read_ptr(&state, addr TASK_A)) {
		w->q.status = SPAN_FAULT;
		return 0;
	}
	if (state <= 1)
		return 0;
	if (user_read(g, sizeof(g), (const void *)state) || !g[0] || !g[1] ||
	    read_ptr(&type, g[0] + PY_OB_TYPE TASK_A) || type != c->green_type) {
		w->q.status = SPAN_FAULT;
		return 0;
	}
	return g[1];
}

/*
 * The attributes dict of OSProfiler's green-thread local for the running greenlet, 0 when it
 * has none (SPAN_FAULT in w->q.status on garbage). eventlet's corolocal keeps them in a
 * WeakKeyDictionary's `data` (osp_local): weakref(greenlet) -> dict, the weakref hashed as
 * the greenlet, by address. gevent's local in its `dicts` (osp_local): id(greenlet) -> an
 * entry of two fields, a weakref to the greenlet and the dict (in either order: Cython's
 * declaration order, or pure Python's sorted slots). The weakref must still name this
 * greenlet: an entry of a dead greenlet whose address was reused is not its.
 */
static __always_inline __u64 green_local(struct scratch *w TASK_P)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 g, v, f[2] = {}, t = 0, d, wr, ref = 0;

	g = current_greenlet(w TASK_A);
	if (!g)
		return 0;
	/* One lookup: a weakref hashes as its referent, by address; an int below 2^61 - 1 as itself. */
	v = dict_get_by_hash(w, c->osp_local,
			     c->green_kind == SPANPROF_GREEN_EVENTLET ? g >> 4 | g << 60 : g TASK_A);
	if (!v)
		return 0;
	if (c->green_kind == SPANPROF_GREEN_EVENTLET) {
		wr = w->q.rkey;
		d = v;
	} else {
		if (user_read(f, sizeof(f), (const void *)(v + 16)) ||
		    read_ptr(&t, f[0] + PY_OB_TYPE TASK_A))
			goto fault;
		if (t == c->dict_type) {
			d = f[0];
			wr = f[1];
		} else {
			d = f[1];
			wr = f[0];
		}
	}
	if (read_ptr(&t, d + PY_OB_TYPE TASK_A) || t != c->dict_type || read_ptr(&ref, wr + PY_WEAKREF_OBJECT TASK_A))
		goto fault;
	w->q.status = 0;
	return ref == g ? d : 0;
fault:
	w->q.status = SPAN_FAULT;
	return 0;
}

/* OSProfiler's trace stack of the thread: base id first, the current trace point last. */
static __always_inline int osp_trace(struct scratch *w, __u64 tstate TASK_P)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, d[5] = {}, n, left, right, lefti, righti, str, len, items[DEQUE_ITEMS] = {};

	if (c->green_kind != SPANPROF_GREEN_NONE) {
		v = green_local(w TASK_A);
		if (!v)
			return w->q.status;
	} else if (read_ptr(&v, tstate + c->tstate_local TASK_A)) {
		return SPAN_FAULT;
	} else if (!v) { /* no thread dict, or no local key: the thread never used a threading.local */
		return 0;
	} else if (c->local_kind == SPANPROF_LOCAL_TSTATE_DICT) {
		v = dict_get(w, v, c->osp_local, c->osp_local_hash TASK_A);
		if (!v)
			return w->q.status; /* this thread never used OSProfiler's local */
		if (read_ptr(&v, v + PY_LOCALDUMMY_DICT TASK_A))
			return SPAN_FAULT;
	} else {
		/* 3.13: the local's dicts, keyed by the thread's key object (hashed by address). */
		v = dict_get(w, c->osp_local, v, v >> 4 | v << 60 TASK_A);
		if (!v)
			return w->q.status;
	}
	v = dict_get(w, v, c->osp_profiler_name, c->osp_profiler_name_hash TASK_A);
	if (!v)
		return w->q.status;
	/* `profiler` is None between requests (profiler.clean()). */
	if (read_ptr(&str, v + PY_OB_TYPE TASK_A))
		return SPAN_FAULT;
	if (str != c->osp_profiler_type)
		return 0;
	w->name_obj[1] = v;
	v = getattr(w, v, c->osp_stack_name, c->osp_stack_name_hash TASK_A);
	if (!v || user_read(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
		return SPAN_FAULT;
	n = d[0];
	left = d[1];
	right = d[2];
	lefti = d[3];
	righti = d[4];
	if (n == 0)
		return 0;
	w->osp_depth = n;
	if (n > 2 * DEQUE_BLOCKLEN || lefti >= DEQUE_BLOCKLEN || righti >= DEQUE_BLOCKLEN ||
	    !left || !right)
		return SPAN_FAULT;
	if (left == right && n <= DEQUE_ITEMS && lefti + n <= DEQUE_BLOCKLEN) {
		/* The usual short stack in one block: its items in one read. */
		len = n * 8;
		asm volatile("" : "+r"(len)); /* the bound is checked on the register used */
		if (len > sizeof(items) ||
		    user_read(items, len, (const void *)(left + DEQUE_BLOCK_DATA + lefti * 8)))
			return SPAN_FAULT;
	} else {
		items[0] = deque_item(left, lefti, 0 TASK_A);
		items[DEQUE_ITEMS - 1] = deque_item(left, lefti, n - 1 TASK_A);
		if (n >= 2)
			items[DEQUE_ITEMS - 2] = deque_item(left, lefti, n - 2 TASK_A);
		n = DEQUE_ITEMS;
	}
	if (read_uuid(w, items[0], UUID_BASE TASK_A) ||
	    read_uuid(w, items[(n - 1) & (DEQUE_ITEMS - 1)], UUID_CURRENT TASK_A))
		return SPAN_FAULT;
	w->span.flags |= SPANPROF_SPAN_OSP;
	if (n >= 2 && !read_uuid(w, items[(n - 2) & (DEQUE_ITEMS - 1)], UUID_PARENT TASK_A))
		w->span.flags |= SPANPROF_SPAN_OSP_PARENT;
	return 0;
}

/*
 * The str `str` as a name: into out[SPANPROF_SPAN_NAME_MAX], its length into *out_len (0: no
 * name). Only an exact str (ob_type is str_type) that is compact ASCII gives a name, of which
 * the first SPANPROF_SPAN_NAME_MAX bytes are kept: a non-ASCII name, a str subclass or another
 * object gives none. Two reads: the header, then no more data than the str holds.
 */
static __always_inline int read_name(struct scratch *w, __u64 str, __u8 *out, __u8 *out_len TASK_P)
{
	__u64 hdr[4] = {}; /* ob_type, length, hash, state (Include/cpython/unicodeobject.h) */
	__u64 n, data = w->scfg.str_data;

	*out_len = 0;
	if (!str || user_read(hdr, sizeof(hdr), (const void *)(str + PY_OB_TYPE)))
		return SPAN_FAULT;
	if (hdr[0] != w->scfg.str_type ||
	    ((__u32)hdr[3] & PY_STR_COMPACT_ASCII) != PY_STR_COMPACT_ASCII)
		return 0;
	n = hdr[1] < SPANPROF_SPAN_NAME_MAX ? hdr[1] : SPANPROF_SPAN_NAME_MAX;
	asm volatile("" : "+r"(n)); /* the bound is checked on the register used */
	if (n == 0 || n > SPANPROF_SPAN_NAME_MAX)
		return 0;
	if (data < PY_STR_STATE + 4 || data > 64 ||
	    user_read(out, n, (const void *)(str + data)))
		return SPAN_FAULT;
	*out_len = (__u8)n;
	return 0;
}

/*
 * The name of the OpenTelemetry span (osp == 0: its `_name`, set by the SDK's ReadableSpan) or
 * of OSProfiler's current trace point (osp == 1: the last item of the _Profiler's `_name`
 * deque, which start() appends to and stop() pops), of the object the id reader left in
 * w->name_obj. A global function like the readers below: one more getattr inlined into them
 * would be verified once per path through each.
 */
__attribute__((noinline)) int span_name(__u32 slot, __u32 osp TASK_GP)
{
	struct scratch *w = get_scratch(slot);
	__u64 v, obj, d[5] = {}, str = 0;
	int err;

	if (!w)
		return 0;
	obj = osp ? w->name_obj[1] : w->name_obj[0];
	/*
	 * The id reader's last lookup was usually an attribute of this object (`_context`,
	 * `_trace_stack`): the same keys, still in kblock, and values.
	 */
	if (obj && obj == w->attrs_obj) {
		keys_find(slot, w->kvalues, w->scfg.name_attr, w->scfg.name_attr_hash TASK_A);
		v = w->q.status == 1 ? w->q.result : 0;
	} else
		v = getattr(w, obj, w->scfg.name_attr, w->scfg.name_attr_hash TASK_A);
	if (!v) /* a span without `_name` (NonRecordingSpan), or a fault */
		return w->q.status;
	if (!osp) {
		err = read_name(w, v, w->span.otel_name, &w->span.otel_name_len TASK_A);
		if (!err && w->span.otel_name_len)
			w->span.flags |= SPANPROF_SPAN_OTEL_NAME;
		return err;
	}
	/* deque: ob_size, leftblock, rightblock, leftindex, rightindex; the last item at the right. */
	if (user_read(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
		return SPAN_FAULT;
	if (d[0] == 0) /* no trace point started since init() */
		return 0;
	/*
	 * start() appends the name, then the id; stop() pops the name, then the id: between the
	 * two the last name is not the current point's. The id stack holds the base and parent
	 * ids below the points (osprofiler/profiler.py, _Profiler.__init__).
	 */
	if (d[0] + 2 != w->osp_depth)
		return 0;
	if (!d[2] || d[4] >= DEQUE_BLOCKLEN ||
	    read_ptr(&str, d[2] + DEQUE_BLOCK_DATA + d[4] * 8 TASK_A))
		return SPAN_FAULT;
	err = read_name(w, str, w->span.osp_name, &w->span.osp_name_len TASK_A);
	if (!err && w->span.osp_name_len)
		w->span.flags |= SPANPROF_SPAN_OSP_NAME;
	return err;
}

/*
 * The sampled thread's threading name: the `_name` of threading._active[get_ident()], where
 * get_ident() is pthread_self(), the thread's FS base (glibc, x86_64), and an int's hash is its
 * value (below 2**61), so the dict is probed by hash. Read while the thread is stopped, so a
 * request thread that lives a millisecond is named too; the Thread object, its name and the
 * str are checked as every span object is (an exact compact ASCII str, bounded lookups).
 */
__attribute__((noinline)) int span_thread_name(__u32 slot TASK_GP)
{
	struct scratch *w = get_scratch(slot);
	struct task_struct *cur = sampled_task();
	__u64 ident, v;
	int err;

	if (!w)
		return 0;
	ident = BPF_CORE_READ(cur, thread.fsbase);
	v = dict_get_by_hash(w, w->scfg.threading_active, ident TASK_A);
	if (!v) /* not a threading thread (a C thread, or one not started yet) */
		return w->q.status;
	v = getattr(w, v, w->scfg.name_attr, w->scfg.name_attr_hash TASK_A);
	if (!v)
		return w->q.status;
	err = read_name(w, v, w->span.thread_name, &w->span.thread_name_len TASK_A);
	if (!err && w->span.thread_name_len)
		w->span.flags |= SPANPROF_SPAN_THREAD_NAME;
	return err;
}

/*
 * Whether the thread's name is to be read at this sample: at its first, then at most once per
 * THREAD_NAME_EVERY_NS (a renamed thread); after a read that found no name, again after
 * THREAD_NAME_RETRY_NS (a thread sampled before threading registered it). Always in a dump.
 */
#define THREAD_NAME_EVERY_NS 50000000ULL
#define THREAD_NAME_RETRY_NS 2000000ULL

static __always_inline int thread_name_due(struct scratch *w)
{
#ifdef SPANPROF_TASK_READS
	return 1;
#else
	__u32 tid = w->s.tid;
	__u64 *last = bpf_map_lookup_elem(&thread_named, &tid);

	return !last || w->s.time_ns - *last >= THREAD_NAME_EVERY_NS;
#endif
}

static __always_inline void thread_name_read(struct scratch *w)
{
#ifndef SPANPROF_TASK_READS
	__u32 tid = w->s.tid;
	__u64 at = w->s.time_ns;

	if (!(w->span.flags & SPANPROF_SPAN_THREAD_NAME))
		at -= THREAD_NAME_EVERY_NS - THREAD_NAME_RETRY_NS;
	bpf_map_update_elem(&thread_named, &tid, &at, BPF_ANY);
#endif
}

/* The id readers (span_read.h says why they are global functions). */
__attribute__((noinline)) int span_published(__u32 slot TASK_GP)
{
	struct scratch *w = get_scratch(slot);

	return w ? published_ctx(w TASK_A) : 0;
}

__attribute__((noinline)) int span_otel(__u32 slot TASK_GP)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? otel_span(w, w->tstate TASK_A) : 0;
}

__attribute__((noinline)) int span_osp(__u32 slot TASK_GP)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? osp_trace(w, w->tstate TASK_A) : 0;
}

/* The entry point: see span_read.h. */
int read_span(__u32 slot, __u64 off TASK_GP)
{
	struct scratch *w = get_scratch(slot);
	const struct spanprof_span_proc *cfg;
	__u32 tgid;
	int bad = 0;

	if (!w)
		return 0;
	tgid = w->s.pid;
	cfg = bpf_map_lookup_elem(&span_procs, &tgid);
	if (!cfg)
		return 0;
	w->scfg = *cfg;
	__builtin_memset(&w->span, 0, sizeof(w->span));
	w->name_obj[0] = 0;
	w->name_obj[1] = 0;
	w->osp_depth = 0;
	w->attrs_obj = 0;
	/*
	 * What the process publishes itself is the cheapest to read, and read first. Names only of
	 * what was read from the interpreter (a published context carries none, and its ids are
	 * not read again from the objects), each right after its ids: its object's keys are still
	 * in the scratch.
	 */
	if (w->scfg.tls_kind != SPANPROF_TLS_NONE && span_published(w->slot TASK_A))
		bad = 1;
	if (w->scfg.otel_var && !(w->span.flags & SPANPROF_SPAN_OTEL) && span_otel(w->slot TASK_A))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OTEL) && w->name_obj[0] &&
	    span_name(w->slot, 0 TASK_A))
		bad = 1;
	if (w->scfg.osp_local && !(w->span.flags & SPANPROF_SPAN_OSP) && span_osp(w->slot TASK_A))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OSP) && w->name_obj[1] &&
	    span_name(w->slot, 1 TASK_A))
		bad = 1;
	if (w->scfg.threading_active && w->scfg.name_attr && w->tstate && thread_name_due(w)) {
		if (span_thread_name(w->slot TASK_A))
			bad = 1;
		thread_name_read(w);
	}
	if (bad)
		count_error(SPANPROF_ERR_SPAN_READ);
	if (!w->span.flags || off > sizeof(w->s.stack) + sizeof(w->s.py))
		return 0;
	__builtin_memcpy((__u8 *)w->s.stack + off, &w->span, sizeof(w->span));
	return sizeof(w->span);
}
