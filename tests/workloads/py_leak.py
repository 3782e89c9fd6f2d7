# A Python workload with a leak and churn, for the heap-profiling tests
# (tests/tests/alloc/, `--event heap`):
#
# - leak(store, n): appends n bytes(10_000) objects to `store`, a list that
#   keeps growing and is never freed. Each object is one calloc(1, 10_033) by
#   CPython (bytes(n) asks PyObject_Calloc for n + 33 bytes, which hands
#   requests over 512 bytes to the C library), and the list's item array grows
#   by realloc (over-allocated by 1/8: its final block, allocated * 8 bytes, is
#   also kept).
# - churn(n): makes n bytes(10_000) objects that die at once, then n more held
#   in a local list that dies when churn returns: as many bytes as leak
#   allocates, all of them freed (the list's own array too) before it returns.
#
# main() runs BATCHES batches of leak(store, PER_BATCH) then churn(PER_BATCH),
# and ends with os._exit(0), without the interpreter's finalization: what leak
# kept is still allocated when the process is gone (a normal exit would free
# `store` while finalizing, and nothing would be left in use).
#
# Truth, computed from the sizes above and sys.getsizeof:
# - leak: "objects" x 10_033 bytes + the list's array (sys.getsizeof(store) -
#   sys.getsizeof([])), all in use at the end; "allocated_bytes" also counts
#   the arrays the list outgrew (freed by realloc), which are not in use.
# - churn: in use at the end: 0 bytes.
#
# Usage: python3 py_leak.py [--wait] [BATCHES [PER_BATCH [OBJECT_SIZE]]]
#   (default 40 x 1000 objects of 10_033 bytes; OBJECT_SIZE, at least 513, is
#   what each object asks the C library for: 65536 makes 64 KiB buffers)
#   --wait: after `ready PID`, wait for SIGUSR1 before any work (so that a
#           profiler attached with --pid sees every allocation from the first)
# Prints `ready PID` on stderr at start and, when done, one JSON line:
#   {"pid": PID, "python": "3.12.1", "object_size": 10033,
#    "leak": {"objects": N, "object_bytes": B, "list_array_bytes": B,
#             "inuse_bytes": B},
#    "churn": {"objects": N, "allocated_bytes": B, "inuse_bytes": 0}}
import json
import os
import platform
import signal
import sys

# The bytes objects' data size (argument OBJECT_SIZE less 33).
SIZE = 10_000
# What one bytes(SIZE) asks the C library for: the object header (33 bytes
# with the trailing NUL) and the data.
OBJECT_SIZE = SIZE + 33


def leak(store, n):
    for _ in range(n):
        store.append(bytes(SIZE))


def churn(n):
    for _ in range(n):
        bytes(SIZE)
    held = [bytes(SIZE) for _ in range(n)]
    return len(held)


def main():
    args = sys.argv[1:]
    wait = args[:1] == ["--wait"]
    if wait:
        args = args[1:]
    global SIZE, OBJECT_SIZE
    batches = int(args[0]) if len(args) > 0 else 40
    per_batch = int(args[1]) if len(args) > 1 else 1000
    if len(args) > 2:
        OBJECT_SIZE = int(args[2])
        SIZE = OBJECT_SIZE - 33
    # Objects of 512 bytes or less would be pymalloc's, not the C library's.
    if batches < 1 or per_batch < 1 or OBJECT_SIZE <= 512 or len(args) > 3:
        sys.exit(
            "usage: py_leak.py [--wait] [BATCHES [PER_BATCH [OBJECT_SIZE]]]"
            "  (counts >= 1, OBJECT_SIZE > 512)"
        )
    if wait:
        # Blocked first, so that a SIGUSR1 sent as soon as `ready` is read is not lost.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    if wait:
        signal.sigwait({signal.SIGUSR1})
    store = []
    churned = 0
    for _ in range(batches):
        leak(store, per_batch)
        churned += per_batch + churn(per_batch)
    assert sys.getsizeof(store[0]) == OBJECT_SIZE, sys.getsizeof(store[0])
    array = sys.getsizeof(store) - sys.getsizeof([])
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "python": platform.python_version(),
                "object_size": OBJECT_SIZE,
                "leak": {
                    "objects": len(store),
                    "object_bytes": len(store) * OBJECT_SIZE,
                    "list_array_bytes": array,
                    "inuse_bytes": len(store) * OBJECT_SIZE + array,
                },
                "churn": {
                    "objects": churned,
                    "allocated_bytes": churned * OBJECT_SIZE,
                    "inuse_bytes": 0,
                },
            }
        ),
        flush=True,
    )
    # Without finalization: what leak kept stays allocated to the end.
    os._exit(0)


main()
