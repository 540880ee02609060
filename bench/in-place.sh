#!/usr/bin/env bash
# Temporaries written in an operand's memory on the CUDA backend (docs/cuda.md,
# "Results in place"), side by side with PARAX_CUDA_IN_PLACE=0, as the SIMT
# emulator's `parax-run-simt --steps 0` reports it (the CUDA backend's own
# allocations, prepared, not run): a Llama prefill (hidden 1024, 2 layers,
# vocabulary 8192, bf16, 4 x 512) and a training step of a Llama whose
# embedding is tied to its head (vocabulary 16,384 x hidden 512, 2 layers,
# bf16, 2 x 128), and the same untied. Memory, not time: no rounds.
#
#   bench/in-place.sh [build-dir]
BENCH=in-place-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$py" - "$work" <<'PY'
import json, sys
import numpy as np
from parax.checkpoint import save_safetensors
from parax.models import build_model, load_config
from parax.models.builder import parameter_shapes
work = sys.argv[1]
def model(name, vocab, hidden, ffn, batch, seq, tied, loss):
    with open(f"{work}/{name}.json", "w") as f:
        json.dump({"model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": 2,
                   "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": vocab,
                   "max_position_embeddings": seq, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "tie_word_embeddings": tied}, f)
    cfg = load_config(f"{work}/{name}.json")
    with open(f"{work}/{name}.mlir", "w") as f:
        f.write(build_model(cfg, batch=batch, seq=seq, dtype="bf16", loss=loss))
    save_safetensors(f"{work}/{name}.safetensors",
                     {k: np.full(s, 0.01, np.float32) for k, s in parameter_shapes(cfg).items()}, dtype="bf16")
    np.save(f"{work}/{name}-tokens.npy", np.zeros((batch, seq), np.int32))
model("prefill", 8192, 1024, 3584, 4, 512, False, False)
model("tied", 16384, 512, 1536, 2, 128, True, True)
model("untied", 16384, 512, 1536, 2, 128, False, True)
PY
cluster="dgx-h100:devices_per_node=1"
"$build/bin/parax-opt" "$work/prefill.mlir" "--parax-plan=cluster=$cluster workload=prefill:batch=4,seq=512" \
  --parax-partition -o "$work/prefill-planned.mlir"
"$build/bin/parax-translate" --to-executable "$work/prefill-planned.mlir" -o "$work/prefill.pxe"
for name in tied untied; do
  "$build/bin/parax-opt" "$work/$name.mlir" \
    "--parax-plan=cluster=$cluster workload=train:batch=2,seq=128,dp=1,tp=1,pp=1,cp=1,zero=0,recompute=none" \
    --parax-autodiff --parax-partition -o "$work/$name-planned.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$name-planned.mlir" -o "$work/$name.pxe"
done
for name in prefill tied untied; do
  inputs=(--input "$work/$name-tokens.npy")
  [ "$name" = prefill ] || inputs+=(--input "$work/$name-tokens.npy") # (labels)
  for in_place in 0 1; do
    line="$(PARAX_CUDA_IN_PLACE=$in_place timeout 600 "$build/bin/parax-run-simt" "$work/$name.pxe" --device cuda \
      --weights "$work/$name.safetensors" "${inputs[@]}" --steps 0)"
    echo "$name PARAX_CUDA_IN_PLACE=$in_place: $(sed -nE 's/.* ([0-9]+ bytes of device memory.*)/\1/p' <<< "$line")"
  done
done
