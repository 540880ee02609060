"""The experts op's time (ms, --explain's op lines) of a skewed plan over a
balanced one's, less the 7 launches of 2 us each (not scaled), for EP2
and TP2."""
import re
import sys


def experts(path):
    times = [float(m.group(1)) for m in re.finditer(r"parax\.experts\s+\S+\s+([0-9.]+)", open(path).read())]
    assert times, path
    return times[0]


launches = 7 * 2e-3
ep_b, ep_s, tp_b, tp_s = (experts(p) for p in sys.argv[1:5])
print("ep2 ratio %.3f" % ((ep_s - launches) / (ep_b - launches)))
print("tp2 ratio %.3f" % ((tp_s - launches) / (tp_b - launches)))
