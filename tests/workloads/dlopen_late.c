/* dlopen_late: CPU time in a shared object that was loaded after the process
 * (and the profiler) started, for the .eh_frame unwinding tests.
 *
 *   main -> warm_up                                     (the first ~0.5 s)
 *   main -> run_plugin -> plugin_run -> plugin_hot      (the rest)
 *
 * After the warm-up, main dlopen()s libspanprof_plugin.so (plugin.c) from the
 * directory of its own executable (/proc/self/exe) and run_plugin calls its
 * exported plugin_run, which calls its static plugin_hot, until the time is
 * up. Both are built without frame pointers, so a profiler must find the
 * plugin's .eh_frame after the mapping appeared to unwind plugin_hot.
 *
 * Build: gcc -O2 -g -fomit-frame-pointer -momit-leaf-frame-pointer
 *        -DWORKLOAD_NO_FRAME_POINTER ... -ldl
 * Usage: dlopen_late [SECONDS]   (prints its pid first; at least the warm-up) */
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define WARM_UP_SECONDS 0.5
#define PLUGIN_NAME "libspanprof_plugin.so"

typedef uint64_t (*plugin_run_fn)(uint64_t);

static volatile uint64_t sink;

/* Spins in the main program until `deadline`. */
__attribute__((noinline, noclone)) void warm_up(double deadline)
{
	uint64_t acc = sink;
	while (now_seconds() < deadline) {
		for (uint32_t i = 0; i < 20000u; i++) {
			acc = acc * 6364136223846793005ull + 1442695040888963407ull;
			__asm__ volatile("" : "+r"(acc) : : "memory");
		}
	}
	sink = acc;
}

/* Calls the plugin until `deadline`; returns the number of calls. */
__attribute__((noinline, noclone)) uint64_t run_plugin(plugin_run_fn run, double deadline)
{
	uint64_t calls = 0;
	uint64_t acc = sink;
	while (now_seconds() < deadline) {
		for (int k = 0; k < 16; k++) {
			acc = run(acc);
			calls++;
		}
	}
	sink = acc;
	return calls;
}

/* Opens PLUGIN_NAME from the directory of this executable; exits on failure. */
static void *open_plugin(void)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	if (n <= 0) {
		perror("dlopen_late: readlink /proc/self/exe");
		exit(1);
	}
	path[n] = '\0';
	char *slash = strrchr(path, '/');
	size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
	if (dir_len + sizeof(PLUGIN_NAME) > sizeof(path)) {
		fprintf(stderr, "dlopen_late: path too long: %s\n", path);
		exit(1);
	}
	memcpy(path + dir_len, PLUGIN_NAME, sizeof(PLUGIN_NAME));
	void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		fprintf(stderr, "dlopen_late: %s\n", dlerror());
		exit(1);
	}
	return handle;
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	announce_pid();
	double start = now_seconds();
	warm_up(start + WARM_UP_SECONDS);
	void *handle = open_plugin();
	plugin_run_fn run = (plugin_run_fn)dlsym(handle, "plugin_run");
	if (!run) {
		fprintf(stderr, "dlopen_late: no plugin_run: %s\n", dlerror());
		return 1;
	}
	uint64_t calls = run_plugin(run, start + seconds);
	/* A use of the result after the call: run_plugin is not a tail call. */
	sink = calls;
	return dlclose(handle);
}
