# Writes inputs for the cross-entropy lit tests: logits.npy, labels.npy
# (valid), bad-labels.npy (token 4's label is 10, outside a vocabulary of
# 10), empty.safetensors and want.npy (numpy's mean cross-entropy).
import sys

import numpy as np

from parax.checkpoint import save_safetensors

out = sys.argv[1]
rng = np.random.default_rng(0)
logits = rng.standard_normal((2, 3, 10)).astype(np.float32)
labels = rng.integers(0, 10, (2, 3)).astype(np.int32)
np.save(f"{out}/logits.npy", logits)
np.save(f"{out}/labels.npy", labels)
bad = labels.copy()
bad.flat[4] = 10
np.save(f"{out}/bad-labels.npy", bad)
flat = logits.reshape(6, 10).astype(np.float64)
m = flat.max(axis=1, keepdims=True)
lse = np.log(np.exp(flat - m).sum(axis=1)) + m[:, 0]
np.save(f"{out}/want.npy", np.float32((lse - flat[np.arange(6), labels.ravel()]).mean()))
save_safetensors(f"{out}/empty.safetensors", {})
