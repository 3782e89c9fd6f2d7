/* native_thread_ctx: a native program (no Python) that publishes its trace context the way
 * OTEP 4947 specifies, from two threads, for tests/tests/spans/ (native_thread_context).
 *
 * The thread-local `otel_thread_ctx_v1` (exported: the program is linked with -rdynamic, so it
 * is in .dynsym) points at the thread's Thread-Local Context Record while the thread is in a
 * span, and is NULL outside. Each of the two threads runs spans 0, 1, 2 in turn, the work of
 * span K of thread T in the function `span_work_T_K`, then works outside any span in
 * `outside_work`, until the time is up. The ids say where they were published:
 *
 *   thread T (0 or 1): trace id = 16 bytes of (T + 1) * 0x11      e.g. 1111…11 for thread 0
 *   span K (0 to 2):   span id  = 8 bytes of (T + 1) * 0x10 + K + 1  e.g. 1212…12 for thread 0, span 1
 *
 * so a sample in `span_work_T_K` must carry exactly those. A record is updated as the OTEP
 * asks: the pointer is cleared (or `valid` is 0) while it is written, and set with a signal
 * fence after, so a reader that stops the thread anywhere sees a whole record or none.
 *
 * Usage: native_thread_ctx [SECONDS]; prints its pid first (common.h). */
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "common.h"

struct otel_thread_ctx_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_data_size;
	uint8_t attrs_data[612];
} __attribute__((packed, aligned(8)));

_Static_assert(offsetof(struct otel_thread_ctx_record, valid) == 24, "valid at 24");
_Static_assert(offsetof(struct otel_thread_ctx_record, attrs_data) == 28, "attrs at 28");

__attribute__((visibility("default"))) __thread struct otel_thread_ctx_record *otel_thread_ctx_v1;

#define THREADS 2
#define SPANS 3

static struct otel_thread_ctx_record records[THREADS];
static double deadline;
static volatile uint64_t sink;

/* Units of CPU work per span and outside (a unit is tens of µs). */
#define SPAN_UNITS 400u
#define OUTSIDE_UNITS 150u

#define SPAN_WORK(T, K)                                                    \
	__attribute__((noinline)) void span_work_##T##_##K(void)            \
	{                                                                  \
		uint64_t acc = sink;                                       \
		KEEP_FRAME_POINTER();                                      \
		SPIN(SPAN_UNITS, acc);                                     \
		sink = acc;                                                \
	}
SPAN_WORK(0, 0)
SPAN_WORK(0, 1)
SPAN_WORK(0, 2)
SPAN_WORK(1, 0)
SPAN_WORK(1, 1)
SPAN_WORK(1, 2)

static void (*const span_work[THREADS][SPANS])(void) = {
	{ span_work_0_0, span_work_0_1, span_work_0_2 },
	{ span_work_1_0, span_work_1_1, span_work_1_2 },
};

__attribute__((noinline)) void outside_work(void)
{
	uint64_t acc = sink;
	KEEP_FRAME_POINTER();
	SPIN(OUTSIDE_UNITS, acc);
	sink = acc;
}

/* Publishes span `k` of thread `t`: cleared, written, then pointed at. */
static void enter_span(int t, int k)
{
	struct otel_thread_ctx_record *r = &records[t];

	otel_thread_ctx_v1 = NULL;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	r->valid = 0;
	memset(r->trace_id, (t + 1) * 0x11, sizeof(r->trace_id));
	memset(r->span_id, (t + 1) * 0x10 + k + 1, sizeof(r->span_id));
	r->trace_flags = 1;
	r->attrs_data_size = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	r->valid = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	otel_thread_ctx_v1 = r;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static void leave_span(void)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	otel_thread_ctx_v1 = NULL;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static void *thread_main(void *arg)
{
	int t = (int)(intptr_t)arg;

	while (now_seconds() < deadline) {
		for (int k = 0; k < SPANS; k++) {
			enter_span(t, k);
			span_work[t][k]();
			leave_span();
		}
		outside_work();
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t threads[THREADS];
	double seconds = workload_seconds(argc, argv);

	announce_pid();
	deadline = now_seconds() + seconds;
	for (int t = 0; t < THREADS; t++) {
		if (pthread_create(&threads[t], NULL, thread_main, (void *)(intptr_t)t) != 0) {
			perror("pthread_create");
			return 1;
		}
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(threads[t], NULL);
	return 0;
}
