# Three steps of a Python program, as a CI benchmark of it would run them: parse_input
# (about 25% of the CPU time), compute_scores (50%) and render_output (25%), each
# busy in the interpreter's own string, integer and dict code. `--slow render_output`
# gives that step twice the work (25% -> 40% of the time). The work is a fixed number
# of rounds: the run takes as much CPU time whatever the machine's load.
#
# Usage: python3 py_steps.py ROUNDS [--slow STEP]
import sys


def parse_input(n):
    total = 0
    for i in range(n):
        fields = ("%d,%d,%d" % (i, i * 7, i * 13)).split(",")
        total += int(fields[0]) + int(fields[1]) + int(fields[2])
    return total


def compute_scores(n):
    scores = {}
    x = 1
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        scores[i & 255] = scores.get(i & 255, 0) + (x >> 40)
    return sum(scores.values())


def render_output(n):
    out = []
    for i in range(n):
        out.append("<td class=%r>%s</td>" % ("row%d" % (i & 7), str(i).rjust(8)))
    return len("".join(out))


def main():
    rounds = int(sys.argv[1])
    slow = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--slow" else None
    # Units of work per round giving about 25/50/25 of the CPU time on CPython 3.11.
    work = {"parse_input": 170, "compute_scores": 1000, "render_output": 430}
    if slow:
        work[slow] *= 2
    done = 0
    for _ in range(rounds):
        done += parse_input(work["parse_input"])
        done += compute_scores(work["compute_scores"])
        done += render_output(work["render_output"])
    print(done)


main()
