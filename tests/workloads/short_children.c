/* short_children: a parent that starts many short-lived children, a few at a time.
 *
 *   short_children work MS
 *       busy in short_child_work for MS ms of wall-clock time, then exit (what an exec'd
 *       child runs);
 *   short_children start N MS PAR fork|PREFIX [usr1]
 *       start N children, at most PAR at a time, each busy MS ms: `fork` children stay this
 *       program (main -> spawn_children -> short_child_work); otherwise child i execs
 *       PREFIX<i> (copies of this program, e.g. with distinct build ids) with `work MS`.
 *       Prints its pid first; with `usr1`, starts only when it receives SIGUSR1 (so a
 *       profiler can be attached first). Exits 0 when every child exited 0.
 *
 * Built twice: `short_children`, and `short_children_big` with -DBIG_BINARY: thousands of
 * extra functions make its symbol table, DWARF and unwind tables big (a few MB), as real
 * programs' are, so that what a profiler keeps per distinct binary shows. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"

static volatile uint64_t sink;

__attribute__((noinline, noclone)) void short_child_work(double ms)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	double deadline = now_seconds() + ms / 1000.0;
	while (now_seconds() < deadline)
		SPIN(1, acc);
	sink = acc;
}

#ifdef BIG_BINARY
/* 16000 distinct functions, each with its symbol, DWARF entry and unwind entry. */
#define FILL(n)                                                                      \
	__attribute__((noinline, used)) uint64_t filler_##n(uint64_t x)                  \
	{                                                                            \
		KEEP_FRAME_POINTER();                                                \
		return x * (n##ull | 1) + (x >> (n % 7));                            \
	}
#define FILL10(n) FILL(n##0) FILL(n##1) FILL(n##2) FILL(n##3) FILL(n##4) \
	FILL(n##5) FILL(n##6) FILL(n##7) FILL(n##8) FILL(n##9)
#define FILL100(n) FILL10(n##0) FILL10(n##1) FILL10(n##2) FILL10(n##3) FILL10(n##4) \
	FILL10(n##5) FILL10(n##6) FILL10(n##7) FILL10(n##8) FILL10(n##9)
#define FILL1000(n) FILL100(n##0) FILL100(n##1) FILL100(n##2) FILL100(n##3) \
	FILL100(n##4) FILL100(n##5) FILL100(n##6) FILL100(n##7) FILL100(n##8) FILL100(n##9)
FILL1000(1) FILL1000(2) FILL1000(3) FILL1000(4) FILL1000(5) FILL1000(6) FILL1000(7)
FILL1000(8) FILL1000(9) FILL1000(10) FILL1000(11) FILL1000(12) FILL1000(13) FILL1000(14)
FILL1000(15) FILL1000(16)
#endif

static double parse_ms(const char *s)
{
	char *end = NULL;
	errno = 0;
	double ms = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || ms < 0.0 || ms > 600000.0) {
		fprintf(stderr, "bad milliseconds: %s\n", s);
		exit(2);
	}
	return ms;
}

static int wait_one(void)
{
	int status = 0;
	while (wait(&status) < 0) {
		if (errno != EINTR) {
			perror("wait");
			return 1;
		}
	}
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

__attribute__((noinline)) int spawn_children(long n, double ms, long par, const char *prefix)
{
	int failed = 0;
	long running = 0;
	char path[4096], arg[64];
	KEEP_FRAME_POINTER();
	snprintf(arg, sizeof(arg), "%g", ms);
	for (long i = 0; i < n; i++) {
		if (running == par) {
			failed |= wait_one();
			running--;
		}
		pid_t child = fork();
		if (child < 0) {
			perror("fork");
			return 1;
		}
		if (child == 0) {
			if (prefix == NULL) {
				short_child_work(ms);
				_exit(0);
			}
			snprintf(path, sizeof(path), "%s%ld", prefix, i);
			execl(path, path, "work", arg, (char *)NULL);
			perror(path);
			_exit(127);
		}
		running++;
	}
	while (running-- > 0)
		failed |= wait_one();
	return failed;
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "work") == 0) {
		short_child_work(parse_ms(argv[2]));
		return 0;
	}
	if ((argc != 6 && argc != 7) || strcmp(argv[1], "start") != 0 ||
	    (argc == 7 && strcmp(argv[6], "usr1") != 0)) {
		fprintf(stderr, "usage: %s work MS | %s start N MS PAR fork|PREFIX [usr1]\n",
			argv[0], argv[0]);
		return 2;
	}
	long n = strtol(argv[2], NULL, 10), par = strtol(argv[4], NULL, 10);
	double ms = parse_ms(argv[3]);
	const char *prefix = strcmp(argv[5], "fork") == 0 ? NULL : argv[5];
	if (n < 0 || par < 1) {
		fprintf(stderr, "bad N or PAR\n");
		return 2;
	}
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (argc == 7 && sigprocmask(SIG_BLOCK, &usr1, NULL) != 0) {
		perror("sigprocmask");
		return 1;
	}
	announce_pid();
	if (argc == 7) {
		int sig = 0;
		if (sigwait(&usr1, &sig) != 0) {
			fprintf(stderr, "sigwait failed\n");
			return 1;
		}
	}
	return spawn_children(n, ms, par, prefix);
}
