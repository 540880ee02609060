#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (lit, GoogleTest,
# pytest) through ctest. This is the README's test command and what CI runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PARAX_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
ctest --test-dir "$build" --output-on-failure --timeout 900 -j "$(nproc)"
