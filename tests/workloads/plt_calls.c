/* plt_calls: a hot loop calling plt_tiny of libspanprof_plt.so (plt_lib.c)
 * through the program's PLT, so that samples often land in the stub
 * `plt_tiny@plt`, between `.init` (whose `_init` is the nearest symbol before
 * it) and `.text`.
 *
 *   main -> call_loop -> plt_tiny@plt -> plt_tiny
 *
 * Built twice: `plt_calls` with the default lazy-binding `.plt`, and
 * `plt_calls_ibt` with `-z ibtplt -z now`, where the call goes through the
 * `.plt.sec` stub instead. */
#include "common.h"

uint64_t plt_tiny(uint64_t x);

static volatile uint64_t sink;

__attribute__((noinline, noclone)) static uint64_t call_loop(uint64_t acc)
{
	KEEP_FRAME_POINTER();
	for (uint32_t i = 0; i < 100000u; i++)
		acc = plt_tiny(acc);
	return acc;
}

int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	double end = now_seconds() + seconds;
	uint64_t acc = 1;
	while (now_seconds() < end)
		acc = call_loop(acc);
	sink = acc;
	return 0;
}
