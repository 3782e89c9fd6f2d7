# bench_py_stack: a fixed amount of pure-Python CPU work at a Python stack depth of exactly 50
# frames, for `cargo xtask bench`:
#
#   <module> -> f0 -> f1 -> ... -> f48       (1 + 49 = 50 frames, 49 distinct functions)
#
# f48, the innermost, runs UNITS x 100000 iterations of an integer LCG in pure Python (a fixed
# number of iterations, not a fixed time, so its CPU time alone and under a profiler can be
# compared). The work is started from module level, so there is no main() frame.
#
# Like fixed_work it prints its pid on stdout, then waits for one byte (or EOF) on stdin before
# it starts, so the profiler can attach first.
#
# With BENCH_PY_SHALLOW=1 the module calls f48 itself: a 2-frame stack, for the cost of a
# session on a shallow stack (`cargo xtask bench --only session`).
#
# Usage: python3 bench_py_stack.py [UNITS]   (default 1000)
import os
import sys

UNIT_ITERATIONS = 100000


def f48(units):
    x = 1
    for _ in range(units):
        for _ in range(UNIT_ITERATIONS):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def f0(units):
    return f1(units)


def f1(units):
    return f2(units)


def f2(units):
    return f3(units)


def f3(units):
    return f4(units)


def f4(units):
    return f5(units)


def f5(units):
    return f6(units)


def f6(units):
    return f7(units)


def f7(units):
    return f8(units)


def f8(units):
    return f9(units)


def f9(units):
    return f10(units)


def f10(units):
    return f11(units)


def f11(units):
    return f12(units)


def f12(units):
    return f13(units)


def f13(units):
    return f14(units)


def f14(units):
    return f15(units)


def f15(units):
    return f16(units)


def f16(units):
    return f17(units)


def f17(units):
    return f18(units)


def f18(units):
    return f19(units)


def f19(units):
    return f20(units)


def f20(units):
    return f21(units)


def f21(units):
    return f22(units)


def f22(units):
    return f23(units)


def f23(units):
    return f24(units)


def f24(units):
    return f25(units)


def f25(units):
    return f26(units)


def f26(units):
    return f27(units)


def f27(units):
    return f28(units)


def f28(units):
    return f29(units)


def f29(units):
    return f30(units)


def f30(units):
    return f31(units)


def f31(units):
    return f32(units)


def f32(units):
    return f33(units)


def f33(units):
    return f34(units)


def f34(units):
    return f35(units)


def f35(units):
    return f36(units)


def f36(units):
    return f37(units)


def f37(units):
    return f38(units)


def f38(units):
    return f39(units)


def f39(units):
    return f40(units)


def f40(units):
    return f41(units)


def f41(units):
    return f42(units)


def f42(units):
    return f43(units)


def f43(units):
    return f44(units)


def f44(units):
    return f45(units)


def f45(units):
    return f46(units)


def f46(units):
    return f47(units)


def f47(units):
    return f48(units)


# Run as a script (bench_py_span.py imports the functions: no `if` block adds a frame).
if __name__ == "__main__":
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    if units <= 0:
        sys.exit(f"usage: {sys.argv[0]} [UNITS]  (UNITS > 0)")
    print(os.getpid(), flush=True)
    sys.stdin.buffer.read(1)
    if os.environ.get("BENCH_PY_SHALLOW") == "1":
        f48(units)
    else:
        f0(units)
