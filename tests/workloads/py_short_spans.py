# OpenTelemetry spans of a known length: each `short` span computes for 3.5 ms of its thread's
# CPU time (measured with time.thread_time), one after another, until the spans have used
# CPU_SECONDS of CPU together (the work is bounded by CPU time, not by the clock).
#
# Usage: python3 py_short_spans.py CPU_SECONDS  (the OpenTelemetry SDK on PYTHONPATH)
# Prints one JSON line: the number of spans and their mean CPU time in nanoseconds.
import json
import sys
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("short-spans")
SPAN_CPU = 0.0035


def work():
    start = time.thread_time()
    x = 1
    while time.thread_time() - start < SPAN_CPU:
        for _ in range(50):
            x = (x * 1103515245 + 12345) % 2147483648
    return time.thread_time() - start


def main():
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    spent, spans = 0.0, 0
    while spent < budget:
        with tracer.start_as_current_span("short"):
            spent += work()
        spans += 1
    print(json.dumps({"spans": spans, "mean_ns": int(spent / spans * 1e9)}), flush=True)


main()
