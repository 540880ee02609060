# Writes in-place.mlir's input x.npy, empty.safetensors (no parameters) and
# want.npy: silu(x) * x + silu(x) in numpy.
import sys

import numpy as np

from parax.checkpoint import save_safetensors

out = sys.argv[1]
x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
a = x / (1 + np.exp(-x))
np.save(f"{out}/x.npy", x)
np.save(f"{out}/want.npy", a * x + a)
save_safetensors(f"{out}/empty.safetensors", {})
