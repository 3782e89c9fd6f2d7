/* Shared helpers for the spanprof test workloads.
 *
 * Every workload takes the number of seconds to run as its only argument
 * (default 5), prints its pid on the first line of stdout, flushes, and then
 * works until the time is up. Tests read the pid from that line. */
#ifndef SPANPROF_WORKLOAD_COMMON_H
#define SPANPROF_WORKLOAD_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* NB: gcc -O2 omits the frame-pointer set-up of leaf functions that need no
 * stack, even with -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer. A
 * frame-pointer unwinder then skips the caller of such a leaf. Taking the
 * frame's address forces `push %rbp; mov %rsp,%rbp`.
 *
 * Built with -DWORKLOAD_NO_FRAME_POINTER (the `_nofp` workloads, for the
 * .eh_frame unwinding tests), it does nothing, so -fomit-frame-pointer really
 * leaves every function without a frame pointer. */
#ifndef WORKLOAD_NO_FRAME_POINTER
static void *volatile workload_frame_sink;
#define KEEP_FRAME_POINTER() (workload_frame_sink = __builtin_frame_address(0))
#else
#define KEEP_FRAME_POINTER() ((void)0)
#endif

/* One unit of CPU work: the same dependent chain of integer multiply-adds
 * on any x86 CPU, small (tens of microseconds) so that one sampling period
 * covers many units and the sampling clock cannot lock onto a loop's phase.
 *
 * NB: the empty asm with the accumulator as an in/out operand keeps -O2 from
 * folding or vectorising the loop; every iteration really runs. */
#define UNIT_ITERATIONS 20000u
#define SPIN(units, acc)                                                    \
	do {                                                                \
		for (uint32_t i_ = 0; i_ < (units) * UNIT_ITERATIONS; i_++) { \
			(acc) = (acc) * 6364136223846793005ull +            \
				1442695040888963407ull;                     \
			__asm__ volatile("" : "+r"(acc) : : "memory");      \
		}                                                           \
	} while (0)

static inline double workload_seconds(int argc, char **argv)
{
	if (argc < 2)
		return 5.0;
	char *end = NULL;
	errno = 0;
	double s = strtod(argv[1], &end);
	if (errno != 0 || end == argv[1] || *end != '\0' || s < 0.0 || s > 3600.0) {
		fprintf(stderr, "usage: %s [SECONDS]  (0 to 3600)\n", argv[0]);
		exit(2);
	}
	return s;
}

static inline double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void announce_pid(void)
{
	printf("%d\n", (int)getpid());
	fflush(stdout);
}

#endif
