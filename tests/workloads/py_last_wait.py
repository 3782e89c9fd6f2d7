# A process that ends with a long wait: the main thread starts two workers that spin for
# SECONDS, joins them in `join_all` and exits at once, so the wait's Python frames must be named
# before the interpreter frees its code objects on the way out. With `sleep`, the main thread
# sleeps SECONDS in `sleep_last` instead, alone; with `exit`, it then leaves by `os._exit` (as
# multiprocessing's workers do): the process's memory is gone microseconds after the wait.
#
# Usage: python3 py_last_wait.py SECONDS [join|sleep|exit]
import os
import sys
import threading
import time


def work(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return x


def join_all(threads):
    for t in threads:
        t.join()


def sleep_last(seconds):
    time.sleep(seconds)


def main(seconds):
    threads = [threading.Thread(target=work, args=(seconds,)) for _ in range(2)]
    for t in threads:
        t.start()
    join_all(threads)


if sys.argv[2:] == ["sleep"]:
    sleep_last(float(sys.argv[1]))
elif sys.argv[2:] == ["exit"]:
    sleep_last(float(sys.argv[1]))
    os._exit(0)
else:
    main(float(sys.argv[1]))
