# A Python process with a known stack, for the CPython frame-walk tests:
# <module> -> outer_a -> K.middle_b -> inner_c -> time.sleep (C).
# It prints "ready" once the stack is in place and sleeps, so readers can inspect it.
import time


def inner_c():
    print("ready", flush=True)
    time.sleep(30)


class K:
    def middle_b(self):
        inner_c()


def outer_a():
    K().middle_b()


outer_a()
