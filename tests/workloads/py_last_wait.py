# A process that ends with a long wait: the main thread starts two workers that spin for
# SECONDS, joins them in `join_all` and exits at once, so the wait's Python frames must be named
# before the interpreter frees its code objects on the way out.
#
# Usage: python3 py_last_wait.py SECONDS
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


def main(seconds):
    threads = [threading.Thread(target=work, args=(seconds,)) for _ in range(2)]
    for t in threads:
        t.start()
    join_all(threads)


main(float(sys.argv[1]))
