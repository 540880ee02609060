#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has no
# compiler, MPI or BLAS (this workplace's H200 image): the GPU cases compiled
# here with their CPU and numpy results, the benchmark executables, a
# CUDA-enabled parax-run, and the Debian packages of its runtime libraries
# and of Open MPI. Everything lands in gpu-bundle/ (git-ignored; carry it).
#
#   scripts/gpu-bundle.sh [build-dir]      # needs a build with cuda=ON
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
out="$root/gpu-bundle"
if ! ldd "$build/bin/parax-run" 2>/dev/null | grep -q libcudart; then
  echo "gpu-bundle: $build/bin/parax-run was built without CUDA (configure with -DPARAX_ENABLE_CUDA=ON)" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/debs"
cp "$build/bin/parax-run" "$build/bin/parax-cuda-bench" "$build/bin/parax-cudnn-probe" "$out/bin/"
# (their symbol tables stripped: 0.6 MB of the 64 MiB the device tool carries)
if command -v strip >/dev/null; then strip "$out/bin/parax-run" "$out/bin/parax-cuda-bench" "$out/bin/parax-cudnn-probe"; fi
# (and gzipped: 13.5 MB to about a third; gpu-check.sh unpacks them)
gzip -9 "$out"/bin/*
# Every case but the 8-layer PP4 interleaved one (4 MB of weights and
# results: the device tool carries at most 64 MiB; the DP2 x PP2
# interleaved case covers the same paths on the GPU) and the two ZeRO-2
# ones (the ZeRO-3 case reduce-scatters its sums the same way); since
# 2026-12-07 (the bundle had grown to 66 MiB with the working tree) also
# PP4 1F1B (the PP2 cases run the schedule), Mixtral EP2 x PP2 (EP2 and
# PP2 each run alone) and the fp32 latent decode ops (their bf16 twins
# take the same split-decode paths); since 2026-12-07's eighth session
# (67 MiB: the few-row cases' weights, since shrunk, and larger binaries)
# GPT-2's AdamW DP2 x PP2 interleaved step (Llama's bf16 AdamW DP2 x PP2
# interleaved one runs the same paths).
cases="$("$root/.venv/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cuda_cases
left_out = ("train-llama-pp4-chunks2-micro8", "train-llama-bf16-adamw-dp2-tp2-zero2", "train-mixtral-adamw-ep2-zero2",
            "train-llama-pp4-micro6", "train-mixtral-ep2-pp2-micro2", "op-attention-latent-decode-128-heads",
            "op-attention-latent-decode-16-heads", "train-gpt2-adamw-dp2-pp2-chunks2-micro2")
print(",".join(c for c in cuda_cases.all_cases() if c not in left_out))' "$root/test/runtime")"
PARAX_BUILD_DIR="$build" "$root/.venv/bin/python" "$root/test/runtime/cuda_cases.py" \
  prepare "$out/cases" --bin "$build/bin" --cases "$cases"
find "$out/cases" -name '*.mlir' -delete
# (the CPU runs' own output files: their values are the cases' cpu*.npy,
# which is what gpu-check.sh compares with; 13 MB of the 64 MiB)
find "$out/cases" -name 'out*.npy' -delete
# Many cases share their weights and inputs: each distinct file kept once
# in shared/, the cases' copies relative links to it (the device tool
# carries at most 64 MiB, links as links).
"$root/.venv/bin/python" - "$out" <<'PY'
import hashlib, os, sys
out = sys.argv[1]
shared = os.path.join(out, "shared")
os.makedirs(shared, exist_ok=True)
for folder, _, files in os.walk(os.path.join(out, "cases")):
    for name in files:
        path = os.path.join(folder, name)
        if os.path.islink(path) or os.path.getsize(path) < 4096:
            continue
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:32]
        kept = os.path.join(shared, digest + os.path.splitext(name)[1])
        if not os.path.exists(kept):
            os.replace(path, kept)
        else:
            os.remove(path)
        os.symlink(os.path.relpath(kept, folder), path)
PY
# The shared files gzipped (the weights and results of the tiny models:
# about a fifth smaller); gpu-check.sh unpacks them first. The cases'
# links point into shared/ and dangle until then.
tar -czf "$out/shared.tar.gz" -C "$out" shared
rm -rf "$out/shared"
# Runtime libraries parax-run and Open MPI need that a CUDA image may lack
# (CUDA's own libraries come from the image). Unpacked there without
# overwriting anything.
packages="libevent-core-2.1-7 libevent-pthreads-2.1-7 libgfortran5 libhwloc15 libmunge2
          libdnnl2 ocl-icd-libopencl1 libopenmpi3 libprotobuf32 libquadmath0 libpmix2 openmpi-bin
          openmpi-common"
(cd "$out/debs" && apt-get download $packages >/dev/null)
# The device tool carries 64 MiB at most, the bundle with the working tree
# (links as links): say so here, not on the GPU machine.
bytes="$(du -sb --apparent-size "$out" | cut -f1)"
tree="$(cd "$root" && git ls-files -z | xargs -0 du -cb --apparent-size | tail -1 | cut -f1)"
echo "gpu-bundle: $((bytes / 1048576)) MiB in $out, $(((bytes + tree) / 1048576)) MiB with the working tree"
if (( bytes + tree > 64 * 1048576 )); then
  echo "gpu-bundle: more than the 64 MiB the device tool carries: leave cases out (the list above)" >&2
  exit 1
fi
