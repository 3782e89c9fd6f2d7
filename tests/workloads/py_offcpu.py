# A Python workload whose main thread spends known times off CPU for known
# reasons, and a known CPU time on CPU, for the off-CPU tests.
#
# Usage: python3 py_offcpu.py [ROUNDS]   (default 5)
#
# Each round the main thread (under run_rounds):
# - sleeper(): time.sleep(0.1)                         -> blocked, reason sleep;
# - wait_lock(): acquires a threading.Lock that the holder thread took just
#   before and releases after a time.sleep(0.1) of its own -> blocked ~0.1 s,
#   reason lock;
# - spin(): ~0.1 s of CPU time in pure Python (measured with
#   time.thread_time(), so preemption does not shorten it).
# The holder thread (function holder) waits for the main thread's signal on a
# threading.Event, takes the lock, sleeps 0.1 s, releases the lock and goes
# back to waiting on the Event: when the main thread wakes up with the lock,
# the holder is already blocked, so the main thread does not then wait long for
# the GIL. Nothing else runs: every wait of the main thread but the hand-overs
# (microseconds) is in sleeper or wait_lock.
#
# Each wait and spin is measured around the call (time.monotonic(), and
# time.thread_time() for spin's CPU time). It prints `ready PID` on stderr at
# start and, when done, one JSON line on stdout:
#   {"rounds": N, "pid": PID,
#    "tids": {"main": TID, "holder": TID},            (threading.get_native_id)
#    "seconds": {"sleep": S, "lock": S, "spin": CPU S, "spin_wall": S,
#                "hold": S},                           (totals over the rounds;
#                                                       hold: the holder's sleeps)
#    "wall": {"rounds": S, "holder": S, "process": S}}
# wall.rounds is run_rounds's wall time (time.monotonic() around it), wall.holder
# the holder thread's (around its function), wall.process the process's age at
# the end (CLOCK_BOOTTIME less the start time of /proc/self/stat, 10 ms
# resolution).
import json
import os
import sys
import threading
import time

SLEEP = 0.1
HOLD = 0.1
SPIN_CPU = 0.1


def sleeper():
    time.sleep(SLEEP)


def wait_lock(lock):
    lock.acquire()
    lock.release()


def spin():
    # Checks the CPU clock every ~0.1 ms of work (each check is a system call).
    start = time.thread_time()
    x = 1
    while time.thread_time() - start < SPIN_CPU:
        for _ in range(1000):
            x = (x * 1103515245 + 12345) % 2147483648
    return x


def holder(lock, go, held, rounds, out):
    t0 = time.monotonic()
    out["tid"] = threading.get_native_id()
    hold = 0.0
    for _ in range(rounds):
        go.wait()
        go.clear()
        lock.acquire()
        held.set()
        h0 = time.monotonic()
        time.sleep(HOLD)
        hold += time.monotonic() - h0
        lock.release()
    out["hold"] = hold
    out["wall"] = time.monotonic() - t0


def run_rounds(rounds, lock, go, held):
    totals = {"sleep": 0.0, "lock": 0.0, "spin": 0.0, "spin_wall": 0.0}
    for _ in range(rounds):
        t0 = time.monotonic()
        sleeper()
        totals["sleep"] += time.monotonic() - t0

        go.set()
        held.wait()
        held.clear()
        t0 = time.monotonic()
        wait_lock(lock)
        totals["lock"] += time.monotonic() - t0

        t0 = time.monotonic()
        c0 = time.thread_time()
        spin()
        totals["spin"] += time.thread_time() - c0
        totals["spin_wall"] += time.monotonic() - t0
    return totals


def process_age():
    with open("/proc/self/stat") as f:
        # The command name may hold spaces and parentheses: fields after the last ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22, starttime
    ticks = os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / ticks


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    if rounds < 1:
        sys.exit("usage: py_offcpu.py [ROUNDS]  (ROUNDS >= 1)")
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    lock = threading.Lock()
    go = threading.Event()
    held = threading.Event()
    holder_out = {}
    thread = threading.Thread(
        name="holder", target=holder, args=(lock, go, held, rounds, holder_out)
    )
    thread.start()
    t0 = time.monotonic()
    totals = run_rounds(rounds, lock, go, held)
    rounds_wall = time.monotonic() - t0
    thread.join()
    totals["hold"] = holder_out["hold"]
    print(
        json.dumps(
            {
                "rounds": rounds,
                "pid": os.getpid(),
                "tids": {"main": threading.get_native_id(), "holder": holder_out["tid"]},
                "seconds": totals,
                "wall": {
                    "rounds": rounds_wall,
                    "holder": holder_out["wall"],
                    "process": process_age(),
                },
            }
        ),
        flush=True,
    )


main()
