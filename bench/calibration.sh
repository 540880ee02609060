#!/usr/bin/env bash
# The closed loop on this machine's CPU ranks (not a test): calibrate the
# cost model on a few parax-run --profile runs, then predict 21 other plans
# and run them. Prints each plan's predicted and measured step and, last,
# the largest |error| and whether the plan predicted best was the measured
# best (bench/calibration.py says how).
#
#   bench/calibration.sh [build-dir] [rounds: 5, about 8 minutes on 2 cores]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${PARAX_PYTHON:-$root/.venv/bin/python}" "$root/bench/calibration.py" \
    --build "${1:-$root/build}" --rounds "${2:-5}"
