/* ci_bench: the benchmark of the CI examples and of `tests/tests/ci.rs`. It
 * does a fixed amount of work and exits, as a benchmark in a CI job does:
 *
 *   main -> run_round -> parse_input     1 unit of work  (25% of CPU)
 *                     -> compute_scores  2 units         (50%)
 *                     -> render_output   1 unit          (25%)
 *
 * Built a second time with -DSLOW_RENDER (`ci_bench_slow`), render_output
 * does 2 units: 40% of the CPU, compute_scores 40%, parse_input 20%. That is
 * "one function made slower" between two builds of the same program.
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 * Usage: ci_bench [ROUNDS]   (default 20000; about 90 us of CPU per round
 * here, 110 us with -DSLOW_RENDER) */
#include <stdint.h>

#include "common.h"

#ifdef SLOW_RENDER
#define RENDER_UNITS 2u
#else
#define RENDER_UNITS 1u
#endif

static volatile uint64_t sink;

__attribute__((noinline, noclone)) void parse_input(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(1u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void compute_scores(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(2u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void render_output(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(RENDER_UNITS, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void run_round(void)
{
	parse_input();
	compute_scores();
	render_output();
	__asm__ volatile("" : : : "memory");
}

int main(int argc, char **argv)
{
	long rounds = 20000;
	if (argc > 1) {
		char *end = NULL;
		rounds = strtol(argv[1], &end, 10);
		if (end == argv[1] || *end != '\0' || rounds < 1 || rounds > 100000000) {
			fprintf(stderr, "usage: %s [ROUNDS]  (1 to 100000000)\n", argv[0]);
			return 2;
		}
	}
	for (long i = 0; i < rounds; i++)
		run_round();
	printf("%ld rounds\n", rounds);
	return 0;
}
