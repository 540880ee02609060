#!/usr/bin/env bash
# Partitioning time (not a test): llama3-70b (80 layers, seq 4096), planned
# for tp8 x pp8 x dp4 on 256 H100s, then --parax-partition; five runs, median
# of the pass's own time (--mlir-timing) and of the whole parax-opt run.
#
#   bench/partition.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
PYTHONPATH="$root/python" "$root/.venv/bin/python" -m parax.models llama3-70b --seq 4096 -o "$tmp/m.mlir"
"$build/bin/parax-opt" "$tmp/m.mlir" \
  --parax-plan="cluster=dgx-h100:nodes=32 workload=train:batch=256,seq=4096,tp=8,pp=8,dp=4" \
  -o "$tmp/planned.mlir"
passes=() wholes=()
for i in 1 2 3 4 5; do
  start=$(date +%s.%N)
  pass=$(taskset -c 0 "$build/bin/parax-opt" "$tmp/planned.mlir" --parax-partition -o "$tmp/out.mlir" \
           --mlir-timing 2>&1 | awk '/ParaxPartitionPass/ {print $1}')
  end=$(date +%s.%N)
  passes+=("$pass")
  wholes+=("$(printf "%.4f" "$(echo "$end - $start" | bc)")")
done
median() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
echo "llama3-70b tp8 x pp8 x dp4: --parax-partition $(median "${passes[@]}") s (pass), $(median "${wholes[@]}") s (parse + partition + print), median of 5"
echo "stage functions: $(grep -c 'func.func' "$tmp/out.mlir"), send ops: $(grep -c 'parax.send' "$tmp/out.mlir")"
