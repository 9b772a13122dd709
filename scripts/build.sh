#!/usr/bin/env bash
# Installs the build dependencies (scripts/setup.sh) and builds everything into ${BUILD_DIR:-build}.
# CUDA targets are built when a CUDA toolkit is found (/usr/local/cuda); the rest never needs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
