/* plt_lib: the shared object of the plt_calls workloads, built into
 * target/workloads/libspanprof_plt.so (-shared -fPIC). Its one exported
 * function is so short that a good part of the time of a loop calling it
 * goes to the caller's PLT stub. */
#include <stdint.h>

uint64_t plt_tiny(uint64_t x);

uint64_t plt_tiny(uint64_t x)
{
	return x * 6364136223846793005ull + 1442695040888963407ull;
}
