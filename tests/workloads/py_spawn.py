# A Python parent that starts a Python child once it is running: the child is
# `py_split.py SECONDS` under the same interpreter, started after a short sleep
# so that it begins after any profiling session of the parent.
#
# Usage: python3 py_spawn.py SECONDS
import os
import subprocess
import sys
import time


def spawn_child(seconds):
    here = os.path.dirname(os.path.abspath(__file__))
    child = os.path.join(here, "py_split.py")
    return subprocess.run([sys.executable, child, str(seconds)], check=True)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    time.sleep(0.3)
    spawn_child(seconds)


main()
