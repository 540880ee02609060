#!/usr/bin/env bash
# The runtime's loaders under libFuzzer (ctest loader-fuzz; issue 45):
#   test/fuzz/run.sh BUILD_DIR SOURCE_DIR PYTHON [SECONDS]
# 1. Builds LoaderFuzz.cpp and the loaders' sources (Executable, OpShapes,
#    Checkpoint, Tensor, Status, PipelineSchedule and the .pxe schema's
#    generated code from BUILD_DIR) with clang and -fsanitize=fuzzer,
#    address,undefined into BUILD_DIR/loader-fuzz (ccache when present).
# 2. Seeds: executables, weights and inputs of real model cases
#    (test/runtime/cuda_cases.py prepare: one rank, a generation step, TP2 x
#    PP2 and EP2 training steps, DeepSeek-V3) and the harness's own sharded
#    and box-wise indexes, a shard and a file of every dtype; each seed must
#    load (PARAX_FUZZ_EXPECT_VALID: a refused seed fails the run), so the
#    fuzzing cannot pass by mutating files no loader accepts.
# 3. Fuzzes for SECONDS (default 60; PARAX_LOADER_FUZZ_SECONDS), seed
#    PARAX_LOADER_FUZZ_SEED (default 1), 10 s and 2 GB an input at most. A
#    crash, a sanitizer report, a slow input or an allocation past the limit
#    fails the run and leaves the input in BUILD_DIR/loader-fuzz/artifacts.
set -euo pipefail
build="$1"
source="$2"
python="$3"
seconds="${4:-${PARAX_LOADER_FUZZ_SECONDS:-60}}"
out="$build/loader-fuzz"
mkdir -p "$out/obj" "$out/artifacts"

clang="$(command -v clang++-14 || command -v clang++ || true)"
[[ -n "$clang" ]] || { echo "loader-fuzz: clang++ not found (scripts/setup.sh installs clang-14)"; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(ccache)
proto="$build/runtime/proto"
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I "$source/runtime/include" -I "$proto")
sources=("$source/test/fuzz/LoaderFuzz.cpp" "$proto/parax/runtime/executable.pb.cc")
for name in Executable OpShapes Checkpoint Tensor Status PipelineSchedule; do
  sources+=("$source/runtime/src/$name.cpp")
done
objects=()
for src in "${sources[@]}"; do objects+=("$out/obj/$(basename "${src%.*}").o"); done
# (each source its own compiler, two at a time)
printf '%s\n' "${sources[@]}" |
  xargs -P 2 -I{} sh -c 'src="$1"; shift; base="$(basename "$src")"; exec "$@" -c "$src" -o "'"$out"'/obj/${base%.*}.o"' \
    _ {} "${launcher[@]}" "$clang" "${flags[@]}" > "$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log"; echo "loader-fuzz: the build failed"; exit 1; }
"$clang" "${flags[@]}" "${objects[@]}" -lprotobuf -lz -lpthread -o "$out/parax-loader-fuzz" >> "$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log"; echo "loader-fuzz: the link failed"; exit 1; }
fuzz="$out/parax-loader-fuzz"

# Seeds.
work="$(mktemp -d /tmp/parax-loader-fuzz-run.XXXXXX)"
trap 'rm -rf "$work"' EXIT
seeds="$work/seeds"
mkdir -p "$seeds" "$work/corpus"
PARAX_BUILD_DIR="$build" "$python" "$source/test/runtime/cuda_cases.py" prepare "$work/cases" --bin "$build/bin" \
  --cases llama,llama-cache-step,deepseek-v3,train-llama-tp2-pp2,train-mixtral-ep2 > "$work/prepare.log" 2>&1 ||
  { tail -n 40 "$work/prepare.log"; echo "loader-fuzz: preparing the seed cases failed"; exit 1; }
seed() { # LOADER FILE NAME: the file with its loader's byte in front
  { printf "\\x$(printf %02x "$1")"; cat "$2"; } > "$seeds/$3"
}
for case in llama llama-cache-step deepseek-v3; do seed 0 "$work/cases/$case/single.pxe" "$case.pxe"; done
for case in train-llama-tp2-pp2 train-mixtral-ep2; do seed 0 "$work/cases/$case/sharded.pxe" "$case.pxe"; done
for array in llama-cache-step/tokens llama-cache-step/position llama-cache-step/past_0_key train-llama-tp2-pp2/labels; do
  seed 4 "$work/cases/$array.npy" "$(echo "$array" | tr / -).npy"
done
PARAX_FUZZ_WRITE_SEEDS="$seeds" "$fuzz" > "$work/seeds.log" 2>&1 ||
  { tail -n 20 "$work/seeds.log"; echo "loader-fuzz: writing the index seeds failed"; exit 1; }
export ASAN_OPTIONS=detect_leaks=0
# Every seed must load.
PARAX_FUZZ_EXPECT_VALID=1 "$fuzz" "$seeds"/* > "$work/valid.log" 2>&1 ||
  { tail -n 20 "$work/valid.log"; echo "loader-fuzz: a seed does not load (the fuzzing would test nothing)"; exit 1; }
echo "loader-fuzz: $(ls "$seeds" | wc -l) seeds, each loads: $(ls "$seeds" | tr '\n' ' ')"

# Fuzz.
seed_value="${PARAX_LOADER_FUZZ_SEED:-1}"
if ! "$fuzz" -max_total_time="$seconds" -seed="$seed_value" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$out/artifacts/" -print_final_stats=1 "$work/corpus" "$seeds" > "$work/fuzz.log" 2>&1; then
  grep -v "^#" "$work/fuzz.log" | tail -n 60
  echo "loader-fuzz: an input crashed a loader (seed $seed_value): $(ls -t "$out/artifacts" | head -n 1)"
  exit 1
fi
runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")"
edges="$(grep -o "cov: [0-9]*" "$work/fuzz.log" | tail -n 1)"
echo "loader-fuzz: $runs inputs in $seconds s (seed $seed_value, $edges edges): every one a named error or a load"
[[ "${runs:-0}" -gt 1000 ]] || { echo "loader-fuzz: too few inputs ran"; exit 1; }
