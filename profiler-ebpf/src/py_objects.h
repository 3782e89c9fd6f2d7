/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Reading CPython dicts and instance attributes of the target from BPF, for span reading
 * (span_read.bpf.c, the only unit that includes this): CPython's dict probing (keys compared by
 * identity, or by their stored hash), split and combined tables of every layout 3.8-3.13, and
 * instance attributes in a dict at tp_dictoffset or in managed/inline values through the type's
 * cached keys. Every lookup is a bpf_loop of at most DICT_PROBES probes of at most three reads.
 */
#ifndef SPANPROF_PY_OBJECTS_H
#define SPANPROF_PY_OBJECTS_H

#include "span_read.h"

/* Probes of one dict lookup: far beyond what real tables need. */
#define DICT_PROBES 32
/* Py_TPFLAGS_* (Include/object.h). */
#define PY_TPFLAGS_INLINE_VALUES (1ULL << 2)
#define PY_TPFLAGS_MANAGED_DICT (1ULL << 4)
/* offsetof(PyObject, ob_type). */
#define PY_OB_TYPE 8

static __always_inline __u64 span_u64(struct scratch *w, __u32 off)
{
	return load_u64(w->buf, off, SPAN_BUF);
}

/*
 * Reads 8 or 16 bytes of a keys object: from the block read with its header when they are in
 * it, else from the target.
 */
static __always_inline int keys_read(struct scratch *w, __u64 addr, __u64 *out, __u32 len TASK_P)
{
	__u64 off = addr - w->kbase;

	if (addr >= w->kbase && off <= KEYS_BLOCK - 16 && off + len <= w->klen) {
		out[0] = load_u64(w->kblock, (__u32)off, KEYS_BLOCK);
		if (len > 8)
			out[1] = load_u64(w->kblock, (__u32)off + 8, KEYS_BLOCK);
		return 0;
	}
	return user_read(out, len > 8 ? 16 : 8, (const void *)addr);
}

