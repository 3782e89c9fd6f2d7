// SPDX-License-Identifier: GPL-2.0
/*
 * The definitions of every map and setting that maps.h declares (the other units see them
 * `extern`), and the object's license. No program: the static linker (build.rs) merges this unit
 * with the others into the one object user space loads.
 */
#define SPANPROF_MAPS_DEFINE
#include "maps.h"

char LICENSE[] SEC("license") = "GPL";
