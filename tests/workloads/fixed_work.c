/* fixed_work: a fixed amount of CPU work for overhead benchmarks.
 *
 *   main -> dispatcher -> hot_alpha (3 units) / hot_beta (1 unit), ROUNDS times
 *
 * Unlike cpu_split it does not run for a time but for a number of rounds, so
 * its CPU time with and without a profiler attached can be compared. It prints
 * its pid, then waits for one byte (or EOF) on stdin before starting, so the
 * profiler can attach first.
 *
 * Usage: fixed_work [ROUNDS]   (default 20000) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Forces a frame-pointer set-up in leaf functions (see common.h). */
static void *volatile frame_sink;
#define KEEP_FRAME_POINTER() (frame_sink = __builtin_frame_address(0))

#define UNIT_ITERATIONS 20000u

static volatile uint64_t sink;

static inline uint64_t spin(uint32_t units, uint64_t acc)
{
	for (uint32_t i = 0; i < units * UNIT_ITERATIONS; i++) {
		acc = acc * 6364136223846793005ull + 1442695040888963407ull;
		__asm__ volatile("" : "+r"(acc) : : "memory");
	}
	return acc;
}

__attribute__((noinline, noclone)) void hot_alpha(void)
{
	KEEP_FRAME_POINTER();
	sink = spin(3u, sink);
}

__attribute__((noinline, noclone)) void hot_beta(void)
{
	KEEP_FRAME_POINTER();
	sink = spin(1u, sink);
}

__attribute__((noinline, noclone)) void dispatcher(void)
{
	hot_alpha();
	hot_beta();
	__asm__ volatile("" : : : "memory");
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
	if (rounds <= 0 || rounds > 100000000L) {
		fprintf(stderr, "usage: %s [ROUNDS]  (1 to 1e8)\n", argv[0]);
		return 2;
	}
	printf("%d\n", (int)getpid());
	fflush(stdout);
	char go;
	if (read(0, &go, 1) < 0)
		return 1;
	for (long r = 0; r < rounds; r++)
		dispatcher();
	return 0;
}
