/* offcpu_sleep: a native thread that sleeps in nanosleep, for the off-CPU tests.
 *
 *   main -> sleep_rounds -> nap -> nanosleep(US µs)   ROUNDS times
 *
 * Sleeps of 100 ms (the default) are longer than any sampling period, so a
 * profiler records each whole; sleeps shorter than the period (e.g. 500 µs
 * at 499 Hz, a 2 ms period) are kept one in (period / sleep), which checks
 * that the sampling is unbiased.
 *
 * Each nanosleep is timed (CLOCK_MONOTONIC around the call, so the time the
 * thread is blocked plus the microseconds of the call itself). It prints its pid
 * on the first line, then when done one JSON line: the rounds and the seconds
 * spent in nap, in total.
 *
 * Usage: offcpu_sleep [ROUNDS [US]]   (default 5 rounds of 100000 µs) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Forces a frame-pointer set-up in leaf functions (see tests/workloads/common.h). */
static void *volatile frame_sink;
#define KEEP_FRAME_POINTER() (frame_sink = __builtin_frame_address(0))

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

__attribute__((noinline, noclone)) void nap(long us)
{
	KEEP_FRAME_POINTER();
	struct timespec ts = {us / 1000000L, (us % 1000000L) * 1000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

__attribute__((noinline, noclone)) double sleep_rounds(long rounds, long us)
{
	double slept = 0.0;
	KEEP_FRAME_POINTER();
	for (long i = 0; i < rounds; i++) {
		double t0 = now();
		nap(us);
		slept += now() - t0;
	}
	return slept;
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 5;
	long us = argc > 2 ? strtol(argv[2], NULL, 10) : 100000;
	if (argc > 3 || rounds <= 0 || rounds > 1000000 || us <= 0 || us > 60000000L) {
		fprintf(stderr, "usage: %s [ROUNDS [US]]  (1 to 1e6 rounds of 1 µs to 60 s)\n",
			argv[0]);
		return 2;
	}
	printf("%d\n", (int)getpid());
	fflush(stdout);
	double slept = sleep_rounds(rounds, us);
	printf("{\"rounds\": %ld, \"us\": %ld, \"nap_seconds\": %.9f}\n", rounds, us, slept);
	return 0;
}
