/* libspanprof_hidden.so: CPU time in functions no symbol of the stripped
 * library names (hidden visibility: absent from .dynsym), reached through a
 * pointer the library hands out, so that once stripped, no frame of the
 * library on a hot stack has a name spanprof could find on this host:
 *
 *   main -> hidden_dispatch -> hidden_alpha   3 units of work  (75% of CPU)
 *                           -> hidden_beta    1 unit of work   (25% of CPU)
 *
 * `cargo xtask workloads` keeps the unstripped copy apart, in
 * target/workloads/unstripped/, where a symbol server or PPROF_BINARY_PATH
 * can serve it by the library's build id.
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 *        -shared -fPIC -fvisibility=hidden */
#include <stdint.h>

#include "common.h"

static volatile uint64_t sink;

__attribute__((noinline, noclone)) void hidden_alpha(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(3u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void hidden_beta(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(1u, acc);
	sink = acc;
}

__attribute__((noinline, noclone)) void hidden_dispatch(void)
{
	hidden_alpha();
	hidden_beta();
	__asm__ volatile("" : : : "memory");
}

/* The one exported symbol; it is not on the hot stacks. */
__attribute__((visibility("default"))) void (*hidden_lib_entry(void))(void)
{
	return hidden_dispatch;
}
