# A pre-fork server's shape (gunicorn, uwsgi, celery): a master that forks its workers at
# start and then only waits. Worker 1 computes all the time, worker 2 about half the time
# (bursts of work and sleep), so their CPU shares differ.
#
# Usage: python3 py_prefork.py SECONDS
#
# Prints `ready PID` (the master) and `workers PID1 PID2` on stderr once both run; the workers
# exit after SECONDS, the master when they have.
import os
import sys
import time


def busy(until, duty):
    x = 1
    while time.monotonic() < until:
        burst = time.monotonic() + 0.02 * duty
        while time.monotonic() < burst:
            for _ in range(2000):
                x = (x * 1103515245 + 12345) % 2147483648
        if duty < 1.0:
            time.sleep(0.02 * (1.0 - duty))
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    until = time.monotonic() + seconds
    workers = []
    for duty in (1.0, 0.5):
        pid = os.fork()
        if pid == 0:
            busy(until, duty)
            os._exit(0)
        workers.append(pid)
    print("workers", *workers, file=sys.stderr, flush=True)
    for pid in workers:
        os.waitpid(pid, 0)


main()
