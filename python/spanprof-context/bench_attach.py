"""What spanprof_context.install() adds to OpenTelemetry's context switches.

Times, without and with install() (OpenTelemetry hook only; alternating rounds, the median of
each), in ns per iteration:

- span:   `with tracer.start_as_current_span("s"): pass` (SDK TracerProvider, default sampler,
          no span processor): one span created and ended, one attach and one detach;
- attach: `context.detach(context.attach(ctx))` of a prepared Context holding a span: the
          context switch alone, where the hook's cost is all there is to see.

Usage: PYTHONPATH=target/span-libs/3.X python3.X python/spanprof-context/bench_attach.py
       [--rounds 15] [--n 20000]
"""

import argparse
import platform
import statistics
import sys
import time

from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider

import spanprof_context


def per_iteration(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()

    tracer = TracerProvider().get_tracer("bench")
    with tracer.start_as_current_span("held") as held:
        ctx = trace.set_span_in_context(held)

    def spans(n):
        start = tracer.start_as_current_span
        for _ in range(n):
            with start("s"):
                pass

    def attaches(n):
        attach, detach = context.attach, context.detach
        for _ in range(n):
            detach(attach(ctx))

    results = {(k, on): [] for k in ("span", "attach") for on in (False, True)}
    for fn in (spans, attaches):  # warm up
        fn(args.n // 10)
    for _ in range(args.rounds):
        for on in (False, True):
            if on:
                spanprof_context.install(otel=True, osprofiler=False, process_context=False)
            else:
                spanprof_context.uninstall()
            results[("span", on)].append(per_iteration(spans, args.n))
            results[("attach", on)].append(per_iteration(attaches, args.n))
    spanprof_context.uninstall()

    print(
        "CPython %s (%s), %d rounds x %d, median ns per iteration"
        % (platform.python_version(), sys.executable, args.rounds, args.n)
    )
    for kind, label in (("span", "start_as_current_span"), ("attach", "attach+detach")):
        off = statistics.median(results[(kind, False)])
        on = statistics.median(results[(kind, True)])
        print(
            "%-22s without %7.0f   with install() %7.0f   added %5.0f ns (%+.0f%%)"
            % (label, off, on, on - off, 100.0 * (on - off) / off)
        )


if __name__ == "__main__":
    main()
