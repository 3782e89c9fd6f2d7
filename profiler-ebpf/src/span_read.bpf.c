// SPDX-License-Identifier: GPL-2.0
/*
 * Span reading: the OpenTelemetry and OSProfiler ids of the sampled thread, and their names,
 * read from the target's memory while the thread is stopped (objects read later from user space
 * may be freed and reused). Four global BPF functions (declared in span_read.h), called by
 * read_span from every sampling program; this unit has no program of its own.
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

/* Probes of one dict lookup, levels of one HAMT lookup: both far beyond what real tables need. */
#define DICT_PROBES 32
#define HAMT_LEVELS 8
#define COLLISION_PAIRS 16

/*
 * Span context. Everything below reads objects of the target's tracing libraries, found by user
 * space (span_procs), while the thread is stopped: OpenTelemetry's current span through the
 * thread's contextvars Context, OSProfiler's trace stack through its threading.local. Lookups
 * follow CPython's own algorithms (dict probing, HAMT levels), bounded, comparing keys by
 * identity (the interned names and the key objects user space found).
 */

/* Py_TPFLAGS_* (Include/object.h). */
#define PY_TPFLAGS_INLINE_VALUES (1ULL << 2)
#define PY_TPFLAGS_MANAGED_DICT (1ULL << 4)
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
/* Objects: ob_type; a tuple's items; a PyLong's size or tag, then its 30-bit digits. */
#define PY_OB_TYPE 8
#define PY_LONG_SIZE 16
#define PY_LONG_DIGITS 24
#define PY_LONG_SHIFT 30
/* PyContextVar: var_cached, var_cached_tsid, var_cached_tsver (Include/internal/pycore_context.h). */
#define CONTEXTVAR_CACHED 32
/* A threading.local's dummy (<=3.12): its dict after PyObject_HEAD (Modules/_threadmodule.c). */
#define PY_LOCALDUMMY_DICT 16

static __always_inline __u64 span_u64(struct scratch *w, __u32 off)
{
	return load_u64(w->buf, off, SPAN_BUF);
}

/*
 * Reads 8 or 16 bytes of a keys object: from the block read with its header when they are in
 * it, else from the target.
 */
static __always_inline int keys_read(struct scratch *w, __u64 addr, __u64 *out, __u32 len)
{
	__u64 off = addr - w->kbase;

	if (addr >= w->kbase && off <= KEYS_BLOCK - 16 && off + len <= w->klen) {
		out[0] = load_u64(w->kblock, (__u32)off, KEYS_BLOCK);
		if (len > 8)
			out[1] = load_u64(w->kblock, (__u32)off + 8, KEYS_BLOCK);
		return 0;
	}
	return bpf_probe_read_user(out, len > 8 ? 16 : 8, (const void *)addr);
}

/* One probe of a dict lookup (CPython's open addressing: i = i*5 + perturb + 1). */
static long dict_probe_step(__u64 n, void *ctx)
{
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 v = 0, kv[2] = {};
	__s64 ix;

	if (!w)
		return 1;
	q = &w->q;
	if (keys_read(w, q->index + q->i * q->width, &v, 8)) {
		q->status = SPAN_FAULT;
		return 1;
	}
	switch (q->width) {
	case 1:
		ix = (__s8)v;
		break;
	case 2:
		ix = (__s16)v;
		break;
	case 4:
		ix = (__s32)v;
		break;
	default:
		ix = (__s64)v;
		break;
	}
	if (ix == -1) /* DKIX_EMPTY: the key is not in the table */
		return 1;
	if (ix >= 0 && ix < q->nentries) {
		if (keys_read(w, q->entries + (__u64)ix * q->esize + q->koff, kv, 16)) {
			q->status = SPAN_FAULT;
			return 1;
		}
		if (kv[0] == q->key) {
			if (q->values && read_ptr(&kv[1], q->values + (__u64)ix * 8)) {
				q->status = SPAN_FAULT;
				return 1;
			}
			q->result = kv[1];
			q->status = 1;
			return 1;
		}
	}
	q->perturb >>= 5;
	q->i = (q->i * 5 + q->perturb + 1) & q->mask;
	return 0;
}

