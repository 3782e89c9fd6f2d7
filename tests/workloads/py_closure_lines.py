# A Python workload whose CPU time goes to a tiny closure called in a hot loop,
# so that many samples land on the closure's first instructions: from 3.11 a
# closure starts with COPY_FREE_VARS (and MAKE_CELL for its own cells) before
# RESUME, and the location table gives those instructions no line.
#
# Usage: python3 py_closure_lines.py SECONDS
#
# It prints `ready PID` on stderr when it starts and `done N` on stdout when
# done. The closure is `make.<locals>.pred` from 3.11 (`pred` before); its
# lines are marked `# closure: def` (its `def`) and `# closure: body`, and a
# frame of it is on one of them. The stack is
#   <module> -> main -> spin -> pred
import os
import sys
import time


def make(k):
    def pred(x):  # closure: def
        cell = x  # closure: body
        return (lambda: cell)() % k == 0 if x < 0 else x % k == 0  # closure: body

    return pred


def spin(pred):
    n = 0
    for x in range(20000):
        if pred(x):
            n += 1
    return n


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    pred = make(7)
    total = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total += spin(pred)
    print("done", total, flush=True)


main()
