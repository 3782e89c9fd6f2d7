# bench_py_span: the Python work of bench_py_stack.py (a fixed amount of pure-Python CPU work at a
# Python stack depth of exactly 50 frames) run inside an OpenTelemetry span and an OSProfiler
# trace on the same thread, for `cargo xtask bench --only spans`: every sample of the work has
# both span contexts for spanprof's BPF program to read.
#
#   <module> -> f0 -> f1 -> ... -> f48       (1 + 49 = 50 frames, 49 distinct functions, those
#                                            of bench_py_stack.py, imported from it)
#
# f48, the innermost, runs UNITS x 100000 iterations of an integer LCG in pure Python (a fixed
# number of iterations, not a fixed time). The work starts at module level, in the span's `with`
# block (which adds no frame), so there is no main() frame.
#
# Span context, set up before the gate so that every sample of the work is inside it:
# - five ContextVars of the application's own (`bench_var_0` .. `bench_var_4`, set at module
#   level) besides OpenTelemetry's `current_context`: the thread's contextvars HAMT holds 6
#   entries, as in an application that uses a few context variables (request id, logging
#   context, ...), not just OpenTelemetry's;
# - an OpenTelemetry Context with more than the span in it: baggage (two entries, under
#   OpenTelemetry's one baggage key) and two context keys of the application's own
#   (`context.create_key` + `set_value`), attached, then the span of an SDK TracerProvider
#   (default sampler, so sampled; no span processor, so nothing is exported) made current by
#   `start_as_current_span`: the Context dict spanprof probes for the span key has 4 entries;
# - an OSProfiler trace: `profiler.init` (base id and parent id) and `profiler.start`, so the
#   thread-local _Profiler's trace stack holds three UUIDs (base, parent, the trace point).
#
# The tracing libraries come from target/span-libs/3.X (`cargo xtask deps`) through PYTHONPATH.
# BENCH_SPAN_KINDS=otel or osprofiler (`cargo xtask bench --span-kinds`) sets up that one alone,
# without importing the other library, to see what each costs; the default is both.
# BENCH_SPAN_KINDS=published sets up both, as the default does, after
# `spanprof_context.install()` (the opt-in publisher, python/spanprof-context, installed into
# target/span-libs/3.X by `cargo xtask deps`): the thread's OTEP 4947 thread context record
# holds both contexts, and that record is what spanprof reads instead of the libraries' objects.
#
# Like bench_py_stack.py it prints its pid on stdout, then waits for one byte (or EOF) on stdin
# before it starts the work, so the profiler can attach first.
#
# Usage: python3 bench_py_span.py [UNITS]   (default 1000)
import contextlib
import contextvars
import os
import sys
import uuid

KINDS = os.environ.get("BENCH_SPAN_KINDS", "both")
if KINDS not in ("both", "otel", "osprofiler", "published"):
    sys.exit(f"BENCH_SPAN_KINDS={KINDS!r}: both, otel, osprofiler or published")
OTEL = KINDS in ("both", "otel", "published")
OSPROFILER = KINDS in ("both", "osprofiler", "published")
PUBLISHED = KINDS == "published"
if OTEL:
    from opentelemetry import baggage, context, trace
    from opentelemetry.sdk.trace import TracerProvider
if OSPROFILER:
    from osprofiler import profiler

# f0 -> ... -> f48: the 49 functions of bench_py_stack.py's 50-frame work (the script's
# directory is on sys.path), so both targets run the same code.
from bench_py_stack import f0  # noqa: E402


units = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
if units <= 0:
    sys.exit(f"usage: {sys.argv[0]} [UNITS]  (UNITS > 0)")

# The application's own context variables, in the thread's context (module level).
EXTRA_VARS = [contextvars.ContextVar("bench_var_%d" % i) for i in range(5)]
for i, var in enumerate(EXTRA_VARS):
    var.set("value-%d" % i)

span_scope = contextlib.nullcontext()
if OTEL:
    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("spanprof-bench")

if PUBLISHED:
    # After the SDK setup (the process context carries its resource), before any span or trace
    # is entered: every attach and OSProfiler start from here on updates the thread's record.
    import spanprof_context

    hooked = spanprof_context.install()
    if not (hooked["otel"] and hooked["osprofiler"]):
        sys.exit(f"spanprof_context.install() hooked nothing: {hooked!r}")

if OTEL:
    # OpenTelemetry context entries besides the span: baggage and two keys of the application's
    # own.
    ctx = baggage.set_baggage("tenant", "bench-tenant")
    ctx = baggage.set_baggage("request.kind", "bench", context=ctx)
    ctx = context.set_value(context.create_key("bench.request_id"), str(uuid.uuid4()), ctx)
    ctx = context.set_value(context.create_key("bench.retry"), 0, ctx)
    context_token = context.attach(ctx)
    span_scope = tracer.start_as_current_span("bench-work")

if OSPROFILER:
    # An OSProfiler trace on this thread: base id, parent id and one trace point.
    profiler.init("spanprof-bench-key", base_id=str(uuid.uuid4()), parent_id=str(uuid.uuid4()))
    profiler.start("bench-work", info={"units": units})

with span_scope as span:
    if OTEL and not span.get_span_context().is_valid:
        sys.exit("the OpenTelemetry span is not valid")
    print(os.getpid(), flush=True)
    sys.stdin.buffer.read(1)
    f0(units)

if OSPROFILER:
    profiler.stop()
    profiler.clean()
if OTEL:
    context.detach(context_token)
