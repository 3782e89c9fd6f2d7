# Python call shapes whose callers a profiler must keep: the main thread
# rotates, every ~20 ms, between
#   generator: run_generators -> consumer -> gen_producer (a generator being
#              iterated; its body spins)
#   asyncio:   run_coroutines -> asyncio.run(...) -> ... -> main -> coro_outer
#              -> coro_inner (awaited coroutines; coro_inner spins)
#   callback:  run_callbacks -> sort_caller -> sorted() (C) -> slow_key (the
#              key function, called from C code, spins)
#   syscalls:  run_syscalls -> read_zeros -> os.read (C) -> read(2) of
#              /dev/zero (mostly kernel time, below native frames)
#
# Usage: python3 py_shapes.py SECONDS
#
# Prints `ready PID` on stderr when it starts.
import asyncio
import os
import sys
import time


def burn(n):
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
    return x


def gen_producer(end):
    i = 0
    while time.monotonic() < end:
        x = 1
        for _ in range(300):
            x = (x * 69069 + 1) % 4294967296
        i += 1
        yield x


def consumer(end):
    total = 0
    for value in gen_producer(end):
        total ^= value
    return total


def run_generators(end):
    return consumer(end)


async def coro_inner(end):
    while time.monotonic() < end:
        x = 1
        for _ in range(300):
            x = (x * 48271 + 11) % 2147483647
        await asyncio.sleep(0)


async def coro_outer(end):
    await coro_inner(end)


async def main(end):
    await coro_outer(end)


def run_coroutines(end):
    asyncio.run(main(end))


def slow_key(value):
    x = value
    for _ in range(300):
        x = (x * 16807 + 5) % 2147483647
    return x


def sort_caller(end):
    data = list(range(64))
    while time.monotonic() < end:
        data = sorted(data, key=slow_key)
    return data


def run_callbacks(end):
    return sort_caller(end)


def read_zeros(end):
    fd = os.open("/dev/zero", os.O_RDONLY)
    try:
        while time.monotonic() < end:
            os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def run_syscalls(end):
    return read_zeros(end)


def drive(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        run_generators(time.monotonic() + 0.02)
        run_coroutines(time.monotonic() + 0.02)
        run_callbacks(time.monotonic() + 0.02)
        run_syscalls(time.monotonic() + 0.02)


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    print("ready", os.getpid(), file=sys.stderr, flush=True)
    drive(seconds)
