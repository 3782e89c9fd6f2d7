# A Python stack of a known depth spinning at its leaf: `<module> -> f x (DEPTH + 1)`, the
# innermost call spinning in pure Python. On CPython 3.8-3.10 every Python call is a C call
# of the interpreter too, so the native stack grows with the depth (about 400-500 bytes a
# level): the workload of the stack-copy tests.
#
# Usage: python3 py_recurse.py DEPTH SECONDS
#
# Prints `ready PID` on stderr when it starts.
import os
import sys
import time


def f(n, end):
    if n == 0:
        x = 0
        while time.monotonic() < end:
            for i in range(1000):
                x = (x * 31 + i) % 1000003
        return x
    return f(n - 1, end)


depth = int(sys.argv[1])
seconds = float(sys.argv[2])
print(f"ready {os.getpid()}", file=sys.stderr, flush=True)
f(depth, time.monotonic() + seconds)
