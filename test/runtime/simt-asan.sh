#!/usr/bin/env bash
# The CUDA backend on the SIMT emulator under AddressSanitizer: a runtime-only
# build with -fsanitize=address, then every model and one-op case of
# cuda_cases.py. A kernel reading or writing past a device buffer (the
# emulator's allocations are exact, and temporaries get one each here) fails
# its case with ASan's report.
#   simt-asan.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build="$1"
source="$2"
python="$3"
asan="$build/simt-asan"
cases="$(mktemp -d /tmp/parax-simt-asan.XXXXXX)"
trap 'rm -rf "$cases"' EXIT
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$source" -B "$asan" -G Ninja -DPARAX_BUILD_COMPILER=OFF -DPARAX_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address > "$cases/configure.log"
cmake --build "$asan" --target parax-run-simt parax-pxe-fuzz > "$cases/build.log"
# Every case but three pipeline training cases whose code paths the PP4 ones
# cover (1F1B's activation sets and grouped sends, interleaved chunks'
# slots and exchanges) and the two ZeRO-2 ones, whose reduce-scatters
# through staging boxes the ZeRO-3 case runs too: CI's time.
every="$("$python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cuda_cases
print(",".join(c for c in cuda_cases.all_cases()
               if c not in ("train-llama-bf16-adamw-dp2-pp2-micro3", "train-mixtral-ep2-pp2-micro2",
                            "train-llama-bf16-adamw-dp2-pp2-chunks2-micro4",
                            "train-llama-bf16-adamw-dp2-tp2-zero2", "train-mixtral-adamw-ep2-zero2")))' \
  "$source/test/runtime")"
PARAX_BUILD_DIR="$build" "$python" "$source/test/runtime/cuda_cases.py" prepare "$cases" \
  --bin "$build/bin" --cases "$every" > "$cases/prepare.log"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
export PARAX_SIMT_STREAMS=lazy # collectives run when waited for (see test_cuda_simt.py)
# Each temporary in an allocation of its own (not the shared arena), so that
# a kernel writing past one is caught, not hidden in its neighbour's bytes.
export PARAX_CUDA_SHARE_TEMPORARIES=0
"$python" "$source/test/runtime/cuda_cases.py" check "$cases" --bin "$asan/bin" --tool parax-run-simt --cases "$every"
echo "simt-asan: every case passes under AddressSanitizer"
# Hostile executables (test_fuzz.py) under AddressSanitizer: mutants of the
# model cases (one rank, TP2, EP2 x TP2, DP2 (each rank its replica's
# rows), CP2 x TP2, training steps of GPT-2 CP2 x TP2 and Llama TP2 x PP2:
# ranks as threads), loaded, validated, prepared and run
# on the CPU.
for name in llama gpt2 mixtral qwen2-moe deepseek-v3 llama-cache-step llama-tp2 mixtral-ep2-tp2 llama-dp2 \
            gpt2-cp2-tp2 train-gpt2-cp2-tp2 train-llama-tp2-pp2; do
  dir="$cases/$name"
  read -r exe inputs < <("$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["exe"], " ".join(c["inputs"]))' "$dir/case.json")
  (cd "$dir" && timeout 300 "$asan/bin/parax-pxe-fuzz" "$exe" weights.safetensors $inputs --mutants 3000 --seed 7 \
     2> "$cases/fuzz-$name.log") || { tail -n 40 "$cases/fuzz-$name.log"; echo "simt-asan: a mutant of $name crashed"; exit 1; }
done
echo "simt-asan: every mutant of the model cases ends in a named error, a stall the watchdog ends, or a run"
