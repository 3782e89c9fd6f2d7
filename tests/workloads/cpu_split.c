/* cpu_split: a CPU-bound workload whose true profile is known.
 *
 *   main -> dispatcher -> hot_alpha   3 units of work  (75% of CPU)
 *                      -> hot_beta    1 unit of work   (25% of CPU)
 *
 * Each unit is the same dependent chain of integer multiply-adds, so the
 * split holds on any x86 CPU. A unit is small (tens of microseconds) so one
 * sampling period covers many dispatcher rounds and the sampling clock cannot
 * lock onto the loop's phase.
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 * Usage: cpu_split [SECONDS]   (prints its pid first) */
#include <stdint.h>

#include "common.h"

static volatile uint64_t sink;

__attribute__((noinline, noclone)) void hot_alpha(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(3u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void hot_beta(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(1u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void dispatcher(void)
{
	hot_alpha();
	hot_beta();
	__asm__ volatile("" : : : "memory");
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	double deadline = now_seconds() + seconds;
	while (now_seconds() < deadline) {
		for (int k = 0; k < 16; k++)
			dispatcher();
	}
	return 0;
}
