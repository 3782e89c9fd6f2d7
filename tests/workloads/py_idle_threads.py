# py-spy's `longsleep` and `thread_names` shapes for an idle profile: the main thread sleeps in
# `longsleep` and ten threads named idle-0 .. idle-9 wait on an Event in `idle_wait`, all of
# them for the whole of SECONDS; nothing runs.
#
# Usage: python3 py_idle_threads.py SECONDS
# Prints `ready PID TID...` on stderr once every thread waits (the main thread's native id
# first, then the idle threads' in name order).
import os
import sys
import threading
import time

THREADS = 10


def idle_wait(event, started):
    started.release()
    event.wait()


def longsleep(seconds):
    time.sleep(seconds)


def main():
    seconds = float(sys.argv[1])
    event = threading.Event()
    started = threading.Semaphore(0)
    threads = [
        threading.Thread(target=idle_wait, args=(event, started), name="idle-%d" % i, daemon=True)
        for i in range(THREADS)
    ]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    # Each waiter is in event.wait() a moment after it released the semaphore.
    time.sleep(0.2)
    tids = [threading.get_native_id()] + [t.native_id for t in threads]
    sys.stderr.write("ready %d %s\n" % (os.getpid(), " ".join(map(str, tids))))
    sys.stderr.flush()
    longsleep(seconds)


if __name__ == "__main__":
    main()
