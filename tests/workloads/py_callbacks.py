# C code calling back into Python, many times a millisecond: the main thread runs
#   main -> run_map -> sum(map(tiny, ...)) (C: builtin_sum, map_next) -> tiny
#   main -> run_sorted -> sorted(..., key=tiny_key) (C) -> tiny_key
# so that a sample often lands as the interpreter loop is entered for the callback (on
# 3.11/3.12 the thread's frame is half built for a few instructions then).
#
# Usage: python3 py_callbacks.py SECONDS
#
# Prints `ready PID` on stderr when it starts.
import os
import sys
import time


def tiny(x):
    return x + 1


def tiny_key(x):
    return -x


def run_map(n):
    return sum(map(tiny, range(n)))


def run_sorted(data):
    return sorted(data, key=tiny_key)


def main(seconds):
    end = time.monotonic() + seconds
    data = list(range(2000))
    total = 0
    while time.monotonic() < end:
        total += run_map(2000)
        total += len(run_sorted(data))
    return total


if __name__ == "__main__":
    sys.stderr.write("ready %d\n" % os.getpid())
    sys.stderr.flush()
    main(float(sys.argv[1]))
