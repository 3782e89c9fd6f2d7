# A thread renamed halfway through its work: a threading.Thread named `first-half` computes for
# HALF seconds of its own CPU time, renames itself `second-half` (Thread.name), and computes for
# HALF seconds more; the main thread waits for it.
#
# Usage: python3 py_thread_rename.py HALF
# Prints `ready PID` on stderr at the start and one JSON line when done: the thread's native id
# (`tid`) and the CPU seconds it spent under each name (`cpu`).
import json
import os
import sys
import threading
import time


def burn(seconds):
    start = time.thread_time()
    x = 1
    while time.thread_time() - start < seconds:
        for _ in range(200):
            x = (x * 1103515245 + 12345) % 2147483648
    return time.thread_time() - start


def work(half, out):
    out["tid"] = threading.get_native_id()
    out["cpu"] = {"first-half": burn(half)}
    threading.current_thread().name = "second-half"
    out["cpu"]["second-half"] = burn(half)


def main():
    sys.stderr.write("ready %d\n" % os.getpid())
    sys.stderr.flush()
    out = {}
    t = threading.Thread(target=work, name="first-half", args=(float(sys.argv[1]), out))
    t.start()
    t.join()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
