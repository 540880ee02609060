# Sourced by the CPU-rank benchmarks: `root`, `build` (argument 1), `rounds`
# (argument 2, default 3), `py`, one thread of OpenBLAS a rank, mpirun
# allowed as root, and `work`, a temporary folder removed on exit (named
# after BENCH).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
py="${PARAX_PYTHON:-$root/.venv/bin/python}"
export PARAX_BUILD_DIR="$build" PYTHONPATH="$root/python" OPENBLAS_NUM_THREADS=1 \
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
work="$(mktemp -d "/tmp/parax-${BENCH:-bench}.XXXXXX")"
trap 'rm -rf "$work"' EXIT
