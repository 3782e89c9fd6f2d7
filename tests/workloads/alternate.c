/* alternate: two threads, each alternating between two functions in phases
 * of PHASE_MS of CPU work, so a timeline of either thread switches between
 * phase_a and phase_b about 1000 / PHASE_MS times a second (truth for the
 * speedscope timeline test; an aggregated profile shows each once).
 *
 * Usage: alternate [SECONDS]   (prints its pid first) */
#include <pthread.h>
#include <stdint.h>

#include "common.h"

#define PHASE_MS 40

static double deadline;
static volatile uint64_t sink;

/* NB: noipa: gcc would fold the two functions into one (identical code) or
 * make them tail calls; each does its own, different, work. */
__attribute__((noipa)) void phase_a(double end)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	while (now_seconds() < end)
		SPIN(1u, acc);
	sink = acc;
}

__attribute__((noipa)) void phase_b(double end)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	while (now_seconds() < end)
		SPIN(2u, acc);
	sink = acc + 1;
}

static void *worker(void *arg)
{
	(void)arg;
	int a = 1;
	for (double now = now_seconds(); now < deadline; now = now_seconds()) {
		double end = now + PHASE_MS / 1000.0;
		if (a)
			phase_a(end);
		else
			phase_b(end);
		a = !a;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	deadline = now_seconds() + seconds;
	pthread_t other;
	if (pthread_create(&other, NULL, worker, NULL) != 0)
		return 1;
	worker(NULL);
	pthread_join(other, NULL);
	return 0;
}
