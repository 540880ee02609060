#!/usr/bin/env bash
# Vocab-parallel cross-entropy (docs/partitioning.md) on CPU ranks (not a
# test): a training step (--parax-autodiff) of a Llama with a large
# vocabulary for its width (2 layers, hidden 512, vocabulary 32,000, fp32;
# Llama-3-8B's ratio is 128,256 / 4,096), 4 sequences of 256 tokens, under
# TP2 on two ranks: the logits kept split on the vocabulary (every token's
# logsumexp gathered) against --parax-partition=vocab-parallel=false (the
# logits all-gathered, the loss and its gradient over all of them on both
# ranks). Side by side in rounds; prints each run's step time, then the
# medians and their ratio; then, without rounds, the CUDA backend's device
# memory of each (the emulator's parax-run-simt --steps 0, rank 0).
#
#   bench/vocab-parallel.sh [build-dir] [rounds]
BENCH=vocab-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cat > "$work/config.json" <<JSON
{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 2,
 "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
JSON
config_weights
tokens tokens 4 256 2
tokens labels 4 256 3
"$py" -m parax.models "$work/config.json" --batch 4 --seq 256 --dtype f32 --loss -o "$work/loss.mlir"
for vocab in true false; do
  training_program "$vocab" train:batch=4,seq=256,tp=2,dp=1,pp=1 --parax-partition=vocab-parallel=$vocab
done
echo "logits gathered: vocab-parallel $(grep -c 'all_gather.*x32000x' "$work/true.mlir"), gathered $(grep -c 'all_gather.*x32000x' "$work/false.mlir")"

for round in $(seq "$rounds"); do
  split="$(train_step 2 "$work/true.pxe")"
  gathered="$(train_step 2 "$work/false.pxe")"
  echo "round $round: TP2 training step: vocab-parallel $split ms, logits gathered $gathered ms"
  echo "$split $gathered" >> "$work/figures"
done
read -r split gathered <<< "$(medians "$work/figures")"
awk -v s="$split" -v g="$gathered" 'BEGIN { printf "medians: vocab-parallel %.1f ms, logits gathered %.1f ms (%.2fx)\n", s, g, g / s }'
if [ -x "$build/bin/parax-run-simt" ]; then
  for vocab in true false; do
    memory="$(timeout 600 mpirun -np 2 --oversubscribe --bind-to none "$build/bin/parax-run-simt" "$work/$vocab.pxe" \
      --weights "$work/w.safetensors" --input "$work/tokens.npy" --input "$work/labels.npy" --device cuda --steps 0 |
      grep -o 'temporaries share [0-9]* bytes' | head -1)"
    echo "CUDA backend (emulator), vocab-parallel=$vocab: $memory"
  done
fi
