/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The CPython walk of a sampled thread (python_walk.bpf.c), for the units whose programs send
 * samples (send_sample.h).
 */
#ifndef SPANPROF_PYTHON_WALK_H
#define SPANPROF_PYTHON_WALK_H

#include "helpers.h"

/*
 * Appends the Python frames of the thread sampled in the scratch of `slot` (w->s.pid, w->s.tid)
 * after its `native` native frames, and sets w->tstate to its PyThreadState (0 when there is
 * none; a process not read as Python is left alone, and begin_sample set it to 0).
 * A global function, verified once on its own; returns 0.
 */
int py_walk(__u32 slot, __u64 native TASK_GP);

#endif /* SPANPROF_PYTHON_WALK_H */
