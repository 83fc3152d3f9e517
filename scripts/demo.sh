#!/usr/bin/env bash
# Sets up, builds and runs loadstone's main job on its built-in default model (the README's
# main-job command). It installs and builds only what the CLI needs: no tests, no LibTorch face,
# no benchmarks; the CUDA backend only on a machine with a GPU to run it on. Arguments go to
# `loadstone demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --cli
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=AUTO
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOADSTONE_TESTS=OFF -DLOADSTONE_BENCH=OFF \
  -DLOADSTONE_TORCH=OFF -DLOADSTONE_PYTHON=OFF -DLOADSTONE_CUDA="$cuda" >/dev/null
cmake --build build --target loadstone_cli -j"$(nproc)"
./build/loadstone demo "$@"
