# A Python workload that allocates known amounts of memory from two functions,
# for the allocation-profiling tests (tests/tests/alloc/):
#
# - big_buffers(): ROUNDS rounds of 64 bytearray(1 MiB), each round kept in a
#   list until the next round replaces it (so the earlier rounds are FREED, the
#   last round's 64 buffers are KEPT until the process exits). Each buffer is
#   one malloc(1 MiB + 1) by CPython (bytearray(n) asks PyObject_Realloc(NULL,
#   n + 1), which hands requests over 512 bytes to the C library's malloc), plus
#   a 56-byte bytearray object from the small-object allocator.
# - small_objects(slots): bytes objects of 95, 223 and 479 bytes in turn
#   (sys.getsizeof 128, 256 and 512: multiples of 16, so each is exactly one
#   block of its pymalloc size class), stored into a list preallocated by the
#   caller (no list growth, no realloc inside the function), all KEPT until
#   exit. CPython's small-object allocator (pymalloc) carves them from arenas it
#   gets with _PyObject_ArenaMmap (3.8-3.11) / _PyMem_ArenaAlloc (3.12+), each
#   an anonymous mmap: 256 KiB arenas up to 3.9, 1 MiB from 3.10.
#
# The truth of each function, measured around its call in main():
# - "malloc_bytes": what the function asked the C library's malloc family for,
#   computed from the sizes above (big_buffers: rounds x 64 x (1 MiB + 1);
#   small_objects: 0, every object is <= 512 bytes). Checked by hand with an
#   LD_PRELOAD shim counting the malloc/calloc/realloc calls of 600 bytes or
#   more between two points of the script (pyenv 3.9, 3.11, 3.12, 3.13 and
#   Debian's 3.11): big_buffers makes exactly those calls; small_objects makes
#   none but the growth of pymalloc's own table of arenas (a realloc doubling
#   it, 48 bytes per arena: under 0.1% of the arenas' bytes), which is left out.
# - "arenas" / "arena_bytes": the pymalloc arenas allocated during the call,
#   from sys._debugmallocstats() ("# arenas allocated total") just before and
#   just after it, times the arena size it prints. This is exactly what a
#   profiler probing the arena allocator sees; the snapshot is taken in C, and
#   the few Python objects made to take it are made outside the two points
#   (the output is read back and parsed after the second snapshot), so the
#   error is at most an arena a free pool of which the snapshot's own objects
#   happened to need: 0 in every run by hand.
# - "getsizeof_bytes": the sum of sys.getsizeof() of every object created and
#   kept (small_objects) - the bytes the objects themselves occupy. The arena
#   bytes exceed it by the allocator's overhead: each pool's 48-byte header and
#   its tail too small for one more block (with 512-byte blocks, 512 bytes of
#   each pool: 3% of a 16 KiB pool, 12.5% of a 4 KiB one, up to 3.9), the part
#   of each arena lost to aligning its pools (3.10+), the last arena partly
#   used, and the free pools of earlier arenas used first (which lowers it).
#   Measured: arena bytes = 1.04 x getsizeof with 1 MiB arenas, 1.105 x with
#   256 KiB ones; the test prints the ratio each run.
#
# Usage: python3 py_alloc.py [--wait] [SMALL_MIB [ROUNDS]]
#        python3 py_alloc.py --bench UNITS   (the target of `cargo xtask bench --only alloc`)
#        python3 py_alloc.py --bench-malloc UNITS   (its malloc-heavy target: 1000 malloc+free
#                                                    of 600-3999 bytes a unit)
#   SMALL_MIB: getsizeof bytes of small objects to make, in MiB (default 320)
#   ROUNDS:    rounds of 64 x 1 MiB in big_buffers (default 5)
#   --wait:    after `ready PID`, wait for SIGUSR1 before any work (so that a
#              profiler attached with --pid sees every allocation, Python
#              frames included, from the first)
# Prints `ready PID` on stderr at start and, when done, one JSON line:
#   {"pid": PID, "python": "3.12.1", "arena_size": BYTES,
#    "big_buffers": {"calls": N, "malloc_size": 1048577, "malloc_bytes": B,
#                    "kept": 64, "kept_bytes": B, "arenas": A, "arena_bytes": B},
#    "small_objects": {"objects": N, "getsizeof_bytes": B, "malloc_bytes": 0,
#                      "arenas": A, "arena_bytes": B, "reclaimed": R}}
import json
import os
import platform
import resource
import signal
import sys
import tempfile
import time

BIG_SIZE = 1 << 20
BIG_COUNT = 64
# len(bytes(n)) for n in SMALL_LENGTHS has sys.getsizeof 128, 256, 512 (n + 33).
SMALL_LENGTHS = (95, 223, 479)


def big_buffers(rounds):
    kept = None
    for _ in range(rounds):
        fresh = [None] * BIG_COUNT  # 512 bytes: a pymalloc block, not a malloc
        for i in range(BIG_COUNT):
            fresh[i] = bytearray(BIG_SIZE)  # alloc: big
        kept = fresh  # the previous round's buffers are freed here
    return kept


def small_objects(slots):
    lengths = SMALL_LENGTHS
    for i in range(len(slots)):
        slots[i] = bytes(lengths[i % 3])  # alloc: small


def ready(wait):
    """Prints `ready PID` on stderr; with `wait`, then waits for SIGUSR1 (blocked first, so
    that one sent as soon as the line is read is not lost)."""
    if wait:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    if wait:
        signal.sigwait({signal.SIGUSR1})


