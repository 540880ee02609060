"""The step's compute (ms, --explain's step line) of the second plan less
the first's."""
import re
import sys


def compute(path):
    found = re.search(r"^  step [0-9.]+ ms = compute ([0-9.]+)", open(path).read(), re.M)
    assert found, path
    return float(found.group(1))


print("compute delta %.3f ms" % (compute(sys.argv[2]) - compute(sys.argv[1])))
