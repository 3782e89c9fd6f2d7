/* forker: a parent that forks a CPU-bound child and waits for it.
 *
 *   parent: main -> waitpid (blocked, off-CPU)
 *   child:  main -> child_work  (on-CPU for the whole run)
 *
 * The parent sleeps 200 ms before forking so the child is born after any
 * profiler started on the parent is attached: it tests that new children are
 * followed, not only processes that existed at start. With `usr1` as second
 * argument it instead forks when it receives SIGUSR1, so that a test can fork
 * it exactly when a profiler already running on it says it is attached.
 * Exits with the child's status.
 *
 * Usage: forker [SECONDS [usr1]]   (prints the parent's pid first) */
#include <signal.h>
#include <stdint.h>
#include <string.h>
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
	int on_usr1 = argc > 2 && strcmp(argv[2], "usr1") == 0;
	if (argc > 2 && !on_usr1) {
		fprintf(stderr, "usage: %s [SECONDS [usr1]]\n", argv[0]);
		return 2;
	}
	/* NB: blocked before the pid is announced, so a SIGUSR1 sent as soon as
	 * the pid is known waits for sigwait instead of killing the process. */
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (on_usr1 && sigprocmask(SIG_BLOCK, &usr1, NULL) != 0) {
		perror("sigprocmask");
		return 1;
	}
	announce_pid();
	double deadline = now_seconds() + seconds;
	if (on_usr1) {
		int sig = 0;
		if (sigwait(&usr1, &sig) != 0) {
			fprintf(stderr, "sigwait failed\n");
			return 1;
		}
	} else {
		struct timespec delay = { .tv_sec = 0, .tv_nsec = 200 * 1000 * 1000 };
		nanosleep(&delay, NULL);
	}

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
