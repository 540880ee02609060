#!/usr/bin/env bash
# Generation throughput on CPU ranks (not a test): one pipeline-parallel
# step program (PP2, 2 ranks) fed 1, 2 and 4 microbatches of 4 rows per
# replica, side by side in rounds. With one microbatch the stages take
# turns; with two or more, stage 1 works on microbatch m while stage 0 is on
# m + 1. Prints each run's tokens/s and step time, then the medians and
# their ratio to one microbatch.
#
#   bench/generation.sh [build-dir] [rounds]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
py="${PARAX_PYTHON:-$root/.venv/bin/python}"
export PARAX_BUILD_DIR="$build" PYTHONPATH="$root/python" OPENBLAS_NUM_THREADS=1 \
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
work="$(mktemp -d /tmp/parax-generation-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

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
for micro in (1, 2, 4):
    np.save(f"{work}/prompt{micro}.npy", rng.integers(0, 8192, size=(4 * micro, 4)).astype(np.int32))
PY
"$py" -m parax compile "$work/config.json" --cluster "$root/python/parax/oracle-cluster.json:devices_per_node=2" \
  --workload "decode:batch=4,context=64,pp=2,dp=1" --batch 4 --seq 1 --cache 64 --dtype f32 \
  -o "$work/step.pxe" > /dev/null

for round in $(seq "$rounds"); do
  for micro in 1 2 4; do
    line="$(timeout 300 mpirun -np 2 --oversubscribe --bind-to none "$build/bin/parax-run" "$work/step.pxe" \
      --weights "$work/w.safetensors" --input "$work/prompt$micro.npy" --generate 32 \
      --output "$work/tokens.npy" | grep 'token(s) generated')"
    tps="$(sed -E 's/.* ([0-9]+) tokens\/s at the median step.*/\1/' <<<"$line")"
    ms="$(sed -E 's/.*step time ([0-9.]+) ms.*/\1/' <<<"$line")"
    echo "round $round: $micro microbatch(es) of 4 rows: $tps tokens/s, step $ms ms"
    echo "$micro $tps" >> "$work/figures"
  done
done
"$py" - "$work/figures" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    micro, tps = line.split()
    runs.setdefault(int(micro), []).append(float(tps))
base = statistics.median(runs[1])
for micro, values in sorted(runs.items()):
    m = statistics.median(values)
    print(f"median: {micro} microbatch(es): {m:.0f} tokens/s ({m / base:.2f}x one microbatch)")
PY
