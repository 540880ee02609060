#!/usr/bin/env bash
# DeepSeek-V3's multi-head latent attention, explicit against weight-absorbed
# (`--mla absorbed`), at its published widths (one dense layer: hidden 7168,
# 128 heads, latent 512, rope 64; bench/configs/deepseek-v3-attention-1layer.json):
# the device memory the CUDA backend allocates for a generation step of 8
# rows over caches of 4096 tokens (bf16), as the SIMT emulator's
# `parax-run-simt --steps 0` reports it (the CUDA backend's own allocations,
# prepared, not run), with the caches' share; then the absorbed step with an
# expanded prefill program, which lends it its weights and caches. Memory,
# not time: no rounds.
#
#   bench/mla-cache.sh [build-dir]
BENCH=mla-cache-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

config="$root/bench/configs/deepseek-v3-attention-1layer.json"
"$py" - "$config" "$work" <<'PY'
import sys
import numpy as np
from parax.checkpoint import save_safetensors
from parax.models import load_config
from parax.models.builder import parameter_shapes
cfg = load_config(sys.argv[1])
block = (0.02 * np.random.default_rng(0).standard_normal(1 << 20)).astype(np.float32)
weights = {name: np.ones(shape, np.float32) if "norm" in name else np.resize(block, shape)
           for name, shape in parameter_shapes(cfg).items()}
save_safetensors(sys.argv[2] + "/w.safetensors", weights, dtype="bf16")
np.save(sys.argv[2] + "/prompt.npy", np.ones((8, 4), np.int32))
PY
for form in explicit absorbed; do
  "$py" -m parax.models "$config" --batch 8 --seq 1 --cache 4096 --mla "$form" -o "$work/$form.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$form.mlir" -o "$work/$form.pxe"
  bytes="$(timeout 600 "$build/bin/parax-run-simt" "$work/$form.pxe" --device cuda --weights "$work/w.safetensors" \
    --input "$work/prompt.npy" --generate 4 --steps 0 | sed -nE 's/.* ([0-9]+) bytes of device memory.*/\1/p')"
  echo "$form $bytes" >> "$work/figures"
done
# The absorbed step with a prefill of the explicit form's attention over
# the latent cache (`--mla expanded`, 4 tokens a chunk): the step takes its
# weights from the prefill program, kv_b_proj's key and value pieces as
# blocks of the prefill's whole tensor, and its caches.
"$py" -m parax.models "$config" --batch 8 --seq 4 --cache 4096 --mla expanded -o "$work/expanded.mlir"
"$build/bin/parax-translate" --to-executable "$work/expanded.mlir" -o "$work/expanded.pxe"
timeout 600 "$build/bin/parax-run-simt" "$work/absorbed.pxe" --prefill "$work/expanded.pxe" --device cuda \
  --weights "$work/w.safetensors" --input "$work/prompt.npy" --generate 4 --steps 0 > "$work/prefill.log" 2>&1
sed -nE 's/.* ([0-9]+) bytes of device memory.*/both \1/p' "$work/prefill.log" >> "$work/figures"
sed -nE 's/.* ([0-9]+ of [0-9]+ parameter\(s\) and [0-9]+ KV cache\(s\) shared with the prefill program).*/\1/p' \
  "$work/prefill.log" > "$work/shared"
"$py" - "$work/figures" "$work/shared" <<'PY'
import sys
bytes_of = dict((form, int(b)) for form, b in (line.split() for line in open(sys.argv[1])))
# Cache values a token: 128 heads x (192 key + 128 value), or one latent row of 576.
caches = {"explicit": 8 * 4096 * 128 * (192 + 128) * 2, "absorbed": 8 * 4096 * 576 * 2}
for form, total in ((f, bytes_of[f]) for f in caches):
    print(f"{form:9s}: {total / 1e9:.3f} GB of device memory (measured), of which the KV caches "
          f"{caches[form] / 1e9:.3f} GB (their shapes)")
print(f"absorbed / explicit: {bytes_of['absorbed'] / bytes_of['explicit']:.3f} of the memory, "
      f"caches {caches['explicit'] / caches['absorbed']:.1f}x smaller")
shared = open(sys.argv[2]).read().strip()
kv_b = 128 * 256 * 512 * 2  # kv_b_proj, bf16: held once
print(f"absorbed step + expanded prefill: {bytes_of['both'] / 1e9:.3f} GB of device memory (measured: "
      f"{shared}, kv_b_proj's {kv_b / 1e6:.1f} MB held once; the prefill adds "
      f"{(bytes_of['both'] - bytes_of['absorbed']) / 1e9:.3f} GB, its temporaries: every cached latent "
      f"expanded per head)")
PY