/*
 * CPython's shared keys of every empty dict (Py_EMPTY_KEYS: dk_size 1 before 3.11, dk_log2_size 0
 * since, no entries): a dict made and not yet filled, such as a thread's threading.local dict
 * while the first value to store in it is being built. Nothing is in it: not a fault.
 */
static __always_inline __u64 empty_keys(struct lookup *q)
{
	q->status = 0;
	return 0;
}

/*
 * The value under `key` (compared by identity; `hash` its hash) in the keys object already read
 * into w->kblock (at w->kbase), with split `values` (0 for a combined table). 0 when absent;
 * SPAN_FAULT in w->q.status on garbage.
 */
static __always_inline __u64 keys_find(struct scratch *w, __u64 values, __u64 key, __u64 hash)
{
	struct lookup *q = &w->q;
	__u64 size, index_bytes, keys = w->kbase;
	__u32 log2, log2_index, kind;

	q->status = SPAN_FAULT;
	q->result = 0;
	__builtin_memcpy(w->buf, w->kblock, 40);
	if (w->scfg.dict_kind == SPANPROF_DICT_SIZE) {
		/* dk_refcnt, dk_size, dk_lookup, dk_usable, dk_nentries, dk_indices */
		size = span_u64(w, 8);
		q->nentries = (__u32)span_u64(w, 32);
		if (size == 1 && q->nentries == 0)
			return empty_keys(q);
		if (size < 8 || size > (1ULL << 30) || (size & (size - 1)))
			return 0;
		q->width = size <= 0xff ? 1 : size <= 0xffff ? 2 : 4;
		q->index = keys + 40;
		q->entries = q->index + size * q->width;
		q->esize = 24;
		q->koff = 8;
	} else {
		/* dk_refcnt, dk_log2_size, dk_log2_index_bytes, dk_kind, .., dk_nentries@24 */
		log2 = w->buf[8];
		log2_index = w->buf[9];
		kind = w->buf[10];
		q->nentries = (__u32)span_u64(w, 24);
		if (log2 == 0 && log2_index == 0 && q->nentries == 0)
			return empty_keys(q);
		if (log2 < 3 || log2 > 30 || log2_index < log2 || log2_index > log2 + 3)
			return 0;
		size = 1ULL << log2;
		index_bytes = 1ULL << log2_index;
		q->width = (__u32)(index_bytes >> log2);
		q->index = keys + 32;
		q->entries = q->index + index_bytes;
		/* DICT_KEYS_GENERAL (0) entries carry the hash; unicode ones do not. */
		q->esize = kind == 0 ? 24 : 16;
		q->koff = kind == 0 ? 8 : 0;
	}
	if (q->nentries > size)
		return 0;
	q->values = values ? values + w->scfg.dict_values : 0;
	q->key = key;
	q->hash = hash;
	q->mask = size - 1;
	q->i = hash & q->mask;
	q->perturb = hash;
	q->status = 0;
	{
		__u32 slot = w->slot;

		bpf_loop(DICT_PROBES, dict_probe_step, &slot, 0);
	}
	return q->status == 1 ? q->result : 0;
}

/* keys_find in the keys object `keys`, read first. */
static __always_inline __u64 keys_get(struct scratch *w, __u64 keys, __u64 values, __u64 key,
				      __u64 hash)
{
	w->q.status = SPAN_FAULT;
	w->q.result = 0;
	w->attrs_obj = 0;
	if (!keys)
		return 0;
	/*
	 * The header with what follows it: a small table's indices and entries come in the same
	 * read. A keys object that ends near the end of a mapping takes the header alone.
	 */
	w->kbase = keys;
	w->kvalues = values;
	w->klen = KEYS_BLOCK;
	if (bpf_probe_read_user(w->kblock, KEYS_BLOCK, (const void *)keys)) {
		w->klen = 40;
		if (bpf_probe_read_user(w->kblock, 40, (const void *)keys))
			return 0;
	}
	return keys_find(w, values, key, hash);
}

