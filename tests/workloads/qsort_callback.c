/* qsort_callback: CPU time in a callback that libc calls, for the .eh_frame
 * unwinding tests.
 *
 *   main -> sort_rounds -> qsort (libc: qsort_r, msort_with_tmp, …)
 *                                 -> cmp_items (the comparison callback)
 *
 * Every round shuffles an array of 4096 items and sorts it with libc's qsort;
 * cmp_items does a deliberate bit of work per comparison, so most of the CPU
 * time is in cmp_items, below libc's frames. Debian's libc has no frame
 * pointers, and this program is built without them too (`_nofp` flags), so
 * only an unwinder that reads .eh_frame gets from cmp_items back up to main.
 *
 * Build: gcc -O2 -g -fomit-frame-pointer -momit-leaf-frame-pointer
 *        -DWORKLOAD_NO_FRAME_POINTER
 * Usage: qsort_callback [SECONDS]   (prints its pid first) */
#include <stdint.h>

#include "common.h"

#define ITEMS 4096u
/* Iterations of the dependent multiply-add chain per comparison: a few
 * hundred nanoseconds, against tens in libc's merge step. */
#define CMP_ITERATIONS 200u

struct item {
	uint64_t key;
	uint64_t payload;
};

static struct item items[ITEMS];
static volatile uint64_t sink;

__attribute__((noinline, noclone)) int cmp_items(const void *a, const void *b)
{
	const struct item *x = a;
	const struct item *y = b;
	uint64_t acc = x->payload ^ y->payload;
	/* NB: the empty asm with the accumulator as an in/out operand keeps -O2
	 * from folding the loop; every iteration really runs. */
	for (uint32_t i = 0; i < CMP_ITERATIONS; i++) {
		acc = acc * 6364136223846793005ull + 1442695040888963407ull;
		__asm__ volatile("" : "+r"(acc) : : "memory");
	}
	sink = acc;
	return (x->key > y->key) - (x->key < y->key);
}

/* Sorts shuffled copies of the array until `deadline`; returns the rounds. */
__attribute__((noinline, noclone)) uint64_t sort_rounds(double deadline)
{
	uint64_t rounds = 0;
	uint64_t state = 0x9e3779b97f4a7c15ull;
	while (now_seconds() < deadline) {
		for (uint32_t i = 0; i < ITEMS; i++) {
			state = state * 6364136223846793005ull + 1442695040888963407ull;
			items[i].key = state >> 33;
			items[i].payload = state;
		}
		qsort(items, ITEMS, sizeof(items[0]), cmp_items);
		rounds++;
	}
	return rounds;
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	uint64_t rounds = sort_rounds(now_seconds() + seconds);
	/* A use of the result after the call: sort_rounds is not a tail call. */
	sink = rounds;
	return 0;
}
