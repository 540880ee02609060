"""A decode step of one sequence on the CPU (not a test): parax-run's
generation loop against transformers on PyTorch, the same model and
weights (issue 46's Llama: hidden 1024, GQA 8/2, FFN 2816, 4 layers,
vocabulary 32,000, fp32), one thread each on the same core, interleaved
rounds; prints each side's median step and the ratio (parax / PyTorch).

    .venv/bin/python bench/decode_vs_pytorch.py [--build build] [--rounds 3] [--core 1]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5}
PROMPT, STEPS = 32, 32

PYTORCH_STEP = r"""
import sys, time, statistics, numpy as np, torch, transformers
torch.set_num_threads(1)
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32,
                                                      attn_implementation="sdpa").eval()
ids = torch.tensor(np.load(sys.argv[2]), dtype=torch.long)
times = []
with torch.no_grad():
    out = m(ids, use_cache=True)
    for _ in range(int(sys.argv[3])):
        tok = out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        out = m(tok, past_key_values=out.past_key_values, use_cache=True)
        times.append(time.perf_counter() - t)
print(f"step {statistics.median(times) * 1e3:.3f} ms")
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", default="1")
    args = parser.parse_args()
    import numpy as np
    from parax.checkpoint import random_weights, save_pretrained, save_safetensors
    from parax.models import build_model, load_config
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        cfg = load_config(os.path.join(tmp, "config.json"))
        weights = random_weights(cfg)
        save_safetensors(os.path.join(tmp, "w.safetensors"), weights)
        save_pretrained(os.path.join(tmp, "hf"), CONFIG, weights)
        prompt = os.path.join(tmp, "prompt.npy")
        np.save(prompt, np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (1, PROMPT)).astype(np.int32))
        with open(os.path.join(tmp, "step.mlir"), "w") as f:
            f.write(build_model(cfg, batch=1, seq=1, cache=PROMPT + STEPS, dtype="f32"))
        exe = os.path.join(tmp, "step.pxe")
        subprocess.run([os.path.join(args.build, "bin", "parax-translate"), "--to-executable",
                        os.path.join(tmp, "step.mlir"), "-o", exe], check=True, timeout=300)
        pin = ["taskset", "-c", args.core]
        parax, torch_ = [], []
        for _ in range(args.rounds):
            out = subprocess.run(pin + [os.path.join(args.build, "bin", "parax-run"), exe, "--weights",
                                        os.path.join(tmp, "w.safetensors"), "--input", prompt,
                                        "--generate", str(STEPS)],
                                 capture_output=True, text=True, timeout=600, env=env, check=True)
            parax.append(float(re.search(r"step time ([0-9.]+) ms", out.stdout + out.stderr).group(1)))
            out = subprocess.run(pin + [sys.executable, "-c", PYTORCH_STEP, os.path.join(tmp, "hf"), prompt,
                                        str(STEPS)], capture_output=True, text=True, timeout=600, env=env,
                                 check=True)
            torch_.append(float(re.search(r"step ([0-9.]+) ms", out.stdout).group(1)))
    p, t = statistics.median(parax), statistics.median(torch_)
    print(f"parax-run {p:.2f} ms, transformers {t:.2f} ms a decode step (medians of {args.rounds} rounds); "
          f"parax / PyTorch = {p / t:.2f}")


if __name__ == "__main__":
    main()
