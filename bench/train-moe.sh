#!/usr/bin/env bash
# A mixture-of-experts training step on CPU ranks (not a test): the loss and
# every parameter's gradient of a Mixtral-shaped model (2 layers, hidden
# 512, 8 experts of FFN 1024, top 2, fp32) over 4 sequences of 128 tokens,
# on one rank and over two with expert parallelism (each rank 4 experts and
# 2 sequences: tokens dispatched to their experts' ranks, dy dispatched
# back the same way in the backward pass, the non-expert gradients
# all-reduced). The forward pass alone on one rank gives the step's
# backward/forward ratio. Side by side in rounds; prints each run's step
# time, then the medians and the ratios.
#
#   bench/train-moe.sh [build-dir] [rounds]
BENCH=train-moe-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cat > "$work/config.json" <<JSON
{"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
 "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192,
 "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
 "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": false}
JSON
config_weights
tokens tokens 4 128 2
tokens labels 4 128 3
"$py" -m parax.models "$work/config.json" --batch 4 --seq 128 --dtype f32 --loss -o "$work/loss.mlir"
"$build/bin/parax-translate" --to-executable "$work/loss.mlir" -o "$work/forward.pxe"
training_program single -
training_program ep2 train:batch=4,seq=128,ep=2,dp=1,pp=1

for round in $(seq "$rounds"); do
  fwd="$(train_step 1 "$work/forward.pxe")"
  one="$(train_step 1 "$work/single.pxe")"
  ep="$(train_step 2 "$work/ep2.pxe")"
  echo "round $round: forward $fwd ms; training step: 1 rank $one ms, EP2 $ep ms"
  echo "$fwd $one $ep" >> "$work/figures"
done
read -r fwd one ep <<< "$(medians "$work/figures")"
awk -v fwd="$fwd" -v one="$one" -v ep="$ep" 'BEGIN { printf "medians, 512 tokens: forward alone %.1f ms; training step on 1 rank %.1f ms (%.2fx the forward), EP2 %.1f ms (%.2fx one rank)\n", fwd, one, one / fwd, ep, one / ep }'
