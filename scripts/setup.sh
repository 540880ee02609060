#!/usr/bin/env bash
# Installs everything parax needs on a fresh Debian 12 machine, then configures
# and builds. Idempotent: when every package is present it only (re)builds.
#
#   scripts/setup.sh            # install + configure + build into ./build
#   PARAX_SKIP_BUILD=1 scripts/setup.sh   # install only
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PARAX_BUILD_DIR:-$root/build}"

# --- Debian packages -------------------------------------------------------
apt_packages=(
  # compiler half: MLIR/LLVM 22 (bookworm-security)
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  # build
  cmake ninja-build ccache g++ pkg-config
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  # the loaders' libFuzzer target (test/fuzz): clang and its fuzzer runtime
  clang-14 libclang-rt-14-dev
  # runtime half
  libopenmpi-dev openmpi-bin libdnnl-dev libprotobuf-dev protobuf-compiler zlib1g-dev
  # python (the project venv is made from Debian's interpreter)
  python3 python3-venv
)

missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  log="$(mktemp /tmp/parax-apt.XXXXXX.log)"
  if ! { $sudo_cmd apt-get update -qq && \
         $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log"
    echo "setup: apt-get failed (full log: $log)" >&2
    exit 1
  fi
else
  echo "setup: Debian packages present"
fi

# --- Python virtual environment (pinned) -----------------------------------
venv="$root/.venv"
req="$root/python/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing pinned Python packages"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
else
  echo "setup: Python packages present"
fi

# --- cudnn-frontend (header-only, pinned) -----------------------------------
# The CUDA backend's attention through cuDNN's SDPA graphs needs the
# frontend's headers (PyPI's nvidia-cudnn-frontend wheel; its Python half
# and dependencies are not installed) beside the toolkit's cuDNN. Without
# them the CUDA backend builds with its own attention kernels only.
fe_version=1.32.0
fe_dir="$venv/cudnn-frontend"
if [ -f /usr/local/cuda/include/cudnn.h ] &&
   [ "$(cat "$fe_dir/VERSION" 2>/dev/null)" != "$fe_version" ]; then
  echo "setup: unpacking cudnn-frontend $fe_version's headers"
  fe_tmp="$(mktemp -d)"
  if "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
       -d "$fe_tmp" "nvidia-cudnn-frontend==$fe_version"; then
    rm -rf "$fe_dir"
    "$venv/bin/python" - "$fe_tmp" "$fe_dir" <<'PY'
import glob, sys, zipfile
with zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]) as wheel:
    for name in wheel.namelist():
        if name.startswith("include/"):
            wheel.extract(name, sys.argv[2])
PY
    echo "$fe_version" > "$fe_dir/VERSION"
  else
    echo "setup: cudnn-frontend not downloaded: the CUDA backend builds without cuDNN attention" >&2
  fi
  rm -rf "$fe_tmp"
fi

# --- configure + build -----------------------------------------------------
if [ "${PARAX_SKIP_BUILD:-0}" = 1 ]; then exit 0; fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DPython3_EXECUTABLE="$venv/bin/python" ${PARAX_CMAKE_ARGS:-}
fi
jobs="${PARAX_JOBS:-$(nproc)}"
cmake --build "$build" -j "$jobs"
