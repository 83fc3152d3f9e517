#!/usr/bin/env bash
# Builds the libFuzzer programs of tests/fuzz (clang, ASan+UBSan, in build-fuzz/) and runs a
# target, or each in turn, for MINUTES, from its seed corpus (tests/fuzz/corpus/TARGET) into a
# working corpus (build-fuzz/corpus/TARGET). A crash, leak or allocation beyond 2 GiB is written
# to tests/fuzz/regressions/TARGET/: fix it, and commit the input — ctest -L fuzz replays it.
# Prints each target's executions/s, coverage and findings (libFuzzer's final stats) and keeps
# the log in build-fuzz/fuzz-TARGET.log.
# Usage: scripts/fuzz.sh [TARGET|all] [MINUTES]   (default: all 1; MINUTES 0: build only)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
minutes=${2:-1}
targets=(safetensors_header pickle checkpoint config strings zip gguf folder quant_state json_scan)
if [ "$which" != all ]; then
  [[ " ${targets[*]} " == *" $which "* ]] || { echo "fuzz.sh: no target $which (${targets[*]})" >&2; exit 2; }
  targets=("$which")
fi
scripts/setup.sh
if ! dpkg-query -W -f='${Status}' clang 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang
fi
# -O1 -g1 as in scripts/sanitize.sh: a third of -O2 -g's compile time, line numbers kept.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DLOADSTONE_FUZZ=ON -DLOADSTONE_CUDA=OFF -DLOADSTONE_TORCH=OFF > /dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}" > /dev/null
[ "$minutes" -gt 0 ] || exit 0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "tests/fuzz/regressions/$t"
  dict=tests/fuzz/dicts/json.dict
  for own in pickle zip gguf; do [ "$t" = "$own" ] && dict="tests/fuzz/dicts/$own.dict"; done
  echo "fuzz.sh: $t for $minutes min" >&2
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "build-fuzz/tests/fuzz/fuzz_$t" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" \
    -dict="$dict" -max_total_time=$((minutes * 60)) -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="tests/fuzz/regressions/$t/" \
    > "build-fuzz/fuzz-$t.log" 2>&1 || echo "fuzz.sh: $t found something: see build-fuzz/fuzz-$t.log" >&2
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)|cov: " \
    "build-fuzz/fuzz-$t.log" | tail -5
done
