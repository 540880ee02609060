#!/usr/bin/env bash
# Generation throughput on CPU ranks (not a test): one pipeline-parallel
# step program (PP2, 2 ranks) for 4, 8 and 16 rows, either as one batch
# (a step built for that batch) or as microbatches of a smaller step's
# batch, each with its own KV caches, side by side in rounds. With one
# batch the stages take turns; with microbatches, stage 1 works on
# microbatch m while stage 0 is on m + 1, but each microbatch reads the
# stage's weights again. Prints each run's tokens/s and step time, then
# the medians.
#
#   bench/generation.sh [build-dir] [rounds]
BENCH=generation-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# A Llama of 4 layers, hidden 1024 (about 60 M parameters, fp32).
cat > "$work/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
 "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 8192,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
JSON
"$py" - "$work" <<'PY'
import sys
import numpy as np
from parax.checkpoint import random_weights, save_safetensors
from parax.models import load_config
work = sys.argv[1]
save_safetensors(f"{work}/w.safetensors", random_weights(load_config(f"{work}/config.json"), seed=1))
rng = np.random.default_rng(2)
for rows in (4, 8, 16):
    np.save(f"{work}/prompt{rows}.npy", rng.integers(0, 8192, size=(rows, 4)).astype(np.int32))
PY
for batch in 4 8 16; do
  "$py" -m parax compile "$work/config.json" --cluster "$root/python/parax/oracle-cluster.json:devices_per_node=2" \
    --workload "decode:batch=$batch,context=64,pp=2,dp=1" --batch "$batch" --seq 1 --cache 64 --dtype f32 \
    -o "$work/step$batch.pxe" > /dev/null
done

# (rows, the step's batch): rows / batch microbatches
runs=("4 4" "8 4" "8 8" "16 4" "16 8" "16 16")
for round in $(seq "$rounds"); do
  for run in "${runs[@]}"; do
    read -r rows batch <<<"$run"
    line="$(timeout 300 mpirun -np 2 --oversubscribe --bind-to none "$build/bin/parax-run" "$work/step$batch.pxe" \
      --weights "$work/w.safetensors" --input "$work/prompt$rows.npy" --generate 32 \
      --output "$work/tokens.npy" | grep 'token(s) generated')"
    tps="$(sed -E 's/.* ([0-9]+) tokens\/s at the median step.*/\1/' <<<"$line")"
    ms="$(sed -E 's/.*step time ([0-9.]+) ms.*/\1/' <<<"$line")"
    echo "round $round: $rows rows as $((rows / batch)) microbatch(es) of $batch: $tps tokens/s, step $ms ms"
    echo "$rows $batch $tps" >> "$work/figures"
  done
done
"$py" - "$work/figures" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    rows, batch, tps = line.split()
    runs.setdefault((int(rows), int(batch)), []).append(float(tps))
for (rows, batch), values in sorted(runs.items()):
    print(f"median: {rows} rows as {rows // batch} microbatch(es) of {batch}: "
          f"{statistics.median(values):.0f} tokens/s")
PY
