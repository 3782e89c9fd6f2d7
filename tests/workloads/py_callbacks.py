# C code calling back into Python, many times a millisecond: the main thread runs
#   main -> run_map -> sum(map(tiny, ...)) (C: builtin_sum, map_next) -> tiny
#   main -> run_sorted -> sorted(..., key=tiny_key) (C) -> tiny_key
# so that a sample often lands as the interpreter loop is entered for the callback (on
# 3.11/3.12 the thread's frame is half built for a few instructions then).
#
# Usage: python3 py_callbacks.py SECONDS
#
# Prints `ready PID` on stderr when it starts, and at the end, on stdout, the share of its CPU
# time each of run_map and run_sorted took (measured around each call) as JSON:
# {"truth": {"run_map": 0.6, "run_sorted": 0.4}, "version": "3.12"}.
#
# run_map's length is random (1000 to 3000 items), so a round of the loop does not last the same
# time each: a round of a fixed length, about 1 ms here, aliased with a 999 Hz sampler, whose
# samples then fell at slowly drifting points of it (a CI run measured run_map 3.1 points off).
import json
import os
import random
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
    spent = {"run_map": 0.0, "run_sorted": 0.0}
    clock = time.process_time
    rng = random.Random(os.getpid())
    while time.monotonic() < end:
        n = rng.randint(1000, 3000)
        t0 = clock()
        total += run_map(n)
        t1 = clock()
        total += len(run_sorted(data))
        t2 = clock()
        spent["run_map"] += t1 - t0
        spent["run_sorted"] += t2 - t1
    both = sum(spent.values()) or 1.0
    version = "%d.%d" % sys.version_info[:2]
    truth = {k: v / both for k, v in spent.items()}
    print(json.dumps({"truth": truth, "version": version}), flush=True)
    return total


if __name__ == "__main__":
    sys.stderr.write("ready %d\n" % os.getpid())
    sys.stderr.flush()
    main(float(sys.argv[1]))
