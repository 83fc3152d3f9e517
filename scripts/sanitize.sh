#!/usr/bin/env bash
# Builds and runs the test suite under ASan+UBSan and under TSan (separate build folders). The
# package and Python tests are left out: a program outside the build (or Python) cannot load a
# sanitized library.
# Usage: scripts/sanitize.sh [asan|tsan|all] [ctest args...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
shift || true
extra=("$@")
scripts/setup.sh

run() {  # name, sanitizers, env
  local dir="build-$1"
  # -O1 -g1, as the sanitizers' own docs advise: a third of -O2 -g's compile time, and line
  # numbers kept for their reports.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DLOADSTONE_SANITIZE="$2" -DLOADSTONE_CUDA=OFF -DLOADSTONE_TORCH=OFF >/dev/null
  cmake --build "$dir" -j"$(nproc)"
  (cd "$dir" && env $3 ctest --output-on-failure -j"$(nproc)" -LE "reference|gpu|package|python" "${extra[@]}")
}

if [[ "$which" == asan || "$which" == all ]]; then
  run asan address,undefined \
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1"
fi
if [[ "$which" == tsan || "$which" == all ]]; then
  run tsan thread "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1"
fi
