#!/usr/bin/env bash
# A training step on CPU ranks (not a test): the loss and every parameter's
# gradient (--parax-autodiff) of a Llama (4 layers, hidden 1024, fp32) over
# 4 sequences of 256 tokens, on one rank and over two: data parallelism
# (each replica 2 sequences, gradients averaged), tensor parallelism (with
# sequence parallelism), pipeline parallelism (two stages: the batch as one
# microbatch, its forward then its backward; and as 4 microbatches of one
# sequence, scheduled 1F1B). The forward pass alone on one
# rank gives the step's backward/forward ratio; the same steps with AdamW
# applied (parax-run --optimizer adamw: one rank, DP2, DP2 with ZeRO-1) give
# the optimizer's cost; --parax-recompute (selective, full) on one rank the
# recomputation's. Side by side in rounds; prints each run's step time,
# then the medians and the ratios.
#
#   bench/train.sh [build-dir] [rounds]
BENCH=train-bench source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

llama_bench_model 256
tokens tokens 4 256 2
tokens labels 4 256 3
for batch in 4 2 1; do
  "$py" -m parax.models "$work/config.json" --batch "$batch" --seq 256 --dtype f32 --loss -o "$work/loss$batch.mlir"
done
"$build/bin/parax-translate" --to-executable "$work/loss4.mlir" -o "$work/forward.pxe"
"$build/bin/parax-opt" "$work/loss4.mlir" --parax-autodiff -o "$work/single.mlir"
"$build/bin/parax-translate" --to-executable "$work/single.mlir" -o "$work/single.pxe"
for mode in selective full; do
  "$build/bin/parax-opt" "$work/loss4.mlir" --parax-autodiff --parax-recompute=mode=$mode -o "$work/$mode.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$mode.mlir" -o "$work/$mode.pxe"
done
cluster="$root/python/parax/oracle-cluster.json:devices_per_node=2"
for plan in "dp=2,tp=1,pp=1" "tp=2,dp=1,pp=1" "pp=2,tp=1,dp=1" "pp=2,tp=1,dp=1,micro"; do
  # (A plan's microbatch is the program's batch: PP2 over the batch-4 IR
  # runs one microbatch of 4, pinned so; left free, the plan may interleave
  # 4 microbatches of 1, which a batch-4 program does not have.)
  pins="${plan%,micro}"
  case "$plan" in
    dp=2*) ir="$work/loss2.mlir" ;;
    *micro) ir="$work/loss1.mlir" ;;
    pp=*) ir="$work/loss4.mlir" pins="$pins,mbs=4" ;;
    *) ir="$work/loss4.mlir" ;;
  esac
  "$build/bin/parax-opt" "$ir" --parax-plan="cluster=$cluster workload=train:batch=4,seq=256,$pins" \
    --parax-autodiff --parax-partition -o "$work/$plan.mlir"
  "$build/bin/parax-translate" --to-executable "$work/$plan.mlir" -o "$work/$plan.pxe"
done

for round in $(seq "$rounds"); do
  fwd="$(train_step 1 "$work/forward.pxe")"
  one="$(train_step 1 "$work/single.pxe")"
  dp="$(train_step 2 "$work/dp=2,tp=1,pp=1.pxe")"
  tp="$(train_step 2 "$work/tp=2,dp=1,pp=1.pxe")"
  pp="$(train_step 2 "$work/pp=2,tp=1,dp=1.pxe")"
  pp4="$(train_step 2 "$work/pp=2,tp=1,dp=1,micro.pxe")"
  adam="$(train_step 1 "$work/single.pxe" --optimizer adamw)"
  dpadam="$(train_step 2 "$work/dp=2,tp=1,pp=1.pxe" --optimizer adamw)"
  dpzero="$(train_step 2 "$work/dp=2,tp=1,pp=1.pxe" --optimizer adamw --zero)"
  sel="$(train_step 1 "$work/selective.pxe")"
  full="$(train_step 1 "$work/full.pxe")"
  echo "round $round: forward $fwd ms; training step: 1 rank $one ms, DP2 $dp ms, TP2 $tp ms, PP2 $pp ms," \
    "PP2 1F1B over 4 microbatches $pp4 ms;" \
    "with AdamW: 1 rank $adam ms, DP2 $dpadam ms, DP2 ZeRO-1 $dpzero ms;" \
    "recomputing: selective $sel ms, full $full ms"
  echo "$fwd $one $dp $tp $pp $pp4 $adam $dpadam $dpzero $sel $full" >> "$work/figures"
done
"$py" - "$work/figures" <<'PY'
import sys
import numpy as np
rows = np.loadtxt(sys.argv[1], ndmin=2)
fwd, one, dp, tp, pp, pp4, adam, dpadam, dpzero, sel, full = np.median(rows, axis=0)
tokens = 4 * 256
print(f"medians, 1,024 tokens: forward alone {fwd:.1f} ms; training step on 1 rank {one:.1f} ms "
      f"({one / fwd:.2f}x the forward, {tokens / one * 1e3:.0f} tokens/s), DP2 {dp:.1f} ms ({one / dp:.2f}x), "
      f"TP2 {tp:.1f} ms ({one / tp:.2f}x), PP2 {pp:.1f} ms ({one / pp:.2f}x), "
      f"PP2 1F1B over 4 microbatches {pp4:.1f} ms ({one / pp4:.2f}x); with AdamW applied: "
      f"1 rank {adam:.1f} ms ({adam / one:.2f}x the gradients alone), DP2 {dpadam:.1f} ms ({dpadam / dp:.2f}x), "
      f"DP2 with ZeRO-1 {dpzero:.1f} ms ({dpzero / dpadam:.2f}x DP2's); recomputing activations on 1 rank: "
      f"selective {sel:.1f} ms ({sel / one:.2f}x), full {full:.1f} ms ({full / one:.2f}x)")
PY
