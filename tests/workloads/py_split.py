# A Python workload with a known split of CPU time between three pure-Python
# functions: alpha 50%, Worker.beta 30%, gamma 20%.
#
# Usage: python3 py_split.py SECONDS
#
# The main loop runs short chunks (well under a millisecond, of random length so
# that no period aliases with a sampling rate) of one function at a time, always
# the one furthest below its target share, measuring each chunk with
# time.thread_time(); so every window of a few milliseconds or more has the
# target split, whenever a profiler attaches. It prints `ready PID` on stderr
# when it starts and, when done, one JSON line on stdout with the measured CPU
# time per function (`spent`, seconds) and the shares (`truth`, summing to 1).
#
# Each function spends nearly all its time on the line marked `# hot: NAME`, so
# the line of its hottest frame is that line. The stack of each is
# <module> -> main -> run_split -> {alpha, Worker.beta, gamma}.
import json
import os
import random
import sys
import time

CHUNK = 1500


def alpha(n):
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648 ^ (x >> 3) ^ (x << 1) & 0xFFFF  # hot: alpha
    return x


class Worker:
    def beta(self, n):
        y = 3
        for _ in range(n):
            y = (y * 69069 + 1) % 4294967296 ^ (y >> 5) ^ (y << 2) & 0xFFFFF  # hot: beta
        return y


def gamma(n):
    z = 7
    for _ in range(n):
        z = (z * 48271 + 11) % 2147483647 ^ (z >> 7) ^ (z << 3) & 0xFFFFFF  # hot: gamma
    return z


def run_split(seconds):
    worker = Worker()
    names = ("alpha", "beta", "gamma")
    functions = (alpha, worker.beta, gamma)
    targets = (0.5, 0.3, 0.2)
    spent = [0.0, 0.0, 0.0]
    rng = random.Random(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            total = spent[0] + spent[1] + spent[2]
            d0 = targets[0] * total - spent[0]
            d1 = targets[1] * total - spent[1]
            d2 = targets[2] * total - spent[2]
            i = 0 if d0 >= d1 and d0 >= d2 else (1 if d1 >= d2 else 2)
            n = rng.randrange(CHUNK // 2, CHUNK * 3 // 2)
            t0 = time.thread_time()
            functions[i](n)
            spent[i] += time.thread_time() - t0
    total = sum(spent)
    return {
        "spent": dict(zip(names, spent)),
        "truth": {name: s / total for name, s in zip(names, spent)},
    }


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    result = run_split(seconds)
    print(json.dumps(result), flush=True)


main()
