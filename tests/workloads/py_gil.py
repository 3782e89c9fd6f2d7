"""Three threads spin in Python for about a second each: on 2 CPUs with one GIL, each waits
for the GIL most of the time. The main thread waits in join(), inside start_and_join(); its start-up (imports, reading files)
is outside. Prints the threads' ids."""
import json
import sys
import threading
import time


def spinner(tids, seconds):
    tids.append(threading.get_native_id())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def start_and_join(seconds):
    tids = []
    threads = [threading.Thread(target=spinner, args=(tids, seconds)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tids


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
# Time for the profiler to find the interpreter: main blocks in join() once, for the whole run,
# and that wait has Python frames only if the interpreter was known when it began.
time.sleep(0.5)
tids = start_and_join(seconds)
print(json.dumps({"main": threading.get_native_id(), "spinners": tids}), flush=True)
