# A Python workload whose code objects are freed while it runs, and whose
# children exit while it runs: the worst case for naming code objects after
# the fact (their addresses are reused by the next ones).
#
# Usage: python3 py_churn.py SECONDS [nested]
#
# With `nested`, the generated `gen_fn_{i}` defines and calls a nested function
# `inner` (qualname `gen_fn_{i}.<locals>.inner`) that does the work: every
# iteration's `inner` has the same name, a mortal qualname and the same shape.
#
# Each iteration i compiles fresh source with the file name `gen_{i}.py`
# defining `gen_fn_{i}(n)`, a loop that burns 3-10 ms of CPU, execs it, calls
# the function through `nest`, a recursion `i % 5 + 1` deep, and then drops
# every reference to the code and the function (so they are freed, and their
# memory is reused by the next iteration's objects of the same sizes). The
# source is the same size and shape in every iteration, only `i` changes: a
# name read from a reused address would be another iteration's. A sample of
# `gen_fn_{i}` therefore has the Python frames
#   <module> -> main -> churn -> nest x (i % 5 + 1) -> gen_fn_{i} (gen_{i}.py)
# so the depth tells which iteration it was (modulo 5) independently of the
# names read.
#
# Every ~300 ms it also starts a short-lived child, the same interpreter
# running `child_spin` (file `<string>`) for ~100 ms of CPU, which exits. It
# prints `ready PID` on stderr when it starts and, when done, one JSON line on
# stdout with its pid, the children's pids and the number of iterations.
import json
import os
import random
import subprocess
import sys
import time

SOURCE = """\
def gen_fn_{i}(n):
    x = {i}
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648 ^ (x >> 3) ^ (x << 1) & 0xFFFF  # hot: gen
    return x
"""

NESTED_SOURCE = """\
def gen_fn_{i}(n):
    def inner(n):
        x = {i}
        for _ in range(n):
            x = (x * 1103515245 + 12345) % 2147483648 ^ (x >> 3) ^ (x << 1) & 0xFFFF  # hot: nested
        return x
    return inner(n)
"""

CHILD = """\
import time
def child_spin():
    x = 1
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        for _ in range(1000):
            x = (x * 69069 + 1) % 4294967296 ^ (x >> 5)
    return x
child_spin()
"""


def nest(depth, fn, n):
    if depth > 1:
        return nest(depth - 1, fn, n)
    return fn(n)


def churn(seconds, source):
    rng = random.Random(1)
    children = []
    pids = []
    next_child = time.monotonic()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        if time.monotonic() >= next_child:
            child = subprocess.Popen([sys.executable, "-c", CHILD])
            children.append(child)
            pids.append(child.pid)
            next_child += 0.3
        code = compile(source.format(i=i), f"gen_{i}.py", "exec")
        namespace = {}
        exec(code, namespace)
        fn = namespace[f"gen_fn_{i}"]
        # ~3-10 ms of CPU (the loop runs ~3 M iterations a second).
        nest(i % 5 + 1, fn, rng.randrange(9_000, 30_000))
        # The function and the namespace refer to each other: break the cycle
        # so that both, and the code objects, are freed now.
        namespace.clear()
        del code, namespace, fn
        children = [c for c in children if c.poll() is None]
        i += 1
    for child in children:
        child.wait()
    return {"pid": os.getpid(), "children": pids, "iterations": i}


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    source = NESTED_SOURCE if sys.argv[2:3] == ["nested"] else SOURCE
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    result = churn(seconds, source)
    print(json.dumps(result), flush=True)


main()
