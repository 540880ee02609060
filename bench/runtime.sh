#!/usr/bin/env bash
# CPU runtime figures (not a test): dispatch overhead per instruction, the
# linear path against calling oneDNN's sgemm directly on the same shapes, and
# MPI collective algbw / busbw on 4 ranks (nccl-tests definitions).
#
#   bench/runtime.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       OMPI_MCA_btl_vader_single_copy_mechanism=none
"$build/bin/parax-runtime-bench"
timeout 300 mpirun -np 4 --oversubscribe --bind-to none "$build/bin/parax-runtime-bench"
