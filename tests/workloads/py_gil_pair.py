# Two threads, spin_a and spin_b, each computing in pure Python without end: they share the
# GIL, so at any moment one runs and the other waits for it (the interpreter hands the GIL over
# every 5 ms). The main thread waits on an Event.
#
# Usage: python3 py_gil_pair.py
# Prints `ready PID TID_A TID_B` on stderr once both run.
import os
import sys
import threading


def spin_a(started):
    started.release()
    x = 0
    while True:
        x += 1


def spin_b(started):
    started.release()
    x = 0
    while True:
        x += 1


def main():
    started = threading.Semaphore(0)
    threads = [
        threading.Thread(target=f, args=(started,), name=f.__name__, daemon=True)
        for f in (spin_a, spin_b)
    ]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    sys.stderr.write("ready %d %s\n" % (os.getpid(), " ".join(str(t.native_id) for t in threads)))
    sys.stderr.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
