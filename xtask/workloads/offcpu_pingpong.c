/* offcpu_pingpong: two threads pass a byte back and forth through two pipes,
 * the classic context-switch benchmark (lmbench's lat_ctx, without the cache
 * footprint), target of `cargo xtask bench --only offcpu`.
 *
 *   main  -> ping_side: write(ping) then read(pong)     (blocks until the partner answers)
 *   partner -> pong_side: read(ping) then write(pong)   (blocks until main writes)
 *
 * Every hop wakes the other thread and blocks the one that wrote in a read of
 * an empty pipe, so each round trip is at least two voluntary context switches
 * (four when the threads run on different CPUs, each switching to and from the
 * idle task), and the time off CPU is what the workload is made of.
 *
 * Like fixed_work it does a fixed amount of work: it prints its pid, waits for
 * one byte (or EOF) on stdin, then makes ROUND_TRIPS round trips and prints one
 * JSON line on stdout: the round trips, the seconds they took (CLOCK_MONOTONIC
 * around the loop) and the context switches of the process in that time
 * (getrusage(RUSAGE_SELF): every thread), voluntary and involuntary.
 *
 * With --cpu N both threads are pinned to CPU N: each round trip is then two
 * switches from one thread straight to the other (the woken thread often
 * preempts the writer), and the loop's time is steady from run to run. Left to
 * the scheduler on a 2-CPU VM, the threads sometimes share a CPU and sometimes
 * not (every hop then a cross-CPU wake-up from idle), and the same loop takes
 * 1 s or 8 s.
 *
 * Usage: offcpu_pingpong [--cpu N] [ROUND_TRIPS]   (default 200000) */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Forces a frame-pointer set-up in leaf functions (see tests/workloads/common.h). */
static void *volatile frame_sink;
#define KEEP_FRAME_POINTER() (frame_sink = __builtin_frame_address(0))

static int ping[2], pong[2];
static long trips;

static void die(const char *what)
{
	fprintf(stderr, "offcpu_pingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void put(int fd)
{
	char c = 'x';
	ssize_t n;
	do
		n = write(fd, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		die("write");
}

static void get(int fd)
{
	char c;
	ssize_t n;
	do
		n = read(fd, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		die("read");
}

__attribute__((noinline, noclone)) void pong_side(void)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < trips; i++) {
		get(ping[0]);
		put(pong[1]);
	}
}

__attribute__((noinline, noclone)) void ping_side(void)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < trips; i++) {
		put(ping[1]);
		get(pong[0]);
	}
}

/* Pins the calling thread to `cpu` (nothing when it is negative). */
static void pin(int cpu)
{
	if (cpu < 0)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		die("sched_setaffinity");
}

static int cpu = -1;

static void *partner(void *arg)
{
	(void)arg;
	pin(cpu);
	pong_side();
	return NULL;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int arg = 1;
	if (argc > 2 && strcmp(argv[1], "--cpu") == 0) {
		char *end = NULL;
		long n = strtol(argv[2], &end, 10);
		if (end == argv[2] || *end != '\0' || n < 0 || n >= CPU_SETSIZE) {
			fprintf(stderr, "%s: bad --cpu %s\n", argv[0], argv[2]);
			return 2;
		}
		cpu = (int)n;
		arg = 3;
	}
	trips = argc > arg ? strtol(argv[arg], NULL, 10) : 200000;
	if (argc > arg + 1 || trips <= 0 || trips > 1000000000L) {
		fprintf(stderr, "usage: %s [--cpu N] [ROUND_TRIPS]  (1 to 1e9)\n", argv[0]);
		return 2;
	}
	pin(cpu);
	if (pipe(ping) != 0 || pipe(pong) != 0)
		die("pipe");
	pthread_t thread;
	if (pthread_create(&thread, NULL, partner, NULL) != 0)
		die("pthread_create");
	printf("%d\n", (int)getpid());
	fflush(stdout);
	char go;
	if (read(0, &go, 1) < 0)
		die("read stdin");

	struct rusage r0, r1;
	getrusage(RUSAGE_SELF, &r0);
	double t0 = now();
	ping_side();
	double t1 = now();
	getrusage(RUSAGE_SELF, &r1);
	if (pthread_join(thread, NULL) != 0)
		die("pthread_join");
	printf("{\"round_trips\": %ld, \"seconds\": %.9f, \"voluntary_switches\": %ld, "
	       "\"involuntary_switches\": %ld}\n",
	       trips, t1 - t0, r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw);
	return 0;
}
