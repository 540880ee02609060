# compare.py GOT.npy WANT.npy TOL: prints "match" or the largest difference.
import sys

import numpy as np

got, want = np.load(sys.argv[1]), np.load(sys.argv[2])
diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
print("match" if diff < float(sys.argv[3]) else f"differ: {got.shape} vs {want.shape}, {diff}")