/* dict[key] for a dict object (a subclass too: the dict part comes first). */
static __always_inline __u64 dict_get(struct scratch *w, __u64 dict, __u64 key, __u64 hash)
{
	__u64 kv[2] = {}; /* ma_keys, ma_values */

	if (!dict || bpf_probe_read_user(kv, sizeof(kv), (const void *)(dict + 32))) {
		w->q.status = SPAN_FAULT;
		return 0;
	}
	return keys_get(w, kv[0], kv[1], key, hash);
}

/* obj.name for an instance attribute (from the instance's dict or values), or 0. */
static __always_inline __u64 attr_lookup(struct scratch *w, __u64 obj, __u64 name, __u64 hash)
{
	__u64 type = 0, flags, v = 0, keys = 0, pre[2] = {}, tlen;
	__u32 first = w->scfg.type_basicsize, last = w->scfg.type_dictoffset;
	__s64 off = 0;
	__u8 valid = 0;

	w->q.status = SPAN_FAULT;
	/* tp_basicsize, tp_flags and tp_dictoffset in one read of the type object. */
	if (last < first || w->scfg.type_flags < first || w->scfg.type_flags > last)
		return 0;
	tlen = (__u64)last + 8 - first;
	asm volatile("" : "+r"(tlen)); /* the bound is checked on the register used */
	if (tlen > TYPE_BLOCK)
		return 0;
	if (!obj || read_ptr(&type, obj + PY_OB_TYPE) || !type ||
	    bpf_probe_read_user(w->tblock, tlen, (const void *)(type + first)))
		return 0;
	flags = load_u64(w->tblock, w->scfg.type_flags - first, TYPE_BLOCK);
	if (w->scfg.attr_kind == SPANPROF_ATTR_DICTOFFSET || !(flags & PY_TPFLAGS_MANAGED_DICT)) {
		off = (__s64)load_u64(w->tblock, last - first, TYPE_BLOCK);
		if (off <= 0 || off > 4096 || read_ptr(&v, obj + off))
			return 0;
		return dict_get(w, v, name, hash);
	}
	/* A managed dict: the pre-header before the object holds the dict or the values. */
	if (bpf_probe_read_user(pre, sizeof(pre), (const void *)(obj - 32)))
		return 0;
	switch (w->scfg.attr_kind) {
	case SPANPROF_ATTR_MANAGED: /* 3.11: values at -32, dict at -24 */
		if (pre[1])
			return dict_get(w, pre[1], name, hash);
		v = pre[0];
		break;
	case SPANPROF_ATTR_TAGGED: /* 3.12: -24 holds the dict, or the values' address - 1 */
		if (!(pre[1] & 1))
			return pre[1] ? dict_get(w, pre[1], name, hash) : 0;
		v = pre[1] + 1;
		break;
	default: /* 3.13: dict at -24, else values inline after the object */
		if (pre[1])
			return dict_get(w, pre[1], name, hash);
		off = (__s64)load_u64(w->tblock, 0, TYPE_BLOCK);
		if (!(flags & PY_TPFLAGS_INLINE_VALUES) || off <= 0 || off > 4096)
			return 0;
		v = obj + off;
		/* PyDictValues.valid: 0 once the values moved to a dict. */
		if (bpf_probe_read_user(&valid, 1, (const void *)(v + 3)) || !valid)
			return 0;
		break;
	}
	if (!v || read_ptr(&keys, type + w->scfg.type_cached_keys))
		return 0;
	return keys_get(w, keys, v, name, hash);
}

