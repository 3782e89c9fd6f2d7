"""Threads in known places, for `spanprof dump`: each stays there until the process is killed.

- sleeper: in `sleeper_wait`, in time.sleep, inside the OpenTelemetry span "sleep-span";
- locker: in `lock_wait`, waiting for a lock nobody releases, inside the OSProfiler trace point
  "lock-point";
- gil: in `gil_wanter`, waiting for the GIL as its time.sleep(1.0) returns, which
- spinner: holds, in `spin`, inside the OpenTelemetry span "spin-span": a C call (sum over
  itertools.repeat) that never checks for a GIL drop request.

The switch interval is 1000 s: a thread waiting for the GIL asks for it once every 1000 s, and
does not wake every 5 ms (as it would by default), so it stays blocked in the kernel.

Usage: python3 py_dump.py TRUTH_FILE. Writes the truth as one JSON object to TRUTH_FILE
({"sleeper": {"tid", "trace_id", "span_id", "name"}, "locker": {"tid", "base_id", "trace_id",
"name"}, "gil": {"tid"}, "spinner": {"tid", "trace_id", "span_id", "name"}, "main": TID}),
then prints `ready PID` to stderr and releases the spinner. The GIL is taken for good within
milliseconds, and the GIL thread waits for it from 1 s on: the process then answers nothing
but SIGKILL.
"""
import itertools
import json
import os
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from osprofiler import profiler

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("py_dump")
truth = {"main": threading.get_native_id()}
ready = threading.Semaphore(0)
go = threading.Event()
never = threading.Lock()
never.acquire()


def sleeper_wait():
    time.sleep(3600)


def sleeper():
    with tracer.start_as_current_span("sleep-span") as span:
        ctx = span.get_span_context()
        truth["sleeper"] = {
            "tid": threading.get_native_id(),
            "trace_id": format(ctx.trace_id, "032x"),
            "span_id": format(ctx.span_id, "016x"),
            "name": "sleep-span",
        }
        ready.release()
        sleeper_wait()


def lock_wait():
    never.acquire()


def locker():
    profiler.init("dump-key")
    profiler.start("lock-point")
    p = profiler.get()
    truth["locker"] = {
        "tid": threading.get_native_id(),
        "base_id": p.get_base_id(),
        "trace_id": p.get_id(),
        "name": "lock-point",
    }
    ready.release()
    lock_wait()


def gil_wanter():
    # Returns from the sleep while the spinner holds the GIL (it takes it within ms of `go`,
    # which comes right after this thread is ready).
    time.sleep(1.0)
    n = 0
    while True:
        n += 1


def gil():
    truth["gil"] = {"tid": threading.get_native_id()}
    ready.release()
    gil_wanter()


def spin():
    return sum(itertools.repeat(1, 10**15))


def spinner():
    with tracer.start_as_current_span("spin-span") as span:
        ctx = span.get_span_context()
        truth["spinner"] = {
            "tid": threading.get_native_id(),
            "trace_id": format(ctx.trace_id, "032x"),
            "span_id": format(ctx.span_id, "016x"),
            "name": "spin-span",
        }
        ready.release()
        go.wait()
        spin()


for target in (sleeper, locker, spinner, gil):
    threading.Thread(target=target, name=target.__name__, daemon=True).start()
    ready.acquire()
with open(sys.argv[1], "w") as f:
    json.dump(truth, f)
print(f"ready {os.getpid()}", file=sys.stderr, flush=True)
sys.setswitchinterval(1000)
go.set()
time.sleep(3600)
