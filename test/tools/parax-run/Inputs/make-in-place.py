# Writes the input x.npy of in-place.mlir and reshape-in-place.mlir,
# empty.safetensors (no parameters), and in numpy want.npy, silu(x) * x +
# silu(x), and want-reshape.npy, silu(silu(x)) flattened.
import sys

import numpy as np

from parax.checkpoint import save_safetensors

out = sys.argv[1]
x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
a = x / (1 + np.exp(-x))
np.save(f"{out}/x.npy", x)
np.save(f"{out}/want.npy", a * x + a)
np.save(f"{out}/want-reshape.npy", (a / (1 + np.exp(-a))).reshape(8))
save_safetensors(f"{out}/empty.safetensors", {})
