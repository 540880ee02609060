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

llama_bench_model 256
for rows in 4 8 16; do tokens "prompt$rows" "$rows" 4 "$rows"; done
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
