/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The span context of a sampled thread (Python, or any process publishing an OTEP 4947 thread
 * context): what the sampling units call (read_span) and
 * the four readers it calls, global BPF functions defined in span_read.bpf.c (linked into the
 * object by libbpf's static linker) and verified by the kernel once each, on their own.
 *
 * Bounds: at most four reader calls per sample, each of bounded work (see span_read.bpf.c);
 * a reader that meets a failed read or garbage makes the sample count SPANPROF_ERR_SPAN_READ.
 */
#ifndef SPANPROF_SPAN_READ_H
#define SPANPROF_SPAN_READ_H

#include "helpers.h"

/* A lookup that met a failed read or garbage (not "no span"): counted in SPANPROF_ERR_SPAN_READ. */
#define SPAN_FAULT (-1)

/*
 * The readers, global functions: the verifier checks each once, on its own, instead of once per
 * path through the sampling program (together, inlined, they took 800k of its 1M instructions
 * and 17 s to load). They find their state in the scratch of `slot`; 0 or SPAN_FAULT.
 */
int span_published(__u32 slot);
int span_otel(__u32 slot);
int span_osp(__u32 slot);
/* The name of the span whose ids span_otel (osp == 0) or span_osp (osp == 1) read. */
int span_name(__u32 slot, __u32 osp);

/*
 * Reads the span context of the thread whose PyThreadState is w->tstate into w->span; returns
 * its size in the record (0: no span).
 */
static __always_inline __u32 read_span(struct scratch *w, __u32 tgid)
{
	const struct spanprof_span_proc *cfg;
	int bad = 0;

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
	if (w->scfg.tls_kind != SPANPROF_TLS_NONE && span_published(w->slot))
		bad = 1;
	if (w->scfg.otel_var && !(w->span.flags & SPANPROF_SPAN_OTEL) && span_otel(w->slot))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OTEL) && w->name_obj[0] &&
	    span_name(w->slot, 0))
		bad = 1;
	if (w->scfg.osp_local && !(w->span.flags & SPANPROF_SPAN_OSP) && span_osp(w->slot))
		bad = 1;
	if (w->scfg.name_attr && (w->span.flags & SPANPROF_SPAN_OSP) && w->name_obj[1] &&
	    span_name(w->slot, 1))
		bad = 1;
	if (bad)
		count_error(SPANPROF_ERR_SPAN_READ);
	return w->span.flags ? sizeof(struct spanprof_span) : 0;
}

#endif /* SPANPROF_SPAN_READ_H */
