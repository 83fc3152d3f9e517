#!/usr/bin/env bash
# Configures and builds all of loadstone into build/ (Release): the library, the CLI, the tests,
# the benchmarks, the LibTorch face and the CUDA backend when their dependencies are found.
# Extra arguments go to CMake. (scripts/demo.sh builds the CLI alone into the same folder: the
# options are given here again so that what it turned off comes back.)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOADSTONE_TESTS=ON -DLOADSTONE_TOOLS=ON \
  -DLOADSTONE_BENCH=ON -DLOADSTONE_TORCH=AUTO -DLOADSTONE_CUDA=AUTO "$@" >/dev/null
cmake --build build -j"$(nproc)"
