# Deep Python stacks: the main thread alternates, every ~20 ms, between
#   drive -> down_whole x 300 -> leaf_whole   (300 recursive frames)
#   drive -> down_deep x 900 -> leaf_deep     (900: deeper than the 512 frames a sample holds)
# with the leaf functions spinning in pure Python.
#
# Usage: python3 py_deep.py SECONDS
#
# Prints `ready PID` on stderr when it starts.
import os
import sys
import time

WHOLE = 300
DEEP = 900


def leaf_whole(end):
    x = 1
    while time.monotonic() < end:
        for _ in range(200):
            x = (x * 1103515245 + 12345) % 2147483648
    return x


def leaf_deep(end):
    x = 2
    while time.monotonic() < end:
        for _ in range(200):
            x = (x * 69069 + 1) % 4294967296
    return x


def down_whole(n, end):
    if n == 1:
        return leaf_whole(end)
    return down_whole(n - 1, end)


def down_deep(n, end):
    if n == 1:
        return leaf_deep(end)
    return down_deep(n - 1, end)


def drive(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        down_whole(WHOLE, time.monotonic() + 0.02)
        down_deep(DEEP, time.monotonic() + 0.02)


def main():
    sys.setrecursionlimit(5000)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    drive(seconds)


main()
