/* hidden_main: runs libspanprof_hidden.so's hot loop (see hidden_lib.c)
 * through the pointer the library hands out.
 *
 * Usage: hidden_main [SECONDS]   (prints its pid first) */
#include "common.h"

void (*hidden_lib_entry(void))(void);

int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	void (*dispatch)(void) = hidden_lib_entry();
	announce_pid();
	double deadline = now_seconds() + seconds;
	while (now_seconds() < deadline) {
		for (int k = 0; k < 16; k++)
			dispatch();
	}
	return 0;
}
