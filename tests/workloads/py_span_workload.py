# Span-correlation workloads: CPU-bound work inside OpenTelemetry spans or
# OSProfiler trace points, with ground truth of which span each piece of work
# ran in.
#
# Usage: python3 py_span_workload.py MODE SECONDS TRUTH_FILE [GO_FILE]
#
# MODE is one of
#   otel_threads   two threads, each running OpenTelemetry spans one after the
#                  other (every third one with a child span inside), with work
#                  outside any span between them;
#   otel_asyncio   one thread, an asyncio loop with four tasks running spans in
#                  CPU-bound chunks separated by `await asyncio.sleep(0)`, so
#                  the tasks (and their contexts) interleave on the thread;
#   osprofiler     two threads, each running "requests": osprofiler.profiler.init
#                  with a fresh base_id (and, every other request, a parent_id),
#                  three nested trace points (profiler.start/stop), work in each
#                  level, then profiler.clean() and work outside any request;
#   otel_late      starts without OpenTelemetry imported and runs outside_work
#                  until GO_FILE exists, then imports it and runs otel_threads.
#   osprofiler_fresh_threads
#                  osprofiler's requests in pairs of new threads started together,
#                  one request each: OSProfiler's threading.local is made anew in
#                  every thread;
#   osprofiler_otlp
#                  osprofiler with OSProfiler's own OTLP driver as its notifier,
#                  exporting every trace point as an OpenTelemetry span to the
#                  OTLP/HTTP endpoint ENDPOINT (`http://HOST:PORT`, given in the
#                  place of GO_FILE); the spans are flushed before the end.
#   osprofiler_eventlet, osprofiler_gevent
#                  osprofiler's requests in three green threads of one OS thread
#                  (eventlet or gevent, monkey-patched before anything else is
#                  imported, so OSProfiler's threading.local is the green-thread
#                  local), each its own request, switching (sleep(0)) after every
#                  chunk of work;
#   otel_eventlet, otel_gevent
#                  the same with OpenTelemetry spans (each greenlet has its own
#                  contextvars context);
#   published_otel_threads, published_osprofiler
#                  the same with spanprof's opt-in publisher installed first
#                  (`spanprof_context.install()`, python/spanprof-context): the
#                  context is also published as an OTEP 4947 thread context.
#
# Each span (or trace point) runs its work in a function of its own, made from
# one template with `code.replace(co_name=..., co_qualname=...)` and named
# `span_work_N` (N unique in the process), so the Python stack of a sample says
# which span was active. Work outside any span runs in `outside_work`. Every
# function made is kept alive, so no code object is freed and its address
# reused.
#
# TRUTH_FILE gets one JSON line per span, written when the span starts:
#   {"function": "span_work_N", "kind": "otel", "trace_id": "<32 hex>",
#    "span_id": "<16 hex>", "name": "<span name>", "tid": NATIVE_THREAD_ID}
#   {"function": "span_work_N", "kind": "osprofiler", "base_id": "<uuid>",
#    "trace_id": "<uuid>", "parent_id": "<uuid>", "name": "<trace point name>",
#    "tid": NATIVE_THREAD_ID}
# Every span and trace point has a name of its own (span_name, trace_point_name):
# mostly short ASCII ones, some longer than spanprof keeps (64 bytes) and some
# not ASCII (which spanprof does not read).
# (otel_late adds "since_import": seconds from the import to the span's start)
# and a last line {"done": true, ...} with the counts. `ready PID` goes to
# stderr once the work runs (otel_late: once outside_work runs, before
# GO_FILE), and the counts as one JSON line to stdout at the end.
#
# Runs for SECONDS (otel_late: SECONDS after GO_FILE appeared; it gives up
# with status 1 when GO_FILE does not appear within 120 s).
import sys

# Green modes: monkey-patch before anything else is imported (OSProfiler's
# threading.local() must be the green one). The native thread id is taken first:
# the truth's "tid" is the OS thread's.
import _thread

native_id = _thread.get_native_id
GREEN = sys.argv[1].rsplit("_", 1)[-1] if len(sys.argv) > 1 else ""
if GREEN == "eventlet":
    import warnings

    # Its deprecation notice goes to stderr, where "already using" reads as "ready".
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import eventlet
    eventlet.monkey_patch()
elif GREEN == "gevent":
    from gevent import monkey

    monkey.patch_all()
else:
    GREEN = ""

import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time
import types
import uuid

# Per span (or trace point): CPU seconds of work; outside any span, between them.
SPAN_CPU = 0.06
OUTSIDE_CPU = 0.02
# asyncio: one chunk of work between two `await asyncio.sleep(0)`.
CHUNK_CPU = 0.004
# Every LONG_EVERY-th span (trace point) gets a name longer than spanprof keeps,
# every NON_ASCII_EVERY-th (of the others) a name that is not ASCII.
LONG_EVERY = 5
NON_ASCII_EVERY = 7


