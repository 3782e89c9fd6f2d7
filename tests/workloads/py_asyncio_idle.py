# An asyncio event loop that is mostly idle: three tasks, each doing ~3 ms of CPU work in
# `task_work` then `await asyncio.sleep(0.02)`, for SECONDS. The loop waits in its selector
# (BaseEventLoop._run_once -> selector.select -> epoll_wait) up to two thirds of the time, with no
# task's code on the stack: the off-CPU tests check that this wait is named `asyncio_idle`.
#
# Usage: python3 py_asyncio_idle.py SECONDS
import asyncio
import sys
import time


def task_work(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


async def task(end):
    while time.monotonic() < end:
        task_work(0.003)
        await asyncio.sleep(0.02)


async def main(seconds):
    end = time.monotonic() + seconds
    await asyncio.gather(*(task(end) for _ in range(3)))


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
