#!/usr/bin/env bash
# One-rank CPU prefill (not a test): a dense Llama and a Mixtral-shaped MoE
# (2 layers, hidden 1024, FFN 2816, 8 experts, top-2; fp32, logits of the
# last position), one prompt of S tokens, `--steps 3`; rounds side by side,
# medians printed.
#
#   bench/prefill.sh [build-dir] [rounds] [tokens]
BENCH=prefill-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
seq="${3:-512}"

for kind in llama mixtral; do
  cat > "$work/$kind.json" <<JSON
{"model_type": "$kind", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2,
 "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 8192, "num_local_experts": 8,
 "num_experts_per_tok": 2, "max_position_embeddings": $seq, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
JSON
  "$py" -m parax.models "$work/$kind.json" --batch 1 --seq "$seq" --dtype f32 --last-logits -o "$work/$kind.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$kind.mlir" -o "$work/$kind.pxe"
done
"$py" - "$work" "$seq" <<'PY'
import sys
import numpy as np
from parax.checkpoint import random_weights, save_safetensors
from parax.models import load_config
work, seq = sys.argv[1], int(sys.argv[2])
for kind in ("llama", "mixtral"):
    save_safetensors(f"{work}/{kind}.safetensors", random_weights(load_config(f"{work}/{kind}.json"), seed=1))
np.save(f"{work}/prompt.npy", np.random.default_rng(2).integers(0, 8192, size=(1, seq)).astype(np.int32))
PY
for round in $(seq "$rounds"); do
  line="round $round:"
  for kind in llama mixtral; do
    ms="$(timeout 600 "$build/bin/parax-run" "$work/$kind.pxe" --weights "$work/$kind.safetensors" \
            --input "$work/prompt.npy" --steps 3 | sed -E 's/.*step time ([0-9.]+) ms.*/\1/')"
    line="$line $kind $ms ms"
    echo "$kind $ms" >> "$work/figures"
  done
  echo "$line"
done
"$py" - "$work/figures" "$seq" <<'PY'
import sys
from collections import defaultdict
import numpy as np
times = defaultdict(list)
for line in open(sys.argv[1]):
    kind, ms = line.split()
    times[kind].append(float(ms))
print(f"medians, a prompt of {sys.argv[2]} tokens on one rank: " +
      ", ".join(f"{kind} {np.median(v):.1f} ms" for kind, v in times.items()))
PY
