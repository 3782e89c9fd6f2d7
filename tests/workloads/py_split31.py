# A 3:1 split of CPU time between two pure-Python functions, hot_a (75%) and
# hot_b (25%), for the tests of interpreters in containers and chroots.
#
# Usage: python3 py_split31.py SECONDS
#
# Chunks of random length (no period aliases with a sampling rate) of the function
# furthest below its share, each measured with time.thread_time() (process_time on 3.6). Prints
# `ready PID` on stderr at the start and, when done, one JSON line on stdout:
# `truth` (each function's measured share of their CPU time) and `lines` (the line
# each function spends its time on, as the interpreter reports it for itself:
# sys._getframe().f_lineno of a probe call on that very line).
import json
import os
import random
import sys
import time

# time.thread_time is 3.7+; the single-threaded workload's process time is the same on 3.6.
thread_time = getattr(time, "thread_time", time.process_time)


def probe():
    return sys._getframe(1).f_lineno


def hot_a(n):
    x, line = 1, 0
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648 ^ (x >> 3); line = line or probe()
    return line


def hot_b(n):
    y, line = 3, 0
    for _ in range(n):
        y = (y * 69069 + 1) % 4294967296 ^ (y >> 5) ^ (y << 2) & 0xFFFFF; line = line or probe()
    return line


def run(seconds):
    functions = (("hot_a", hot_a, 0.75), ("hot_b", hot_b, 0.25))
    spent = [0.0, 0.0]
    lines = {}
    rng = random.Random(3)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total = spent[0] + spent[1]
        i = 0 if 0.75 * total - spent[0] >= 0.25 * total - spent[1] else 1
        name, function, _ = functions[i]
        t0 = thread_time()
        lines[name] = function(rng.randrange(750, 2250))
        spent[i] += thread_time() - t0
    total = sum(spent)
    return {
        "truth": {f[0]: s / total for f, s in zip(functions, spent)},
        "lines": lines,
        "version": "%d.%d" % sys.version_info[:2],
    }


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    print(json.dumps(run(seconds)), flush=True)


main()
