#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds examples/embed against the
# installed package (not the build tree) and runs it.
#   install-and-build.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source="$2"
work="$(mktemp -d /tmp/parax-embed.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source/examples/embed" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/parax-embed-example" dgx-h100:devices_per_node=4 decode:batch=8,context=4096 \
  "$work/embed.pxe"
"$work/build/parax-embed-runtime" "$work/embed.pxe"
# The runtime-only program must not link MLIR or LLVM.
if ldd "$work/build/parax-embed-runtime" | grep -E "libMLIR|libLLVM"; then
  echo "parax-embed-runtime links MLIR/LLVM" >&2
  exit 1
fi
echo "runtime-only: no MLIR, no LLVM"
