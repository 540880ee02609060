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
config_weights
tokens tokens 2 512 2
tokens labels 2 512 3
"$py" -m parax.models "$work/config.json" --batch 2 --seq 512 --dtype f32 --loss -o "$work/loss.mlir"
training_program single -
training_program tp2 train:batch=2,seq=512,tp=2,dp=1,pp=1
echo "TP2 program: $(grep -oE 'parax\.(all_gather|all_reduce|reduce_scatter|all_to_all)' "$work/tp2.mlir" | sort | uniq -c | tr -s ' \n' ' ')"

for round in $(seq "$rounds"); do
  one="$(train_step 1 "$work/single.pxe")"
  tp="$(train_step 2 "$work/tp2.pxe")"
  echo "round $round: training step: 1 rank $one ms, TP2 $tp ms"
  echo "$one $tp" >> "$work/figures"
done
read -r one tp <<< "$(medians "$work/figures")"
awk -v one="$one" -v tp="$tp" 'BEGIN { printf "medians, 1,024 tokens: training step on 1 rank %.1f ms, TP2 %.1f ms (%.2fx one rank)\n", one, tp, one / tp }'
