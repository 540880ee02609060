#!/usr/bin/env bash
# Planner search time (not a test): the issue's two targets, one core each,
# five runs each, median reported. The model IR is built once beforehand, so
# the figure is parax-plan's own search (as printed by --timing).
#
#   bench/plan_search.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH="$root/python"
"$root/.venv/bin/python" -m parax.models llama3-405b --seq 8192 -o "$tmp/l405.mlir"
"$root/.venv/bin/python" -m parax.models deepseek-v3 --seq 4096 -o "$tmp/dsv3.mlir"

run() { # name model cluster workload
  local times=()
  for i in 1 2 3 4 5; do
    t=$(taskset -c 0 "$build/bin/parax-plan" "$2" --cluster "$3" --workload "$4" \
          --timing 2>&1 >/dev/null | sed -n 's/search time: \([0-9.]*\) s (\([0-9]*\).*/\1 \2/p')
    times+=("$t")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 3p | {
    read -r median configs
    printf '%-58s median %.3f s over 5 runs (%s configurations)\n' "$1" "$median" "$configs"
  }
}
run "llama3-405b, 16,384 H100 (train, seq 8192, batch 2048)" "$tmp/l405.mlir" \
    dgx-h100:nodes=2048 train:batch=2048,seq=8192
run "deepseek-v3, 2,048 H800 (train, seq 4096, batch 15360, EP)" "$tmp/dsv3.mlir" \
    hgx-h800:nodes=256 train:batch=15360,seq=4096
run "llama3-405b, 64 H100 (decode, batch 64, context 8192)" "$tmp/l405.mlir" \
    dgx-h100:nodes=8 decode:batch=64,context=8192
