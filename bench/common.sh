# Sourced by the CPU-rank benchmarks: `root`, `build` (argument 1), `rounds`
# (argument 2, default 3), `py`, one GEMM thread a rank (OMP_NUM_THREADS), mpirun
# allowed as root, and `work`, a temporary folder removed on exit (named
# after BENCH).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
py="${PARAX_PYTHON:-$root/.venv/bin/python}"
export PARAX_BUILD_DIR="$build" PYTHONPATH="$root/python" OMP_NUM_THREADS=1 \
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
work="$(mktemp -d "/tmp/parax-${BENCH:-bench}.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A Llama of 4 layers, hidden 1024 (about 60 M parameters, fp32): its
# config.json (max positions: argument 1) and random weights
# (w.safetensors) in $work; then `tokens NAME ROWS COLUMNS [SEED]` saves
# random token ids as $work/NAME.npy.
llama_bench_model() {
  cat > "$work/config.json" <<JSON
{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
 "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 8192,
 "max_position_embeddings": $1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
JSON
  config_weights
}
# Random weights (seed 1) for $work/config.json, as $work/w.safetensors.
config_weights() {
  "$py" -c 'import sys; from parax.checkpoint import random_weights, save_safetensors; from parax.models import load_config; save_safetensors(sys.argv[1] + "/w.safetensors", random_weights(load_config(sys.argv[1] + "/config.json"), seed=1))' "$work"
}
# `training_program NAME WORKLOAD [PARTITION]`: the training step of
# $work/loss.mlir (--parax-autodiff) as $work/NAME.pxe (its IR
# $work/NAME.mlir), planned for WORKLOAD on the oracle cluster of 2
# devices a node and partitioned (PARTITION: the pass and its options,
# default --parax-partition); WORKLOAD "-": one rank, neither.
training_program() {
  local name="$1" workload="$2" partition="${3:---parax-partition}"
  if [ "$workload" = - ]; then
    "$build/bin/parax-opt" "$work/loss.mlir" --parax-autodiff -o "$work/$name.mlir"
  else
    "$build/bin/parax-opt" "$work/loss.mlir" \
      --parax-plan="cluster=$root/python/parax/oracle-cluster.json:devices_per_node=2 workload=$workload" \
      --parax-autodiff "$partition" -o "$work/$name.mlir"
  fi
  "$build/bin/parax-translate" --to-executable "$work/$name.mlir" -o "$work/$name.pxe"
}
# `medians FILE`: the median of each column of FILE's rows of figures.
medians() {
  "$py" -c 'import sys, numpy as np; print(*np.median(np.loadtxt(sys.argv[1], ndmin=2), axis=0))' "$1"
}
tokens() {
  "$py" -c 'import sys, numpy as np; np.save(sys.argv[1], np.random.default_rng(int(sys.argv[4])).integers(0, 8192, size=(int(sys.argv[2]), int(sys.argv[3]))).astype(np.int32))' \
    "$work/$1.npy" "$2" "$3" "${4:-2}"
}

# `train_step RANKS EXE [parax-run options]`: the median step time in ms of
# 3 training steps of EXE on RANKS ranks over $work/tokens.npy and
# $work/labels.npy with the weights $work/w.safetensors.
train_step() {
  local ranks="$1" exe="$2"
  shift 2
  timeout 600 mpirun -np "$ranks" --oversubscribe --bind-to none "$build/bin/parax-run" "$exe" \
    --weights "$work/w.safetensors" --input "$work/tokens.npy" --input "$work/labels.npy" --steps 3 "$@" |
    grep "step time" | sed -E 's/.*step time ([0-9.]+) ms.*/\1/'
}
