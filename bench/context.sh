#!/usr/bin/env bash
# A long prompt on CPU ranks (not a test): one prefill of a Llama (4 layers,
# hidden 1024, fp32) over S tokens, on one rank and split two ways over two
# ranks: tensor parallelism (heads and FFN split, two all-reduces a layer)
# and context parallelism (each rank S/2 positions, keys and values
# gathered: the second rank's queries see more keys). Side by side in
# rounds; prints each run's step time, then the medians and the ratios.
#
#   bench/context.sh [build-dir] [rounds] [tokens]
BENCH=context-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
seq="${3:-2048}"

llama_bench_model "$seq"
tokens prompt 1 "$seq"
"$py" -m parax.models "$work/config.json" --batch 1 --seq "$seq" --dtype f32 --last-logits -o "$work/model.mlir"
"$build/bin/parax-translate" --to-executable "$work/model.mlir" -o "$work/single.pxe"
for plan in "tp=2,cp=1" "cp=2,tp=1"; do
  "$build/bin/parax-opt" "$work/model.mlir" \
    --parax-plan="cluster=$root/python/parax/oracle-cluster.json:devices_per_node=2 workload=prefill:batch=1,seq=$seq,$plan,dp=1,pp=1" \
    --parax-partition -o "$work/$plan.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$plan.mlir" -o "$work/$plan.pxe"
done

step() { # ranks executable -> the median step time in ms
  timeout 600 mpirun -np "$1" --oversubscribe --bind-to none "$build/bin/parax-run" "$2" \
    --weights "$work/w.safetensors" --input "$work/prompt.npy" --steps 3 |
    sed -E 's/.*step time ([0-9.]+) ms.*/\1/'
}
for round in $(seq "$rounds"); do
  one="$(step 1 "$work/single.pxe")"
  tp="$(step 2 "$work/tp=2,cp=1.pxe")"
  cp="$(step 2 "$work/cp=2,tp=1.pxe")"
  echo "round $round: $seq tokens: 1 rank $one ms, TP2 $tp ms, CP2 $cp ms"
  echo "$one $tp $cp" >> "$work/figures"
done
"$py" - "$work/figures" "$seq" <<'PY'
import sys
import numpy as np
rows = np.loadtxt(sys.argv[1], ndmin=2)
one, tp, cp = np.median(rows, axis=0)
print(f"medians, {sys.argv[2]} tokens: 1 rank {one:.1f} ms, TP2 {tp:.1f} ms ({one / tp:.2f}x), "
      f"CP2 {cp:.1f} ms ({one / cp:.2f}x)")
PY
