/* forker: a parent that forks a CPU-bound child and waits for it.
 *
 *   parent: main -> waitpid (blocked, off-CPU)
 *   child:  main -> child_work  (on-CPU for the whole run)
 *
 * The parent sleeps 200 ms before forking so the child is born after any
 * profiler started on the parent is attached: it tests that new children are
 * followed, not only processes that existed at start. Exits with the child's
 * status.
 *
 * Usage: forker [SECONDS]   (prints the parent's pid first) */
#include <stdint.h>
#include <sys/wait.h>

#include "common.h"

static volatile uint64_t sink;

__attribute__((noinline, noclone)) void child_work(double deadline)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	while (now_seconds() < deadline) {
		for (uint32_t i = 0; i < 100000u; i++) {
			acc = acc * 6364136223846793005ull + 1442695040888963407ull;
			__asm__ volatile("" : "+r"(acc) : : "memory");
		}
	}
	sink = acc;
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	double deadline = now_seconds() + seconds;
	struct timespec delay = { .tv_sec = 0, .tv_nsec = 200 * 1000 * 1000 };
	nanosleep(&delay, NULL);

	pid_t child = fork();
	if (child < 0) {
		perror("fork");
		return 1;
	}
	if (child == 0) {
		child_work(deadline);
		_exit(0);
	}
	int status = 0;
	while (waitpid(child, &status, 0) < 0) {
		if (errno != EINTR) {
			perror("waitpid");
			return 1;
		}
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
