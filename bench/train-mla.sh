#!/usr/bin/env bash
# A DeepSeek-V3-shaped training step on CPU ranks (not a test): multi-head
# latent attention (16 heads, query rank 256, key-value rank 128, heads of
# 64 + 32 RoPE), one dense layer and one of 8 routed experts and a shared
# one (hidden 512, fp32), over 2 sequences of 512 tokens, on one rank and
# over two with tensor parallelism (heads split; the backward keeps the
# heads' gradients in each rank's heads). Side by side in rounds; prints
# each run's step time, then the medians and the ratio.
#
#   bench/train-mla.sh [build-dir] [rounds]
BENCH=train-mla-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cat > "$work/config.json" <<JSON
{"model_type": "deepseek_v3", "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256,
 "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 16, "num_key_value_heads": 16,
 "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
 "vocab_size": 8192, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
 "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
 "norm_topk_prob": true, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false}
JSON
"$py" -c 'import sys; from parax.checkpoint import random_weights, save_safetensors; from parax.models import load_config; save_safetensors(sys.argv[1] + "/w.safetensors", random_weights(load_config(sys.argv[1] + "/config.json"), seed=1))' "$work"
tokens tokens 2 512 2
tokens labels 2 512 3
"$py" -m parax.models "$work/config.json" --batch 2 --seq 512 --dtype f32 --loss -o "$work/loss.mlir"
"$build/bin/parax-opt" "$work/loss.mlir" --parax-autodiff -o "$work/single.mlir"
"$build/bin/parax-translate" --to-executable "$work/single.mlir" -o "$work/single.pxe"
cluster="$root/python/parax/oracle-cluster.json:devices_per_node=2"
"$build/bin/parax-opt" "$work/loss.mlir" --parax-plan="cluster=$cluster workload=train:batch=2,seq=512,tp=2,dp=1,pp=1" \
  --parax-autodiff --parax-partition -o "$work/tp2.mlir"
"$build/bin/parax-translate" --to-executable "$work/tp2.mlir" -o "$work/tp2.pxe"
echo "TP2 program: $(grep -oE 'parax\.(all_gather|all_reduce|reduce_scatter|all_to_all)' "$work/tp2.mlir" | sort | uniq -c | tr -s ' \n' ' ')"

for round in $(seq "$rounds"); do
  one="$(train_step 1 "$work/single.pxe")"
  tp="$(train_step 2 "$work/tp2.pxe")"
  echo "round $round: training step: 1 rank $one ms, TP2 $tp ms"
  echo "$one $tp" >> "$work/figures"
done
"$py" - "$work/figures" <<'PY'
import sys
import numpy as np
one, tp = np.median(np.loadtxt(sys.argv[1], ndmin=2), axis=0)
print(f"medians, 1,024 tokens: training step on 1 rank {one:.1f} ms, TP2 {tp:.1f} ms ({one / tp:.2f}x one rank)")
PY
