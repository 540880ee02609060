"""The check users trust: parax's single-rank output against Hugging Face
`transformers` (PyPI) loading the very same safetensors checkpoint (with a
config.json) through `AutoModelForCausalLM.from_pretrained`, for every family
it implements here. DeepSeek-V3 is not in the pinned transformers 4.46.3.

Tolerance: 1e-4 absolute on fp32 logits.
"""

import os

import numpy as np
import pytest

from conftest import Model
from parax.checkpoint import save_pretrained
from parax.models.presets import PRESETS

torch = pytest.importorskip("torch") if os.environ.get("PARAX_REQUIRE_TRANSFORMERS") != "1" \
    else __import__("torch")
transformers = pytest.importorskip("transformers") \
    if os.environ.get("PARAX_REQUIRE_TRANSFORMERS") != "1" else __import__("transformers")

TOL = 1e-4


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe"])
def test_parax_matches_transformers(tmp_path, preset):
    model = Model(str(tmp_path), preset)
    directory = str(tmp_path / "hf")
    save_pretrained(directory, PRESETS[preset], model.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        expected = hf(torch.tensor(model.tokens, dtype=torch.long)).logits.numpy()
    logits = model.run(model.compile("single"), 1)
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() < TOL
    # And the numpy reference agrees with transformers too.
    assert np.abs(model.reference() - expected).max() < TOL