def span_name(kind, *ids):
    """A name unique to one span: `kind` and the ids that make it unique."""
    n = ids[-1]
    tail = "-".join(str(i) for i in ids)
    if n % LONG_EVERY == LONG_EVERY - 1:
        return "%s /v2.1/servers/%s/os-volume_attachments/detail?limit=1000&all_tenants=1" % (
            kind,
            tail,
        )
    if n % NON_ASCII_EVERY == NON_ASCII_EVERY - 1:
        return "%s /caf\u00e9/%s" % (kind, tail)
    return "%s /servers/%s" % (kind, tail)


def _work_template(budget):
    end = time.thread_time() + budget
    x = 1
    while time.thread_time() < end:
        for _ in range(300):
            x = (x * 1103515245 + 12345) % 2147483648
    return x


def outside_work(budget):
    end = time.thread_time() + budget
    x = 2
    while time.thread_time() < end:
        for _ in range(300):
            x = (x * 69069 + 1) % 4294967296
    return x


class Truth:
    """The ground-truth file and the unique names of the work functions."""

    def __init__(self, path):
        self.file = open(path, "w")
        self.lock = threading.Lock()
        self.next = 0
        self.functions = []
        self.spans = 0

    def new_function(self):
        """A new work function `span_work_N`, and its name."""
        with self.lock:
            name = "span_work_%d" % self.next
            self.next += 1
        code = _work_template.__code__
        if sys.version_info >= (3, 11):
            code = code.replace(co_name=name, co_qualname=name)
        else:
            code = code.replace(co_name=name)
        function = types.FunctionType(code, globals(), name)
        with self.lock:
            self.functions.append(function)
        return function, name

    def write(self, record):
        line = json.dumps(record, sort_keys=True)
        with self.lock:
            self.spans += 1
            self.file.write(line + "\n")
            self.file.flush()

    def finish(self, extra):
        record = dict(extra, done=True, spans=self.spans)
        with self.lock:
            self.file.write(json.dumps(record, sort_keys=True) + "\n")
            self.file.close()
        print(json.dumps(record, sort_keys=True), flush=True)


def ready():
    print("ready", os.getpid(), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# OpenTelemetry
# ---------------------------------------------------------------------------


def otel_tracer():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    # No span processor: the spans are recorded (sampled) but exported nowhere.
    trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_ON))
    return trace.get_tracer("spanprof-tests")


# otel_late: time.monotonic() when OpenTelemetry was imported and set up.
IMPORTED_AT = None


def otel_record(truth, name, span):
    ctx = span.get_span_context()
    record = {
        "function": name,
        "kind": "otel",
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "name": span.name,
        "tid": native_id(),
    }
    if IMPORTED_AT is not None:
        record["since_import"] = round(time.monotonic() - IMPORTED_AT, 4)
    truth.write(record)


def otel_thread(truth, tracer, end, started, counts, index):
    first = True
    n = 0
    while time.monotonic() < end:
        with tracer.start_as_current_span(span_name("GET", index, n)) as span:
            work, name = truth.new_function()
            otel_record(truth, name, span)
            if first:
                started.release()
                first = False
            work(SPAN_CPU / 2)
            if n % 3 == 0:
                with tracer.start_as_current_span(span_name("SELECT", index, n)) as child:
                    child_work, child_name = truth.new_function()
                    otel_record(truth, child_name, child)
                    child_work(SPAN_CPU)
            work(SPAN_CPU / 2)
        n += 1
        outside_work(OUTSIDE_CPU)
    counts[index] = n


