# Four threads, each spinning in its own pure-Python function: thread
# "spin-a" runs spin_a, "spin-b" spin_b, and so on. Each thread also gives its
# OS thread the same name (prctl PR_SET_NAME), which Python's
# threading.Thread(name=...) does not do before 3.14, so a profiler that reads
# thread names from the kernel sees them.
#
# Usage: python3 py_threads.py SECONDS [DELAY]
#
# With OS_THREAD_NAME set in the environment, every thread gives its OS thread
# that name instead, so only the Python names (threading.Thread.name) tell the
# threads apart.
#
# Prints `ready PID` on stderr once all four threads are spinning, and when
# they are done one JSON line on stdout mapping each thread name to its native
# thread id. With DELAY, it prints `ready PID` at once and starts the threads
# DELAY seconds later (for profilers that attach before the threads exist).
import ctypes
import json
import os
import sys
import threading
import time

PR_SET_NAME = 15


def name_os_thread(name):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    except OSError:
        pass


def spin_a(end):
    x = 1
    while time.monotonic() < end:
        for _ in range(500):
            x = (x * 1103515245 + 12345) % 2147483648
    return x


def spin_b(end):
    x = 2
    while time.monotonic() < end:
        for _ in range(500):
            x = (x * 69069 + 1) % 4294967296
    return x


def spin_c(end):
    x = 3
    while time.monotonic() < end:
        for _ in range(500):
            x = (x * 48271 + 11) % 2147483647
    return x


def spin_d(end):
    x = 4
    while time.monotonic() < end:
        for _ in range(500):
            x = (x * 16807 + 5) % 2147483647
    return x


def thread_body(name, function, end, started, tids):
    name_os_thread(os.environ.get("OS_THREAD_NAME") or name)
    tids[name] = threading.get_native_id() if hasattr(threading, "get_native_id") else None
    started.release()
    function(end)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else None
    if delay is not None:
        print("ready", os.getpid(), file=sys.stderr, flush=True)
        time.sleep(delay)
    end = time.monotonic() + seconds
    started = threading.Semaphore(0)
    tids = {}
    threads = [
        threading.Thread(
            name=name, target=thread_body, args=(name, function, end, started, tids)
        )
        for name, function in (
            ("spin-a", spin_a),
            ("spin-b", spin_b),
            ("spin-c", spin_c),
            ("spin-d", spin_d),
        )
    ]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    if delay is None:
        print("ready", os.getpid(), file=sys.stderr, flush=True)
    for t in threads:
        t.join()
    print(json.dumps(tids), flush=True)


main()
