"""Three threads wait on an Event that is set SECONDS (argv[1], default 2.0) after the workload
says it is ready: a profiler attached in between finds them blocked since before it started.
Prints "ready" and the waiters' thread ids on stderr, then JSON with each waiter's measured
wait and the Unix time the Event was set ("set_at", seconds) on stdout."""
import json
import sys
import threading
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
event = threading.Event()
waits = {}
started = threading.Barrier(4)


def waiter():
    started.wait()
    begin = time.monotonic()
    event.wait()
    waits[threading.get_native_id()] = time.monotonic() - begin


threads = [threading.Thread(target=waiter) for _ in range(3)]
for t in threads:
    t.start()
started.wait()
time.sleep(0.05)
print("ready", " ".join(str(t.native_id) for t in threads), file=sys.stderr, flush=True)
time.sleep(SECONDS)
set_at = time.time()
event.set()
for t in threads:
    t.join()
# Alive a while longer, as a service would be: what a profiler reads of a process (its
# modules, its code objects) goes when it exits.
time.sleep(1.0)
print(json.dumps({"waits": {str(k): v for k, v in waits.items()}, "set_at": set_at}), flush=True)
