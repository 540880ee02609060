# Writes q.npy (one [1, 2, 1, 2048] tensor, used as q, k and v) and
# empty.safetensors for the wide-attention lit test.
import sys

import numpy as np

from parax.checkpoint import save_safetensors

out = sys.argv[1]
np.save(f"{out}/q.npy", np.ones((1, 2, 1, 2048), np.float32))
save_safetensors(f"{out}/empty.safetensors", {})
