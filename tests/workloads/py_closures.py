# A Python workload whose CPU time goes to functions that share one code
# object between many function objects: a lambda made anew for each
# `sorted(key=...)` call, generator expressions consumed by `sum`, and a
# closure made anew by each call of the function that defines it.
#
# Usage: python3 py_closures.py SECONDS
#
# The main loop runs short chunks (a few milliseconds) of one of the three at a
# time, always the one that has had the least CPU time so far, so each gets
# about a third whenever a profiler attaches. It prints `ready PID` on stderr
# when it starts and, when done, one JSON line on stdout with the CPU time
# spent per kind (`spent`, seconds).
#
# Each hot function spends nearly all its time on the line marked
# `# hot: KIND`. Their names are `co_qualname` from 3.11
# (`run_lambdas.<locals>.<lambda>`, `run_genexprs.<locals>.<genexpr>`,
# `make.<locals>.inner`) and `co_name` before (`<lambda>`, `<genexpr>`,
# `inner`); the stacks are
#   <module> -> main -> run_lambdas -> (sorted) -> <lambda>
#   <module> -> main -> run_genexprs -> (sum) -> <genexpr>
#   <module> -> main -> run_closures -> inner
import json
import os
import sys
import time


def run_lambdas(rounds):
    data = list(range(200))
    total = 0
    for r in range(rounds):
        out = sorted(data, key=lambda x: pow(x + r, 5, 1000003) ^ (x * 2654435761) % 65521)  # hot: lambda
        total += out[0]
    return total


def run_genexprs(rounds):
    total = 0
    for r in range(rounds):
        total += sum((x * 1103515245 + r) % 2147483648 ^ (x >> 3) ^ (x << 1) & 0xFFFF for x in range(400))  # hot: genexpr
    return total


def make(k):
    def inner():
        x = k
        for _ in range(400):
            x = (x * 69069 + 1) % 4294967296 ^ (x >> 5) ^ (x << 2) & 0xFFFFF  # hot: closure
        return x

    return inner


def run_closures(rounds):
    total = 0
    for i in range(rounds):
        total += make(i)()
    return total


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    kinds = (("lambda", run_lambdas), ("genexpr", run_genexprs), ("closure", run_closures))
    spent = [0.0, 0.0, 0.0]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        i = spent.index(min(spent))
        t0 = time.thread_time()
        kinds[i][1](20)
        spent[i] += time.thread_time() - t0
    print(json.dumps({"spent": {k: s for (k, _), s in zip(kinds, spent)}}), flush=True)


main()
