#!/usr/bin/env bash
# The main job: a tiny model end to end (plan -> partition -> translate ->
# mpirun on 4 CPU ranks, checked against the single-rank run; then a greedy
# generation loop over one program, a training step's loss and gradients,
# 8 AdamW steps with ZeRO-1, and 8 of a mixture of experts under expert
# parallelism, 4 ranks against 1), then preset models verified and
# summarised (parameters, bytes, FLOPs per token), a large model planned for
# a cluster (training and decode), and a planned model partitioned into
# per-rank programs.
#
#   scripts/demo.sh                       # llama3-8b, mixtral-8x7b, deepseek-v3
#   scripts/demo.sh llama3-405b gpt3-175b # any presets (python3 -m parax.models --list)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PARAX_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh" >/dev/null
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(llama3-8b mixtral-8x7b deepseek-v3)
out="$(mktemp -d /tmp/parax-demo.XXXXXX)"

# End to end: a tiny Llama planned, partitioned, translated and run on 4 CPU
# ranks under mpirun, compared with the single-rank run.
PYTHONPATH="$root/python" "$root/.venv/bin/python" -m parax demo
echo
for preset in "${presets[@]}"; do
  echo "== $preset (batch 1, sequence 2048, bf16)"
  PYTHONPATH="$root/python" "$root/.venv/bin/python" -m parax.models "$preset" \
    -o "$out/$preset.mlir"
  # Parse, verify and summarise; the IR itself goes to /dev/null.
  "$build/bin/parax-opt" "$out/$preset.mlir" --parax-model-summary -o /dev/null
done
echo
echo "== plan: llama3-70b training on 4 x DGX H100 (32 GPUs), 1M-token batches"
"$build/bin/parax-plan" llama3-70b --cluster dgx-h100:nodes=4 \
  --workload train:batch=256,seq=4096 --top 3
echo
echo "== plan: llama3-70b decode on one DGX H100, 32 requests, 4K context"
"$build/bin/parax-plan" llama3-70b --cluster dgx-h100 \
  --workload decode:batch=32,context=4096 --top 3
echo
echo "== partition: llama3-8b (4 layers) for decode on pp2 x tp4; what rank 5 runs"
PYTHONPATH="$root/python" "$root/.venv/bin/python" -m parax.models llama3-8b --layers 4 \
  --seq 16 -o "$out/llama3-8b-4l.mlir"
"$build/bin/parax-opt" "$out/llama3-8b-4l.mlir" \
  --parax-plan="cluster=dgx-h100 workload=decode:batch=8,context=4096,pp=2,tp=4" \
  --parax-partition -o "$out/llama3-8b-4l.partitioned.mlir"
for kind in all_reduce all_gather reduce_scatter send recv; do
  printf '  %-15s %s\n' "$kind" "$(grep -c "parax.$kind " "$out/llama3-8b-4l.partitioned.mlir" || true)"
done
"$build/bin/parax-opt" "$out/llama3-8b-4l.partitioned.mlir" \
  --parax-specialize-rank=rank=5 -o /dev/null | grep -v "^    #"
echo "(IR written to $out)"
