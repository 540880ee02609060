#!/usr/bin/env bash
# The CUDA backend on the SIMT emulator under AddressSanitizer.
#   simt-asan.sh build BUILD_DIR SOURCE_DIR
#     A runtime-only build with -fsanitize=address in BUILD_DIR/simt-asan
#     (-g1: line tables for ASan's reports without full debug information,
#     which made its compile 40 % longer: SimtCudaExecutor.cpp 98 s with -g,
#     69 s with -g1, 2026-12-06)
#     (ctest's fixture simt-asan-build). cuda-simt's test_simt_matches_cpu_and_numpy
#     runs every model and one-op case of cuda_cases.py once with its
#     parax-run-simt (PARAX_SIMT_ASAN_BIN): a kernel reading or writing past
#     a device buffer (the emulator's allocations are exact, and temporaries
#     get one each there) fails its case with ASan's report.
#   simt-asan.sh fuzz BUILD_DIR SOURCE_DIR PYTHON
#     Hostile executables (test_fuzz.py) under AddressSanitizer: mutants of
#     the model cases, loaded, validated, prepared and run on the CPU; then
#     mutants of the one-rank cases on the CUDA backend (parax-pxe-fuzz-simt
#     --device cuda), each also run on the CPU backend: both must refuse it,
#     or both run it and compute the same (within the case's tolerance), or
#     the device alone refuse it with a named error.
set -euo pipefail
mode="$1"
build="$2"
source="$3"
asan="$build/simt-asan"

if [[ "$mode" == build ]]; then
  mkdir -p "$asan"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$source" -B "$asan" -G Ninja -DPARAX_BUILD_COMPILER=OFF -DPARAX_ENABLE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="-fsanitize=address -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address > "$asan/configure.log" ||
    { tail -n 40 "$asan/configure.log"; exit 1; }
  cmake --build "$asan" --target parax-run-simt parax-pxe-fuzz parax-pxe-fuzz-simt > "$asan/build.log" ||
    { tail -n 40 "$asan/build.log"; exit 1; }
  echo "simt-asan: built $asan/bin/parax-run-simt and parax-pxe-fuzz with AddressSanitizer"
  exit 0
fi

[[ "$mode" == fuzz ]] || { echo "simt-asan.sh: build or fuzz, got '$mode'"; exit 2; }
python="$4"
cases="$(mktemp -d /tmp/parax-simt-asan.XXXXXX)"
trap 'rm -rf "$cases"' EXIT
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
# The model cases: one rank, TP2, EP2 x TP2, DP2 (each rank its replica's
# rows), CP2 x TP2, training steps of GPT-2 CP2 x TP2, Llama TP2 x PP2 and
# Llama DP2 x TP2 with ZeRO-3's reduce-scatters (ranks as threads; with
# damaged tokens one rank failed while another still read its reduce-
# scatter operand: a use after free in the in-process communicator, fixed
# 2026-11-30).
names=(llama gpt2 mixtral qwen2-moe deepseek-v3 llama-cache-step llama-tp2 mixtral-ep2-tp2 llama-dp2
       gpt2-cp2-tp2 train-gpt2-cp2-tp2 train-llama-tp2-pp2 train-llama-bf16-adamw-dp2-tp2-zero3)
# On the device: RMSNorm, RoPE, SwiGLU (fp32); LayerNorm, GELU, biases,
# positions; bf16 experts; MLA and the sigmoid router; a cache step's
# tensor-core tiles (bf16) and the split decode kernel; the gradients.
# 300 mutants each (500 until 2026-12-06: 169 s of the test's 297 on one
# core, for CI's 20 minutes; the CPU's 3,000 a case stay).
device_names=(llama gpt2 mixtral-bf16 deepseek-v3 llama-cache-step-8-bf16 llama-decode train-gpt2
              train-deepseek-v3)
all_names=("${names[@]}" llama-cache-step-8-bf16 mixtral-bf16 llama-decode train-gpt2 train-deepseek-v3)
PARAX_BUILD_DIR="$build" "$python" "$source/test/runtime/cuda_cases.py" prepare "$cases" \
  --bin "$build/bin" --cases "$(IFS=,; echo "${all_names[*]}")" > "$cases/prepare.log" ||
  { tail -n 40 "$cases/prepare.log"; exit 1; }
for name in "${names[@]}"; do
  dir="$cases/$name"
  read -r exe inputs < <("$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["exe"], " ".join(c["inputs"]))' "$dir/case.json")
  (cd "$dir" && timeout 300 "$asan/bin/parax-pxe-fuzz" "$exe" weights.safetensors $inputs --mutants 3000 --seed 7 \
     2> "$cases/fuzz-$name.log") || { tail -n 40 "$cases/fuzz-$name.log"; echo "simt-asan: a mutant of $name crashed"; exit 1; }
done
for name in "${device_names[@]}"; do
  dir="$cases/$name"
  read -r exe inputs < <("$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["exe"], " ".join(c["inputs"]))' "$dir/case.json")
  # of the largest |output|: cuda_cases.py's BF16_REL for bf16 storage, TOL
  tolerance=1e-4
  [[ "$name" == *bf16* ]] && tolerance=3e-2
  (cd "$dir" && timeout 300 "$asan/bin/parax-pxe-fuzz-simt" "$exe" weights.safetensors $inputs --mutants 300 --seed 7 \
     --device cuda --tolerance "$tolerance" > "$cases/device-$name.out" 2> "$cases/device-$name.log") ||
    { tail -n 40 "$cases/device-$name.log"; echo "simt-asan: a mutant of $name crashed on the device"; exit 1; }
  echo "$name: $(grep "on cuda and on cpu" "$cases/device-$name.out")"
  grep -q ", 0 disagreed" "$cases/device-$name.out" ||
    { grep "the backends disagree" "$cases/device-$name.log" | head -n 20
      echo "simt-asan: the backends disagree on mutants of $name"; exit 1; }
done
echo "simt-asan: every mutant of the model cases ends in a named error, a stall the watchdog ends, or a run" \
     "(on the device as on the CPU)"
