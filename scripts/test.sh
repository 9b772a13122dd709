#!/usr/bin/env bash
# Builds Boulder and runs the whole test suite (unit, integration, end-to-end). GPU tests skip,
# saying so, where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" --timeout 900
