"""spanprof verify's calibrated Python workload (embedded in the spanprof binary).

    python3 verify_workload.py split OUT SECONDS
    python3 verify_workload.py traced OUT SECONDS

split: two pure-Python functions share the CPU 2:1 (verify_alpha, verify_beta), in chunks
chosen so each stays at its share of the CPU time measured with time.thread_time(); OUT gets
{"alpha": S, "beta": S} (CPU seconds).

traced: requests, each an OpenTelemetry span (SDK, no exporter) holding an OSProfiler trace
point, spin in verify_traced for 0.1 s of CPU, then verify_untraced spins 0.05 s outside;
OUT gets {"spans": [{"trace_id", "span_id", "base_id", "point_id", "cpu"}...]}. The libraries
are imported and 0.5 s pass before the first request (spanprof finds their objects after the
import). Exits 3 when a library is missing.
"""

import json
import os
import random
import sys
import time


def verify_alpha(n):
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
    return x


def verify_beta(n):
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
    return x


def split(out, seconds):
    spent = {"alpha": 0.0, "beta": 0.0}
    share = {"alpha": 2 / 3, "beta": 1 / 3}
    funcs = {"alpha": verify_alpha, "beta": verify_beta}
    # Chunks of random length, so that the alternation has no period for the sampling period
    # to alias with (fixed chunks of 2000 gave 72.1% for a true 66.7% in a CI run).
    rng = random.Random(os.getpid())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total = spent["alpha"] + spent["beta"]
        name = min(spent, key=lambda k: spent[k] - share[k] * total)
        t0 = time.thread_time()
        funcs[name](rng.randint(500, 4000))
        spent[name] += time.thread_time() - t0
    with open(out, "w") as f:
        json.dump(spent, f)


def spin(seconds):
    t0 = time.thread_time()
    x = 1
    while time.thread_time() - t0 < seconds:
        for _ in range(500):
            x = (x * 1103515245 + 12345) % 2147483648
    return time.thread_time() - t0


def verify_traced(seconds):
    return spin(seconds)


def verify_untraced(seconds):
    return spin(seconds)


def traced(out, seconds):
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from osprofiler import profiler
    except ImportError as e:
        sys.stderr.write("verify_workload: %s\n" % e)
        sys.exit(3)
    import uuid

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("spanprof-verify")
    time.sleep(0.5)
    spans = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with tracer.start_as_current_span("verify request") as span:
            profiler.init("spanprof-verify", base_id=str(uuid.uuid4()))
            profiler.start("verify-point")
            p = profiler.get()
            ctx = span.get_span_context()
            cpu = verify_traced(0.1)
            spans.append(
                {
                    "trace_id": format(ctx.trace_id, "032x"),
                    "span_id": format(ctx.span_id, "016x"),
                    "base_id": p.get_base_id(),
                    "point_id": p.get_id(),
                    "cpu": cpu,
                }
            )
            profiler.stop()
            profiler.clean()
        verify_untraced(0.05)
    with open(out, "w") as f:
        json.dump({"spans": spans}, f)


def main():
    mode, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if mode == "split":
        split(out, seconds)
    elif mode == "traced":
        traced(out, seconds)
    else:
        sys.exit("unknown mode %r" % mode)


if __name__ == "__main__":
    main()
