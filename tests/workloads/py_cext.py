# Python calling into a C extension built without frame pointers, for the
# .eh_frame unwinding tests of mixed stacks:
#
#   <module> -> run -> outer -> middle -> spanprof_cext.crunch (C)
#                                          -> crunch_outer -> crunch_inner
#
# Nearly all the CPU time is in crunch_inner (tests/workloads/spanprof_cext.c,
# built by `cargo xtask workloads` into target/workloads/cext for Debian's
# /usr/bin/python3.11), each call of crunch taking well under a millisecond.
#
# Usage: python3.11 py_cext.py SECONDS CEXT_DIR   (CEXT_DIR: the directory of
# the built spanprof_cext module)
#
# Prints `ready PID` on stderr when it starts.
import os
import sys
import time

ROUNDS = 500


def middle():
    return spanprof_cext.crunch(ROUNDS)


def outer():
    return middle()


def run(seconds):
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total ^= outer()
    return total


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: py_cext.py SECONDS CEXT_DIR")
    seconds = float(sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    import spanprof_cext

    print("ready", os.getpid(), file=sys.stderr, flush=True)
    run(seconds)
