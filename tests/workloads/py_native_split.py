# A split of CPU time between pure-Python arithmetic and a native library called
# from Python: `arith` (60%: integer arithmetic, much of it in the interpreter's
# own integer code) and `squeeze` (40%: zlib.compress, in libz).
#
# Usage: python3 py_native_split.py CPU_SECONDS [GO_FILE]
#
# Runs chunks of random length (no period aliases with a sampling rate) of the
# function furthest below its share, each measured with time.thread_time(),
# until the two have used CPU_SECONDS of CPU time together: the work is bounded
# by the process's own CPU time, not by the clock. Prints `ready PID` on stderr
# at the start (then, with GO_FILE, waits for that file to exist before working,
# so a profiler attached by pid sees all the work) and, when done, one JSON line
# on stdout: `truth` (each function's measured share of their CPU time) and
# `spent` (seconds).
import json
import os
import random
import sys
import time
import zlib


def arith(n):
    x = 7
    for _ in range(n):
        x = (x * 0x5DEECE66D + 11) % (1 << 61) ^ (x >> 17)
    return x


def squeeze(data, n):
    return len(zlib.compress(data[:n], 6))


def make_data(rng, size):
    # Compressible but not trivial: words from a small vocabulary with random numbers.
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words)
        out += b" %d " % rng.randrange(100000)
    return bytes(out[:size])


def run(cpu_seconds):
    rng = random.Random(5)
    data = make_data(rng, 1 << 17)
    targets = (0.6, 0.4)
    spent = [0.0, 0.0]
    while spent[0] + spent[1] < cpu_seconds:
        total = spent[0] + spent[1]
        i = 0 if targets[0] * total - spent[0] >= targets[1] * total - spent[1] else 1
        t0 = time.thread_time()
        if i == 0:
            arith(rng.randrange(1000, 3000))
        else:
            squeeze(data, rng.randrange(8192, 24576))
        spent[i] += time.thread_time() - t0
    total = sum(spent)
    return {
        "truth": {"arith": spent[0] / total, "squeeze": spent[1] / total},
        "spent": {"arith": spent[0], "squeeze": spent[1]},
        "version": "%d.%d" % sys.version_info[:2],
    }


def main():
    cpu_seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    if len(sys.argv) > 2:
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[2]):
            if time.monotonic() > deadline:
                sys.exit("py_native_split.py: %s never appeared" % sys.argv[2])
            time.sleep(0.01)
    print(json.dumps(run(cpu_seconds)), flush=True)


main()