/* One probe of a dict lookup (CPython's open addressing: i = i*5 + perturb + 1). */
static long dict_probe_step(__u64 n, void *ctx)
{
	LOOP_TASK(ctx)
	struct scratch *w = loop_scratch(ctx);
	struct lookup *q;
	__u64 v = 0, kv[2] = {};
	__s64 ix;

	if (!w)
		return 1;
	q = &w->q;
	if (keys_read(w, q->index + q->i * q->width, &v, 8 TASK_A)) {
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
		__u64 at = q->entries + (__u64)ix * q->esize;

		/* By hash: a general table's entry begins with its key's hash. */
		if (q->by_hash && keys_read(w, at, kv, 8 TASK_A)) {
			q->status = SPAN_FAULT;
			return 1;
		}
		if (!q->by_hash || kv[0] == q->hash) {
			if (keys_read(w, at + q->koff, kv, 16 TASK_A)) {
				q->status = SPAN_FAULT;
				return 1;
			}
			if (q->by_hash || kv[0] == q->key) {
				if (q->values && read_ptr(&kv[1], q->values + (__u64)ix * 8 TASK_A)) {
					q->status = SPAN_FAULT;
					return 1;
				}
				q->rkey = kv[0];
				q->result = kv[1];
				q->status = 1;
				return 1;
			}
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
 * into the kblock of the scratch of `slot` (at w->kbase), with split `values` (0 for a combined
 * table): into w->q.result with w->q.status 1; status 0 when absent, SPAN_FAULT on garbage.
 * A global function, defined here because span_read.bpf.c is the only unit that includes this:
 * the verifier checks it (and its probe loop) once, not at each of the dozen lookups inlined in
 * the span readers, which made two fifths of their work. Returns 0.
 */
int keys_find(__u32 slot, __u64 values, __u64 key, __u64 hash TASK_GP)
{
	struct scratch *w = get_scratch(slot);
	struct lookup *q;
	__u64 size, index_bytes, keys;
	__u32 log2, log2_index, kind;

	if (!w)
		return 0;
	q = &w->q;
	keys = w->kbase;
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
	/* Only a combined general table holds keys that are not strs (and their hashes). */
	if (q->by_hash && (q->koff != 8 || values)) {
		q->status = 0;
		return 0;
	}
	q->values = values ? values + w->scfg.dict_values : 0;
	q->key = key;
	q->hash = hash;
	q->mask = size - 1;
	q->i = hash & q->mask;
	q->perturb = hash;
	q->status = 0;
	bpf_loop_task(DICT_PROBES, dict_probe_step, &slot, 0);
	return 0;
}

/* keys_find in the keys object `keys`, read first. */
static __always_inline __u64 keys_get(struct scratch *w, __u64 keys, __u64 values, __u64 key,
				      __u64 hash TASK_P)
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
	if (user_read(w->kblock, KEYS_BLOCK, (const void *)keys)) {
		w->klen = 40;
		if (user_read(w->kblock, 40, (const void *)keys))
			return 0;
	}
	keys_find(w->slot, values, key, hash TASK_A);
	return w->q.status == 1 ? w->q.result : 0;
}

/* dict[key] for a dict object (a subclass too: the dict part comes first). */
static __always_inline __u64 dict_get(struct scratch *w, __u64 dict, __u64 key, __u64 hash TASK_P)
{
	__u64 kv[2] = {}; /* ma_keys, ma_values */

	if (!dict || user_read(kv, sizeof(kv), (const void *)(dict + 32))) {
		w->q.status = SPAN_FAULT;
		return 0;
	}
	return keys_get(w, kv[0], kv[1], key, hash TASK_A);
}

/*
 * The value of the entry of `dict` whose key hashes to `hash` (its key in w->q.rkey): for keys
 * whose hash names them (an int, or a weak reference hashed as its referent's address), which
 * the caller then checks.
 */
static __always_inline __u64 dict_get_by_hash(struct scratch *w, __u64 dict, __u64 hash TASK_P)
{
	__u64 v;

	w->q.by_hash = 1;
	w->q.rkey = 0;
	v = dict_get(w, dict, 0, hash TASK_A);
	w->q.by_hash = 0;
	return v;
}

/* obj.name for an instance attribute (from the instance's dict or values), or 0. */
static __always_inline __u64 attr_lookup(struct scratch *w, __u64 obj, __u64 name, __u64 hash TASK_P)
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
	if (!obj || read_ptr(&type, obj + PY_OB_TYPE TASK_A) || !type ||
	    user_read(w->tblock, tlen, (const void *)(type + first)))
		return 0;
	flags = load_u64(w->tblock, w->scfg.type_flags - first, TYPE_BLOCK);
	if (w->scfg.attr_kind == SPANPROF_ATTR_DICTOFFSET || !(flags & PY_TPFLAGS_MANAGED_DICT)) {
		off = (__s64)load_u64(w->tblock, last - first, TYPE_BLOCK);
		if (off <= 0 || off > 4096 || read_ptr(&v, obj + off TASK_A))
			return 0;
		return dict_get(w, v, name, hash TASK_A);
	}
	/* A managed dict: the pre-header before the object holds the dict or the values. */
	if (user_read(pre, sizeof(pre), (const void *)(obj - 32)))
		return 0;
	switch (w->scfg.attr_kind) {
	case SPANPROF_ATTR_MANAGED: /* 3.11: values at -32, dict at -24 */
		if (pre[1])
			return dict_get(w, pre[1], name, hash TASK_A);
		v = pre[0];
		break;
	case SPANPROF_ATTR_TAGGED: /* 3.12: -24 holds the dict, or the values' address - 1 */
		if (!(pre[1] & 1))
			return pre[1] ? dict_get(w, pre[1], name, hash TASK_A) : 0;
		v = pre[1] + 1;
		break;
	default: /* 3.13: dict at -24, else values inline after the object */
		if (pre[1])
			return dict_get(w, pre[1], name, hash TASK_A);
		off = (__s64)load_u64(w->tblock, 0, TYPE_BLOCK);
		if (!(flags & PY_TPFLAGS_INLINE_VALUES) || off <= 0 || off > 4096)
			return 0;
		v = obj + off;
		/* PyDictValues.valid: 0 once the values moved to a dict. */
		if (user_read(&valid, 1, (const void *)(v + 3)) || !valid)
			return 0;
		break;
	}
	if (!v || read_ptr(&keys, type + w->scfg.type_cached_keys TASK_A))
		return 0;
	return keys_get(w, keys, v, name, hash TASK_A);
}

/* attr_lookup, noting whose attributes' keys are left in w->kblock when it found the name. */
static __always_inline __u64 getattr(struct scratch *w, __u64 obj, __u64 name, __u64 hash TASK_P)
{
	__u64 v = attr_lookup(w, obj, name, hash TASK_A);

	if (v)
		w->attrs_obj = obj;
	return v;
}

#endif /* SPANPROF_PY_OBJECTS_H */
