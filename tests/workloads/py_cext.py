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
# With FUNCTION `mix`, crunch is mix (its work through two inlined C functions).
#
# Usage: python3.11 py_cext.py SECONDS CEXT_DIR [FUNCTION]   (CEXT_DIR: the
# directory of the built spanprof_cext module)
#
# Prints `ready PID` on stderr when it starts.
import os
import sys
import time

ROUNDS = 500


def middle():
    return work(ROUNDS)


def outer():
    return middle()


def run(seconds):
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total ^= outer()
    return total


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: py_cext.py SECONDS CEXT_DIR [crunch|mix]")
    seconds = float(sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    import spanprof_cext

    work = getattr(spanprof_cext, sys.argv[3] if len(sys.argv) == 4 else "crunch")

    print("ready", os.getpid(), file=sys.stderr, flush=True)
    run(seconds)