def run_otel_threads(truth, seconds, tracer):
    end = time.monotonic() + seconds
    started = threading.Semaphore(0)
    counts = {}
    threads = [
        threading.Thread(
            name="otel-%d" % i,
            target=otel_thread,
            args=(truth, tracer, end, started, counts, i),
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    return threads, counts


def mode_otel_threads(truth, seconds):
    tracer = otel_tracer()
    threads, counts = run_otel_threads(truth, seconds, tracer)
    ready()
    for t in threads:
        t.join()
    truth.finish({"mode": "otel_threads", "requests": sum(counts.values())})


def mode_otel_late(truth, seconds, go_file):
    if any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules):
        sys.exit("opentelemetry is imported already")
    ready()
    give_up = time.monotonic() + 120
    while not os.path.exists(go_file):
        if time.monotonic() > give_up:
            sys.exit("no go file %s within 120 s" % go_file)
        outside_work(0.01)
    global IMPORTED_AT
    tracer = otel_tracer()
    IMPORTED_AT = time.monotonic()
    threads, counts = run_otel_threads(truth, seconds, tracer)
    for t in threads:
        t.join()
    truth.finish({"mode": "otel_late", "requests": sum(counts.values())})


def mode_otel_asyncio(truth, seconds):
    import asyncio

    tracer = otel_tracer()
    end = time.monotonic() + seconds
    counts = {}

    async def chunks(work, budget):
        left = budget
        while left > 0:
            work(min(CHUNK_CPU, left))
            left -= CHUNK_CPU
            await asyncio.sleep(0)

    async def task_body(index):
        n = 0
        while time.monotonic() < end:
            with tracer.start_as_current_span(span_name("POST", index, n)) as span:
                work, name = truth.new_function()
                otel_record(truth, name, span)
                await chunks(work, SPAN_CPU)
            n += 1
            await chunks(outside_work, OUTSIDE_CPU)
        counts[index] = n

    async def main():
        tasks = [asyncio.ensure_future(task_body(i)) for i in range(4)]
        await asyncio.sleep(0)
        ready()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    truth.finish({"mode": "otel_asyncio", "requests": sum(counts.values())})


# ---------------------------------------------------------------------------
# OSProfiler
# ---------------------------------------------------------------------------

HMAC_KEY = "spanprof-secret"
LEVELS = 3


def osprofiler_request(truth, index, n):
    """One request: init, three nested trace points with work in each, clean."""
    from osprofiler import profiler

    base_id = str(uuid.uuid4())
    parent_id = str(uuid.uuid4()) if n % 2 else None
    profiler.init(HMAC_KEY, base_id=base_id, parent_id=parent_id)
    for level in range(LEVELS):
        point = span_name("wsgi-%d" % level, index, n)
        profiler.start(point, info={"number": n})
        p = profiler.get()
        work, name = truth.new_function()
        truth.write(
            {
                "function": name,
                "kind": "osprofiler",
                "base_id": p.get_base_id(),
                "trace_id": p.get_id(),
                "parent_id": p.get_parent_id(),
                "name": point,
                "level": level,
                "tid": native_id(),
            }
        )
        work(SPAN_CPU / 2)
    for _ in range(LEVELS):
        profiler.stop()
    profiler.clean()


def osprofiler_thread(truth, end, started, counts, index):
    n = 0
    while time.monotonic() < end:
        osprofiler_request(truth, index, n)
        if n == 0:
            started.release()
        n += 1
        outside_work(OUTSIDE_CPU)
    counts[index] = n


def osprofiler_fresh_threads(truth, end):
    """Requests in pairs of new threads started together, one request each (each thread's
    OSProfiler local made anew), work outside any request between the pairs; the number of
    pairs."""
    n = 0
    while time.monotonic() < end:
        failed = []

        def one(index, n=n):
            try:
                osprofiler_request(truth, index, n)
            except BaseException as e:
                failed.append(e)
                raise

        threads = [
            threading.Thread(name="osp-%d-%d" % (i, n), target=one, args=(i,))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            sys.exit("an OSProfiler request failed (its traceback is above)")
        if n == 0:
            ready()
        n += 1
        outside_work(OUTSIDE_CPU)
    return n


def mode_osprofiler(truth, seconds, fresh=False):
    from osprofiler import profiler  # noqa: F401  (imported before the threads start)

    end = time.monotonic() + seconds
    if fresh:
        pairs = osprofiler_fresh_threads(truth, end)
        truth.finish({"mode": "osprofiler_fresh_threads", "requests": 2 * pairs})
        return
    started = threading.Semaphore(0)
    counts = {}
    threads = [
        threading.Thread(
            name="osp-%d" % i,
            target=osprofiler_thread,
            args=(truth, end, started, counts, i),
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    ready()
    for t in threads:
        t.join()
    if len(counts) != len(threads):
        sys.exit("an OSProfiler thread failed (its traceback is above)")
    truth.finish({"mode": "osprofiler", "requests": sum(counts.values())})


def mode_osprofiler_otlp(truth, seconds, endpoint):
    from oslo_config import cfg
    from osprofiler import notifier, opts  # noqa: F401  (opts registers the driver's options)
    from opentelemetry import trace

    address = endpoint.split("://", 1)[-1]
    notifier.set(
        notifier.create(
            "otlp://" + address, project="spanprof", service="workload", conf=cfg.CONF
        )
    )
    mode_osprofiler(truth, seconds)
    if not trace.get_tracer_provider().force_flush(10000):
        sys.exit("the OTLP driver's spans were not exported within 10 s")


# ---------------------------------------------------------------------------
# Green threads (eventlet, gevent)
# ---------------------------------------------------------------------------

GREENLETS = 3


def green_switch():
    """Lets the other green threads run (eventlet.sleep(0) or gevent.sleep(0))."""
    if GREEN == "eventlet":
        eventlet.sleep(0)
    else:
        import gevent

        gevent.sleep(0)


def green_run(body):
    """Runs body(index, started) in GREENLETS green threads; `ready` once each started."""
    started = []
    if GREEN == "eventlet":
        threads = [eventlet.spawn(body, i, started) for i in range(GREENLETS)]
    else:
        import gevent

        threads = [gevent.spawn(body, i, started) for i in range(GREENLETS)]
    while len(started) < GREENLETS:
        green_switch()
    ready()
    for t in threads:
        if GREEN == "eventlet":
            t.wait()
        else:
            t.get()


def green_chunks(work, budget):
    """`work` for `budget` CPU seconds, in chunks with a switch after each."""
    left = budget
    while left > 0:
        work(min(CHUNK_CPU, left))
        left -= CHUNK_CPU
        green_switch()


def mode_osprofiler_green(truth, seconds):
    from osprofiler import profiler

    local = type(profiler.__dict__["__local_ctx"])
    if local.__module__.split(".")[0] != GREEN:
        sys.exit("OSProfiler's local is %s.%s, not %s's" % (local.__module__, local.__name__, GREEN))
    end = time.monotonic() + seconds
    counts = {}

    def body(index, started):
        n = 0
        while time.monotonic() < end:
            base_id = str(uuid.uuid4())
            parent_id = str(uuid.uuid4()) if n % 2 else None
            profiler.init(HMAC_KEY, base_id=base_id, parent_id=parent_id)
            for level in range(LEVELS):
                point = span_name("green-%d" % level, index, n)
                profiler.start(point, info={"number": n})
                p = profiler.get()
                work, name = truth.new_function()
                truth.write(
                    {
                        "function": name,
                        "kind": "osprofiler",
                        "base_id": p.get_base_id(),
                        "trace_id": p.get_id(),
                        "parent_id": p.get_parent_id(),
                        "name": point,
                        "level": level,
                        "tid": native_id(),
                    }
                )
                if n == 0 and level == 0:
                    started.append(index)
                green_chunks(work, SPAN_CPU / 2)
            for _ in range(LEVELS):
                profiler.stop()
            profiler.clean()
            n += 1
            green_chunks(outside_work, OUTSIDE_CPU)
        counts[index] = n

    green_run(body)
    truth.finish({"mode": "osprofiler_" + GREEN, "requests": sum(counts.values())})


def mode_otel_green(truth, seconds):
    tracer = otel_tracer()
    end = time.monotonic() + seconds
    counts = {}

    def body(index, started):
        n = 0
        while time.monotonic() < end:
            with tracer.start_as_current_span(span_name("GREEN", index, n)) as span:
                work, name = truth.new_function()
                otel_record(truth, name, span)
                if n == 0:
                    started.append(index)
                green_chunks(work, SPAN_CPU)
            n += 1
            green_chunks(outside_work, OUTSIDE_CPU)
        counts[index] = n

    green_run(body)
    truth.finish({"mode": "otel_" + GREEN, "requests": sum(counts.values())})


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: py_span_workload.py MODE SECONDS TRUTH_FILE [GO_FILE]")
    mode, seconds, truth_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    truth = Truth(truth_path)
    if mode.startswith("published_"):
        import spanprof_context

        mode = mode[len("published_"):]
        spanprof_context.install(
            otel=mode.startswith("otel"), osprofiler=mode == "osprofiler"
        )
    if mode == "otel_threads":
        mode_otel_threads(truth, seconds)
    elif mode == "otel_asyncio":
        mode_otel_asyncio(truth, seconds)
    elif mode == "osprofiler":
        mode_osprofiler(truth, seconds)
    elif mode == "osprofiler_fresh_threads":
        mode_osprofiler(truth, seconds, fresh=True)
    elif mode == "osprofiler_otlp":
        if len(sys.argv) < 5:
            sys.exit("osprofiler_otlp needs an ENDPOINT")
        mode_osprofiler_otlp(truth, seconds, sys.argv[4])
    elif mode in ("osprofiler_eventlet", "osprofiler_gevent"):
        mode_osprofiler_green(truth, seconds)
    elif mode in ("otel_eventlet", "otel_gevent"):
        mode_otel_green(truth, seconds)
    elif mode == "otel_late":
        if len(sys.argv) < 5:
            sys.exit("otel_late needs a GO_FILE")
        mode_otel_late(truth, seconds, sys.argv[4])
    else:
        sys.exit("unknown mode %r" % mode)


main()
