/* alloc_sizes: known calls of the C library's allocator from distinct functions, for the
 * allocation-profiling tests (tests/tests/alloc/).
 *
 *   main -> run_all -> alloc_small           malloc(64) x 20000 S, each freed at once
 *                   -> alloc_big             malloc(1 MiB) x 100 S, all kept
 *                   -> alloc_calloc          calloc(16, 256) (4096 B) x 5000 S, every other
 *                                            one freed at once, the rest kept
 *                   -> alloc_realloc         realloc(NULL, 2048) then realloc(p, 16384),
 *                                            x 5000 S, freed
 *                   -> alloc_posix_memalign  posix_memalign(64, 1000) x 5000 S, freed
 *                   -> alloc_aligned         aligned_alloc(4096, 8192) x 1000 S, kept
 *                   -> alloc_memalign        memalign(256, 3000) x 2000 S, freed
 *                   -> alloc_memalign_relay  posix_memalign(16, 512) x 5000 S, freed
 *
 * S is the scale (first argument, default 1). Each call is one allocation of the size asked
 * for; a realloc is an allocation of its new size (and, for the heap, the free of the block
 * it replaces). Two cases are there because glibc serves them with its own malloc: realloc
 * with a NULL pointer and posix_memalign with an alignment malloc gives anyway (<= 16 on
 * x86-64) call __libc_malloc, the function `malloc` names, so a probe on malloc fires inside
 * them too: a profiler that counts both probes counts those allocations twice.
 *
 * Every pointer is checked (a failed allocation exits 1) and written to (the first byte), so
 * that no call can be optimized away. What is kept is never freed: the process exits with
 * it allocated. Nothing else allocates between the calls; printf's buffer comes before the
 * first and after the last.
 *
 * It prints its pid on the first line, then when done one JSON line, the truth of each
 * function: {"scale": S, "functions": {"alloc_small": {"calls": N, "bytes": B, "kept_calls":
 * N, "kept_bytes": B}, ...}}.
 *
 * Usage: alloc_sizes [SCALE]   (1 to 1000) */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Forces a frame-pointer set-up in leaf functions (see tests/workloads/common.h). */
static void *volatile frame_sink;
#define KEEP_FRAME_POINTER() (frame_sink = __builtin_frame_address(0))

/* What one function did: allocation calls and their bytes, and those still allocated at the
 * end. */
struct truth {
	const char *name;
	long calls, bytes, kept_calls, kept_bytes;
};

#define N_FUNCTIONS 8
static struct truth truths[N_FUNCTIONS];

/* A NULL the compiler cannot see: it turns realloc(NULL, n) into malloc(n) otherwise. */
static void *volatile null_pointer;

/* Where the kept pointers go, so that they stay reachable. */
static void **kept;
static long n_kept;

static void *check(void *p)
{
	if (p == NULL) {
		fputs("alloc_sizes: out of memory\n", stderr);
		exit(1);
	}
	*(volatile char *)p = 1;
	return p;
}

static void note(struct truth *t, long size, int keep, void *p)
{
	t->calls++;
	t->bytes += size;
	if (keep) {
		t->kept_calls++;
		t->kept_bytes += size;
		kept[n_kept++] = p;
	}
}

__attribute__((noinline, noclone)) void alloc_small(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = check(malloc(64));
		note(t, 64, 0, p);
		free(p);
	}
}

__attribute__((noinline, noclone)) void alloc_big(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++)
		note(t, 1L << 20, 1, check(malloc(1L << 20)));
}

__attribute__((noinline, noclone)) void alloc_calloc(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = check(calloc(16, 256));
		note(t, 4096, i % 2 == 0, p);
		if (i % 2 != 0)
			free(p);
	}
}

__attribute__((noinline, noclone)) void alloc_realloc(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = check(realloc(null_pointer, 2048));
		note(t, 2048, 0, p);
		p = check(realloc(p, 16384));
		note(t, 16384, 0, p);
		free(p);
	}
}

__attribute__((noinline, noclone)) void alloc_posix_memalign(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = NULL;
		if (posix_memalign(&p, 64, 1000) != 0)
			p = NULL;
		note(t, 1000, 0, check(p));
		free(p);
	}
}

__attribute__((noinline, noclone)) void alloc_aligned(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++)
		note(t, 8192, 1, check(aligned_alloc(4096, 8192)));
}

__attribute__((noinline, noclone)) void alloc_memalign(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = check(memalign(256, 3000));
		note(t, 3000, 0, p);
		free(p);
	}
}

__attribute__((noinline, noclone)) void alloc_memalign_relay(struct truth *t, long n)
{
	KEEP_FRAME_POINTER();
	for (long i = 0; i < n; i++) {
		void *p = NULL;
		if (posix_memalign(&p, 16, 512) != 0)
			p = NULL;
		note(t, 512, 0, check(p));
		free(p);
	}
}

__attribute__((noinline, noclone)) void run_all(long s)
{
	KEEP_FRAME_POINTER();
	alloc_small(&truths[0], 20000 * s);
	alloc_big(&truths[1], 100 * s);
	alloc_calloc(&truths[2], 5000 * s);
	alloc_realloc(&truths[3], 5000 * s);
	alloc_posix_memalign(&truths[4], 5000 * s);
	alloc_aligned(&truths[5], 1000 * s);
	alloc_memalign(&truths[6], 2000 * s);
	alloc_memalign_relay(&truths[7], 5000 * s);
	/* Not a tail call: run_all stays on the stack under alloc_memalign_relay. */
	__asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
	static const char *names[N_FUNCTIONS] = {
		"alloc_small",	 "alloc_big",	  "alloc_calloc",   "alloc_realloc",
		"alloc_posix_memalign", "alloc_aligned", "alloc_memalign", "alloc_memalign_relay",
	};
	long scale = argc > 1 ? strtol(argv[1], NULL, 10) : 1;
	if (argc > 2 || scale < 1 || scale > 1000) {
		fprintf(stderr, "usage: %s [SCALE]  (1 to 1000)\n", argv[0]);
		return 2;
	}
	for (int i = 0; i < N_FUNCTIONS; i++)
		truths[i].name = names[i];
	/* The kept pointers: alloc_big's, half of alloc_calloc's, alloc_aligned's. Allocated
	 * before the pid is printed, like printf's buffer. */
	kept = check(calloc((size_t)(100 + 2500 + 1000) * (size_t)scale, sizeof(void *)));
	printf("%d\n", (int)getpid());
	fflush(stdout);
	run_all(scale);
	printf("{\"scale\": %ld, \"functions\": {", scale);
	for (int i = 0; i < N_FUNCTIONS; i++) {
		const struct truth *t = &truths[i];
		printf("%s\"%s\": {\"calls\": %ld, \"bytes\": %ld, \"kept_calls\": %ld, "
		       "\"kept_bytes\": %ld}",
		       i ? ", " : "", t->name, t->calls, t->bytes, t->kept_calls, t->kept_bytes);
	}
	printf("}}\n");
	fflush(stdout);
	return 0;
}