class MallocStats:
    """sys._debugmallocstats() snapshots, written by C to fd 2, captured in a file."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        self.marks = []

    def snapshot(self):
        sys.stderr.flush()
        start = os.lseek(self.file.fileno(), 0, os.SEEK_END)
        os.dup2(self.file.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(self.saved, 2)
        self.marks.append(start)

    def parse(self):
        """(arenas allocated total, arenas reclaimed, arena size) of each snapshot."""
        self.file.seek(0)
        text = self.file.read().decode()
        ends = self.marks[1:] + [len(text)]
        return [parse_stats(text[a:b]) for a, b in zip(self.marks, ends)]


def parse_stats(text):
    total = reclaimed = size = None
    for line in text.splitlines():
        if line.startswith("# arenas allocated total"):
            total = int(line.split("=")[1].replace(",", ""))
        elif line.startswith("# arenas reclaimed"):
            reclaimed = int(line.split("=")[1].replace(",", ""))
        elif " bytes/arena" in line:
            size = int(line.split("*")[1].split("bytes/arena")[0])
    if None in (total, reclaimed, size):
        raise SystemExit(f"py_alloc.py: cannot read sys._debugmallocstats():\n{text}")
    return total, reclaimed, size


def bench_unit():
    """One unit of the benchmark's work: ~0.9 ms alone on CPython 3.12 here, ~145 calls of the
    malloc family (and their frees): 1000 small dicts, lists and strs (pymalloc), the list
    that holds them growing by realloc, a ~10 KB str, 100 bytes objects of 2-5.5 KB and a
    256 KiB bytearray (malloc); everything is freed when it returns."""
    rows = []
    for i in range(1000):
        rows.append({"id": i, "name": "item-%d" % i, "tags": [i, i + 1, i + 2]})
    text = ",".join([r["name"] for r in rows])
    blobs = [bytes(2048 + (i % 8) * 512) for i in range(100)]
    big = bytearray(256 * 1024)
    return len(rows) + len(text) + len(blobs) + len(big)


def malloc_unit():
    """One unit of the malloc-heavy benchmark: 1000 bytes objects of 600 to 3999 bytes, each made
    and freed at once: 1000 malloc and 1000 free calls (bytes(n) asks PyObject_Malloc for n + 33
    bytes, which hands requests over 512 bytes to the C library), little else."""
    n = 0
    for i in range(1000):
        n += len(bytes(600 + (i * 37) % 3400))
    return n


def bench(units, unit=bench_unit):
    """The allocation benchmark's target: prints its pid on stdout, waits for a byte on stdin
    (so that a profiler attaches before the work starts), runs `units` units of bench_unit()
    and prints one JSON line: the loop's wall time (perf_counter) and CPU time (process_time,
    user + system: the time a uprobe's trap takes in the kernel is in it) and the process's
    CPU time until then (getrusage). It exits normally (a profiler inside the process, such as
    memray, writes its results at exit)."""
    print(os.getpid(), flush=True)
    if sys.stdin.buffer.read(1) != b"g":
        sys.exit("py_alloc.py --bench: no go byte on stdin")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    n = 0
    for _ in range(units):
        n += unit()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "units": units,
                "loop_wall": wall,
                "loop_cpu": cpu,
                "process_cpu": usage.ru_utime + usage.ru_stime,
                "python": platform.python_version(),
                "check": n,
            }
        ),
        flush=True,
    )


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--bench":
        bench(int(sys.argv[2]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--bench-malloc":
        bench(int(sys.argv[2]), malloc_unit)
        return
    args = sys.argv[1:]
    wait = args[:1] == ["--wait"]
    if wait:
        args = args[1:]
    small_mib = float(args[0]) if len(args) > 0 else 320.0
    rounds = int(args[1]) if len(args) > 1 else 5
    if small_mib <= 0 or rounds < 1 or len(args) > 2:
        sys.exit("usage: py_alloc.py [--wait] [SMALL_MIB [ROUNDS]]  (SMALL_MIB > 0, ROUNDS >= 1)")
    ready(wait)
    per_cycle = sum(n + 33 for n in SMALL_LENGTHS)
    count = 3 * int(small_mib * (1 << 20) / per_cycle)
    stats = MallocStats()

    stats.snapshot()
    kept = big_buffers(rounds)
    stats.snapshot()

    slots = [None] * count  # a malloc of count x 8 bytes, in main
    stats.snapshot()
    small_objects(slots)
    stats.snapshot()

    (b0, _, size), (b1, _, _), (s0, r0, _), (s1, r1, _) = stats.parse()
    getsizeof_bytes = sum(sys.getsizeof(o) for o in slots)
    calls = rounds * BIG_COUNT
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "python": platform.python_version(),
                "arena_size": size,
                "big_buffers": {
                    "calls": calls,
                    "malloc_size": BIG_SIZE + 1,
                    "malloc_bytes": calls * (BIG_SIZE + 1),
                    "kept": len(kept),
                    "kept_bytes": len(kept) * (BIG_SIZE + 1),
                    "arenas": b1 - b0,
                    "arena_bytes": (b1 - b0) * size,
                },
                "small_objects": {
                    "objects": count,
                    "getsizeof_bytes": getsizeof_bytes,
                    "malloc_bytes": 0,
                    "arenas": s1 - s0,
                    "arena_bytes": (s1 - s0) * size,
                    "reclaimed": r1 - r0,
                },
            }
        ),
        flush=True,
    )
    # Ends without the interpreter's finalization, which would free what the
    # functions kept: it stays allocated until the process is gone.
    os._exit(0)


main()