/* attr_lookup, noting whose attributes' keys are left in w->kblock when it found the name. */
static __always_inline __u64 getattr(struct scratch *w, __u64 obj, __u64 name, __u64 hash)
{
	__u64 v = attr_lookup(w, obj, name, hash);

	if (v)
		w->attrs_obj = obj;
	return v;
}

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
static __always_inline __u32 hamt_kind(struct scratch *w, __u64 type)
{
	__u64 name = 0, text = 0;

	if (type == w->scfg.hamt_bitmap_type)
		return HAMT_BITMAP_NODE;
	if (type == w->scfg.hamt_array_type)
		return HAMT_ARRAY_NODE;
	if (type == w->scfg.hamt_collision_type)
		return HAMT_COLLISION_NODE;
	if (read_ptr(&name, type + PY_TYPE_NAME) || read_ptr(&text, name))
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
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 hdr[4] = {}, kv[2] = {}, type, node = 0;
	__u32 bitmap, bit, idx, slots, i, kind;

	if (!w)
		return 1;
	q = &w->q;
	q->status = SPAN_FAULT;
	if (!q->node || q->shift > 30 ||
	    bpf_probe_read_user(hdr, sizeof(hdr), (const void *)q->node))
		return 1;
	type = hdr[1];
	idx = (__u32)(q->hash >> q->shift) & 31;
	kind = hamt_kind(w, type);
	if (kind == HAMT_BITMAP_NODE) {
		bitmap = (__u32)hdr[3];
		bit = 1U << idx;
		q->status = 0;
		if (!(bitmap & bit))
			return 1;
		idx = __builtin_popcount(bitmap & (bit - 1));
		if (bpf_probe_read_user(kv, sizeof(kv),
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
		if (read_ptr(&node, q->node + HAMT_ARRAY_ARRAY + idx * 8))
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
			if (bpf_probe_read_user(kv, sizeof(kv),
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
static __always_inline __u64 hamt_get(struct scratch *w, __u64 root, __u64 key, __u32 hash)
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

		bpf_loop(HAMT_LEVELS, hamt_step, &slot, 0);
	}
	return q->status == 1 ? q->result : 0;
}

/* A non-negative int of at most `bytes` (8 or 16) bytes, stored big-endian at `out`. */
static __always_inline int read_int(struct scratch *w, __u64 obj, __u8 *out, __u32 bytes)
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
	if (bpf_probe_read_user(&v, 8 + 5 * sizeof(__u32), (const void *)(obj + PY_LONG_SIZE))) {
		if (read_ptr(&v.size, obj + PY_LONG_SIZE))
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
		if (len && bpf_probe_read_user(v.d, len, (const void *)(obj + PY_LONG_DIGITS)))
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

static __always_inline int hex_nibble(__u8 c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The UUID text (8-4-4-4-12 hex digits) at `at` in `buf` (of `size` bytes), into 16 bytes. */
static __always_inline int parse_uuid(const __u8 *buf, __u32 size, __u32 at, __u8 *out)
{
	__u32 i, j = 0;
	int hi, lo;

	for (i = 0; i < PY_UUID_LEN; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (load_u8(buf, at + i, size) != '-')
				return SPAN_FAULT;
			continue;
		}
		hi = hex_nibble(load_u8(buf, at + i, size));
		i++;
		lo = hex_nibble(load_u8(buf, at + i, size));
		if (hi < 0 || lo < 0 || j >= 16)
			return SPAN_FAULT;
		out[j++] = (__u8)(hi << 4 | lo);
	}
	return 0;
}

/* A str holding a UUID, parsed into 16 bytes at `out`. */
static __always_inline int read_uuid(struct scratch *w, __u64 str, __u8 *out)
{
	__u32 data = w->scfg.str_data, len;

	if (data < PY_STR_STATE + 4 || data > SPAN_BUF - PY_UUID_LEN + PY_STR_LENGTH)
		return SPAN_FAULT;
	/* From the length to the end of 36 characters: no byte past the object. */
	len = data - PY_STR_LENGTH + PY_UUID_LEN;
	if (!str || len > SPAN_BUF ||
	    bpf_probe_read_user(w->buf, len, (const void *)(str + PY_STR_LENGTH)))
		return SPAN_FAULT;
	if (span_u64(w, 0) != PY_UUID_LEN ||
	    (load_u32(w->buf, PY_STR_STATE - PY_STR_LENGTH, SPAN_BUF) & PY_STR_COMPACT_ASCII) !=
		    PY_STR_COMPACT_ASCII)
		return SPAN_FAULT;
	return parse_uuid(w->buf, SPAN_BUF, data - PY_STR_LENGTH, out);
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

/* spanprof.python_context: the address of the thread's PyContext, 16 hex digits. */
#define CTX_PY_CONTEXT_LEN 16

/*
 * 16 hex digits at `at` in w->win (garbage digits give garbage, never a fault). Branch-free:
 * '0'-'9' give c & 0xf, 'a'-'f' and 'A'-'F' (bit 6 set) that plus 9, any other byte some
 * nibble (kept to 4 bits, so it never spills into the next digit). A branch per digit (as
 * hex_nibble has) let the verifier on 6.18.44 walk its paths apart: span_published() went over
 * the 1,000,000-instruction limit and no program loaded.
 */
static __always_inline __u64 parse_hex64(const __u8 *buf, __u32 at)
{
	__u64 v = 0;
	__u32 i, c;

	for (i = 0; i < CTX_PY_CONTEXT_LEN; i++) {
		c = load_u8(buf, at + i, SPANPROF_PY_WINDOW);
		v = v << 4 | (__u64)(((c & 0xf) + 9 * (c >> 6)) & 0xf);
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
	__u32 off, key, len, size;
	__u8 *out = 0;
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
		w->q.result = parse_hex64(w->win, off);
		w->q.status |= 8;
		return 0;
	}
	if (len != PY_UUID_LEN)
		return 0;
	if (key == w->scfg.osp_keys[0]) {
		out = w->span.osp_base;
		bit = 1;
	} else if (key == w->scfg.osp_keys[1]) {
		out = w->span.osp_current;
		bit = 2;
	} else if (key == w->scfg.osp_keys[2]) {
		out = w->span.osp_parent;
		bit = 4;
	}
	if (out && !parse_uuid(w->win, SPANPROF_PY_WINDOW, off, out))
		w->q.status |= bit;
	return 0;
}

/*
 * The thread context record the process publishes for this thread (OTEP 4947), if any: its
 * OpenTelemetry ids, and the OSProfiler ids among its attributes.
 */
static __always_inline int published_ctx(struct scratch *w)
{
	const struct spanprof_span_proc *c = &w->scfg;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 fs = BPF_CORE_READ(task, thread.fsbase), addr, rec = 0, dtv = 0, block = 0, len = 0;
	__u32 size, found, otel;
	__u64 ctx = 0;

	if (c->tls_kind == SPANPROF_TLS_STATIC) {
		addr = fs + c->tls_offset;
	} else {
		if (read_ptr(&dtv, fs + TCB_DTV) || !dtv || read_ptr(&len, dtv - DTV_ENTRY))
			return SPAN_FAULT;
		/*
		 * dtv[-1] counts the slots: a thread whose DTV predates the module's dlopen has no
		 * slot for it yet (its first access of the module's TLS makes one).
		 */
		if (c->tls_module > len)
			return 0;
		if (read_ptr(&block, dtv + c->tls_module * DTV_ENTRY))
			return SPAN_FAULT;
		/* The thread never touched the module's TLS: nothing published. */
		if (block < 4096 || block == DTV_UNALLOCATED)
			return 0;
		addr = block + c->tls_offset;
	}
	if (read_ptr(&rec, addr))
		return SPAN_FAULT;
	if (!rec)
		return 0;
	if (bpf_probe_read_user(w->buf, CTX_RECORD_HEADER, (const void *)rec))
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
		if (bpf_probe_read_user(w->win, size, (const void *)(rec + CTX_RECORD_HEADER)))
			return SPAN_FAULT;
		w->q.i = 0;
		w->q.nentries = size;
		w->q.status = 0;
		w->q.result = 0;
		{
			__u32 slot = w->slot;

			bpf_loop(CTX_ATTRS_ENTRIES, ctx_attr_step, &slot, 0);
		}
		found = (__u32)w->q.status;
	}
	/*
	 * The OpenTelemetry ids belong to the Python context they were published in: a thread now
	 * in another one (an asyncio task switch, Context.run) has moved on without the publisher
	 * knowing, and the span is read from the interpreter instead.
	 */
	if (otel && (found & 8) && w->tstate &&
	    (read_ptr(&ctx, w->tstate + c->tstate_context) || ctx != w->q.result))
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
static __always_inline int otel_span(struct scratch *w, __u64 tstate)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, ids[2] = {}, ts[3] = {}, var[3] = {}, again[3] = {};

	/* PyThreadState: context, context_ver, id; PyContextVar: var_cached, _tsid, _tsver. */
	if (bpf_probe_read_user(ts, sizeof(ts), (const void *)(tstate + c->tstate_context)) ||
	    bpf_probe_read_user(var, sizeof(var), (const void *)(c->otel_var + CONTEXTVAR_CACHED)))
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
	    !bpf_probe_read_user(again, sizeof(again),
				 (const void *)(c->otel_var + CONTEXTVAR_CACHED)) &&
	    again[0] == var[0] && again[1] == var[1] && again[2] == var[2]) {
		v = var[0];
	} else {
		if (read_ptr(&v, ts[0] + c->context_vars) || !v || read_ptr(&v, v + c->hamt_root))
			return SPAN_FAULT;
		v = hamt_get(w, v, c->otel_var, c->otel_var_hash);
		if (!v) /* the thread never set OpenTelemetry's context */
			return w->q.status;
	}
	v = dict_get(w, v, c->otel_key, c->otel_key_hash);
	if (!v) /* no current span */
		return w->q.status;
	w->name_obj[0] = v;
	v = getattr(w, v, c->context_name, c->context_name_hash);
	if (!v || bpf_probe_read_user(ids, sizeof(ids), (const void *)(v + c->tuple_items)))
		return SPAN_FAULT;
	if (read_int(w, ids[0], w->span.trace_id, 16) || read_int(w, ids[1], w->span.span_id, 8))
		return SPAN_FAULT;
	/* INVALID_SPAN's zero ids: not a span. */
	if (!load_u64(w->span.span_id, 0, 8) ||
	    !(load_u64(w->span.trace_id, 0, 16) | load_u64(w->span.trace_id, 8, 16)))
		return 0;
	w->span.flags |= SPANPROF_SPAN_OTEL;
	return 0;
}

/* The str at position `i` of a deque, given its first block and first index. */
static __always_inline __u64 deque_item(__u64 block, __u64 first, __u64 i)
{
	__u64 v = 0, pos = first + i;

	/* Trace stacks are short: follow at most one block link. */
	if (pos >= DEQUE_BLOCKLEN) {
		if (read_ptr(&block, block + 8 + DEQUE_BLOCKLEN * 8) || !block)
			return 0;
		pos -= DEQUE_BLOCKLEN;
		if (pos >= DEQUE_BLOCKLEN)
			return 0;
	}
	if (read_ptr(&v, block + DEQUE_BLOCK_DATA + pos * 8))
		return 0;
	return v;
}

/* OSProfiler's trace stack of the thread: base id first, the current trace point last. */
static __always_inline int osp_trace(struct scratch *w, __u64 tstate)
{
	const struct spanprof_span_proc *c = &w->scfg;
	__u64 v = 0, d[5] = {}, n, left, right, lefti, righti, str, len, items[DEQUE_ITEMS] = {};

	if (read_ptr(&v, tstate + c->tstate_local))
		return SPAN_FAULT;
	if (!v) /* no thread dict, or no local key: the thread never used a threading.local */
		return 0;
	if (c->local_kind == SPANPROF_LOCAL_TSTATE_DICT) {
		v = dict_get(w, v, c->osp_local, c->osp_local_hash);
		if (!v)
			return w->q.status; /* this thread never used OSProfiler's local */
		if (read_ptr(&v, v + PY_LOCALDUMMY_DICT))
			return SPAN_FAULT;
	} else {
		/* 3.13: the local's dicts, keyed by the thread's key object (hashed by address). */
		v = dict_get(w, c->osp_local, v, v >> 4 | v << 60);
		if (!v)
			return w->q.status;
	}
	v = dict_get(w, v, c->osp_profiler_name, c->osp_profiler_name_hash);
	if (!v)
		return w->q.status;
	/* `profiler` is None between requests (profiler.clean()). */
	if (read_ptr(&str, v + PY_OB_TYPE))
		return SPAN_FAULT;
	if (str != c->osp_profiler_type)
		return 0;
	w->name_obj[1] = v;
	v = getattr(w, v, c->osp_stack_name, c->osp_stack_name_hash);
	if (!v || bpf_probe_read_user(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
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
		    bpf_probe_read_user(items, len, (const void *)(left + DEQUE_BLOCK_DATA + lefti * 8)))
			return SPAN_FAULT;
	} else {
		items[0] = deque_item(left, lefti, 0);
		items[DEQUE_ITEMS - 1] = deque_item(left, lefti, n - 1);
		if (n >= 2)
			items[DEQUE_ITEMS - 2] = deque_item(left, lefti, n - 2);
		n = DEQUE_ITEMS;
	}
	if (read_uuid(w, items[0], w->span.osp_base) ||
	    read_uuid(w, items[(n - 1) & (DEQUE_ITEMS - 1)], w->span.osp_current))
		return SPAN_FAULT;
	w->span.flags |= SPANPROF_SPAN_OSP;
	if (n >= 2 && !read_uuid(w, items[(n - 2) & (DEQUE_ITEMS - 1)], w->span.osp_parent))
		w->span.flags |= SPANPROF_SPAN_OSP_PARENT;
	return 0;
}

/*
 * The str `str` as a name: into out[SPANPROF_SPAN_NAME_MAX], its length into *out_len (0: no
 * name). Only an exact str (ob_type is str_type) that is compact ASCII gives a name, of which
 * the first SPANPROF_SPAN_NAME_MAX bytes are kept: a non-ASCII name, a str subclass or another
 * object gives none. Two reads: the header, then no more data than the str holds.
 */
static __always_inline int read_name(struct scratch *w, __u64 str, __u8 *out, __u8 *out_len)
{
	__u64 hdr[4] = {}; /* ob_type, length, hash, state (Include/cpython/unicodeobject.h) */
	__u64 n, data = w->scfg.str_data;

	*out_len = 0;
	if (!str || bpf_probe_read_user(hdr, sizeof(hdr), (const void *)(str + PY_OB_TYPE)))
		return SPAN_FAULT;
	if (hdr[0] != w->scfg.str_type ||
	    ((__u32)hdr[3] & PY_STR_COMPACT_ASCII) != PY_STR_COMPACT_ASCII)
		return 0;
	n = hdr[1] < SPANPROF_SPAN_NAME_MAX ? hdr[1] : SPANPROF_SPAN_NAME_MAX;
	asm volatile("" : "+r"(n)); /* the bound is checked on the register used */
	if (n == 0 || n > SPANPROF_SPAN_NAME_MAX)
		return 0;
	if (data < PY_STR_STATE + 4 || data > 64 ||
	    bpf_probe_read_user(out, n, (const void *)(str + data)))
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
__attribute__((noinline)) int span_name(__u32 slot, __u32 osp)
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
	if (obj && obj == w->attrs_obj)
		v = keys_find(w, w->kvalues, w->scfg.name_attr, w->scfg.name_attr_hash);
	else
		v = getattr(w, obj, w->scfg.name_attr, w->scfg.name_attr_hash);
	if (!v) /* a span without `_name` (NonRecordingSpan), or a fault */
		return w->q.status;
	if (!osp) {
		err = read_name(w, v, w->span.otel_name, &w->span.otel_name_len);
		if (!err && w->span.otel_name_len)
			w->span.flags |= SPANPROF_SPAN_OTEL_NAME;
		return err;
	}
	/* deque: ob_size, leftblock, rightblock, leftindex, rightindex; the last item at the right. */
	if (bpf_probe_read_user(d, sizeof(d), (const void *)(v + DEQUE_SIZE)))
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
	    read_ptr(&str, d[2] + DEQUE_BLOCK_DATA + d[4] * 8))
		return SPAN_FAULT;
	err = read_name(w, str, w->span.osp_name, &w->span.osp_name_len);
	if (!err && w->span.osp_name_len)
		w->span.flags |= SPANPROF_SPAN_OSP_NAME;
	return err;
}

/* The id readers (span_read.h says why they are global functions). */
__attribute__((noinline)) int span_published(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w ? published_ctx(w) : 0;
}

__attribute__((noinline)) int span_otel(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? otel_span(w, w->tstate) : 0;
}

__attribute__((noinline)) int span_osp(__u32 slot)
{
	struct scratch *w = get_scratch(slot);

	return w && w->tstate ? osp_trace(w, w->tstate) : 0;
}
