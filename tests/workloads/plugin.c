/* plugin: the shared object that dlopen_late loads once it has run for a
 * while, built into target/workloads/libspanprof_plugin.so (-shared -fPIC,
 * no frame pointers).
 *
 *   plugin_run (exported) -> plugin_hot (static: only in .symtab)
 *
 * plugin_run calls plugin_hot for one unit of work and uses its result after
 * the call, so the call is not a tail call and plugin_run keeps its frame. */
#include <stdint.h>

#define UNIT_ITERATIONS 20000u

static volatile uint64_t sink;

__attribute__((noinline, noclone)) static uint64_t plugin_hot(uint64_t acc)
{
	/* NB: the empty asm with the accumulator as an in/out operand keeps -O2
	 * from folding the loop; every iteration really runs. */
	for (uint32_t i = 0; i < UNIT_ITERATIONS; i++) {
		acc = acc * 6364136223846793005ull + 1442695040888963407ull;
		__asm__ volatile("" : "+r"(acc) : : "memory");
	}
	return acc;
}

uint64_t plugin_run(uint64_t seed);

uint64_t plugin_run(uint64_t seed)
{
	uint64_t acc = plugin_hot(seed ^ sink);
	sink = acc;
	return acc + 1;
}
