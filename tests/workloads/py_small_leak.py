# A Python workload that leaks small objects while other code churns through many more, for
# the heap-profiling tests of small objects (tests/tests/alloc/, `--event heap`):
#
# - leak_fn(store, n, base): appends n 2-tuples of two new ints to `store`, a list that keeps
#   growing and is never freed: per tuple, one tuple (sys.getsizeof 56) and two ints (28 each),
#   all from CPython's small-object allocator (pymalloc), plus the list's item array, grown by
#   realloc (malloc once it passes 512 bytes).
# - churn_fn(n): builds a list of n short strs ("c" and a number: sys.getsizeof 51-55 each,
#   pymalloc too) and its item array, ~6 MiB a call with the default n, all freed before it
#   returns. It runs after leak_fn in each round, so the arenas pymalloc maps for it are the
#   ones the next rounds' leaked objects fill: a profiler that charges an arena to the code that
#   mapped it blames churn_fn for leak_fn's objects. (strs, not tuples: CPython keeps up to 2000
#   freed tuples of each size on a free list and hands them out again without the allocator, so
#   tuples churn_fn freed would be leak_fn's without any allocation.)
# - mapped_fn(n): maps n anonymous 1 MiB mappings with the mmap module, kept to the end: the
#   size of a 3.10+ arena, but mapped by the mmap extension module, not by pymalloc, so they
#   are mapped_fn's own (a check that not every 1 MiB mmap is taken for an arena).
#
# main() calls mapped_fn(MAPPED) first, then runs ROUNDS rounds of leak_fn(store, PER_ROUND) then churn_fn(CHURN), and ends with
# os._exit(0), without the interpreter's finalization: what leak_fn kept is still allocated.
#
# Truth, the sizes CPython asks its allocators for: sys.getsizeof, but for an int of one digit,
# which 3.11+ allocates with sizeof(PyLongObject), 32 bytes (_PyLong_FromMedium), where
# sys.getsizeof says 28 (its digits only; 3.8-3.10 ask 28):
# - leak_fn: "objects" tuples and 2 x "objects" ints, and the list's item array
#   (sys.getsizeof(store) - sys.getsizeof([])): "inuse_bytes", all in use at the end;
# - churn_fn: "allocated_bytes" (its strs and its arrays, about), 0 in use at the end;
# - mapped_fn: "inuse_bytes", MAPPED x 1 MiB.
#
# Usage: python3 py_small_leak.py [--wait] [ROUNDS [PER_ROUND [CHURN [MAPPED]]]]
#        (default 20 5000 100000 8)
#   --wait: after `ready PID`, wait for SIGUSR1 before any work
# Prints `ready PID` on stderr at start and, when done, one JSON line:
#   {"pid": PID, "python": "3.11.7",
#    "leak_fn": {"objects": N, "inuse_bytes": B},
#    "churn_fn": {"allocated_bytes": B, "inuse_bytes": 0},
#    "mapped_fn": {"inuse_bytes": B}}
import json
import mmap
import os
import platform
import signal
import sys


def leak_fn(store, n, base):
    for i in range(base, base + n):
        store.append((i, i + 1))


def churn_fn(n):
    junk = ["c%d" % i for i in range(n)]
    return sum(map(sys.getsizeof, junk)) + sys.getsizeof(junk)


def mapped_fn(n):
    return [mmap.mmap(-1, 1 << 20) for _ in range(n)]


def main():
    args = sys.argv[1:]
    wait = args[:1] == ["--wait"]
    if wait:
        args = args[1:]
    numbers = [int(a) for a in args]
    rounds, per_round, churn, mapped = (numbers + [20, 5000, 100_000, 8][len(numbers):])[:4]
    if min(rounds, per_round, churn) < 1 or mapped < 0 or len(numbers) > 4:
        sys.exit("usage: py_small_leak.py [--wait] [ROUNDS [PER_ROUND [CHURN [MAPPED]]]]")
    if wait:
        # Blocked first, so that a SIGUSR1 sent as soon as `ready` is read is not lost.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    if wait:
        signal.sigwait({signal.SIGUSR1})
    mapped = mapped_fn(mapped)
    store = []
    churned = 0
    # Numbers from 1000 up: no small int CPython caches (-5..256).
    base = 1000
    for _ in range(rounds):
        leak_fn(store, per_round, base)
        base += per_round + 1
        churned += churn_fn(churn)
    int_request = 32 if sys.version_info >= (3, 11) else sys.getsizeof(base)
    objects = sum(sys.getsizeof(t) + 2 * int_request for t in store)
    array = sys.getsizeof(store) - sys.getsizeof([])
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "python": platform.python_version(),
                "leak_fn": {"objects": len(store), "inuse_bytes": objects + array},
                "churn_fn": {"allocated_bytes": churned, "inuse_bytes": 0},
                "mapped_fn": {"inuse_bytes": len(mapped) << 20},
            }
        ),
        flush=True,
    )
    # Without finalization: what leak_fn kept stays allocated to the end.
    os._exit(0)


main()
