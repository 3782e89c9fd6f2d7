/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The span context of a sampled thread (Python, or any process publishing an OTEP 4947 thread
 * context): what the sampling units call (read_span) and
 * the four readers it calls, global BPF functions defined in span_read.bpf.c (linked into the
 * object by libbpf's static linker) and verified by the kernel once each, on their own.
 *
 * Bounds: at most six reader calls per sample (span_name twice; span_thread_name at a thread's
 * first sample, then at most once a second once it found a name, every 2 ms while it finds
 * none), each of bounded work (see span_read.bpf.c);
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
int span_published(__u32 slot TASK_GP);
int span_otel(__u32 slot TASK_GP);
int span_osp(__u32 slot TASK_GP);
/* The name of the span whose ids span_otel (osp == 0) or span_osp (osp == 1) read. */
int span_name(__u32 slot, __u32 osp TASK_GP);
/* The sampled thread's threading name: threading._active[pthread_self()]._name. */
int span_thread_name(__u32 slot TASK_GP);

/*
 * Reads the span context of the thread sampled in the scratch of `slot` (its PyThreadState in
 * w->tstate, 0 outside Python) and puts it `off` bytes into the sample's stacks, right after
 * the frames (the `span` member only reserves the room), if it fits. Returns its size in the
 * record (0: no span). A global function too: inlined, the copy alone was checked on every path
 * that reached it, a tenth of the verifier's work on each sampling program.
 */
int read_span(__u32 slot, __u64 off TASK_GP);

#endif /* SPANPROF_SPAN_READ_H */
