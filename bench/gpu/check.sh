#!/usr/bin/env bash
# The GPU check. Run THERE (one H200, no package registry; PyTorch, safetensors, accelerate,
# nvcc and CMake present), from the repository root, with .debs and .whl carried (made here by
# bench/gpu/fetch-debs.sh). Everything it reports goes to $OUT as JSON/logs:
#   configure.log, build.log, ctest.xml (+ ctest.log), bench.json (+ bench.log), summary.json
# Each step is bounded with `timeout` and by a deadline for the whole run (DEADLINE seconds,
# default 540, under the device tool's 600 s per command): a step that would pass it gets only
# the time left, one that has none is recorded as skipped, and the benchmark stops starting
# measurements in time (the results it has are in bench.json all along).
# Usage: OUT=/some/dir [DEADLINE=540] bench/gpu/check.sh [--configure-only] [--size-gb N]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
CONFIGURE_ONLY=0
SIZE_GB=8
while [ $# -gt 0 ]; do
  case "$1" in
    --configure-only) CONFIGURE_ONLY=1 ;;
    --size-gb) SIZE_GB=$2; shift ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export PREFIX=${PREFIX:-/tmp/loadstone-deps}
BUILD=${BUILD:-build-gpu}
JOBS=$(nproc)
DEADLINE=${DEADLINE:-540}
declare -A STEP
step() {  # step NAME SECONDS CMD...: runs with a time limit, records its exit status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 10 ]; then
    STEP[$name]="{\"rc\": 124, \"seconds\": 0, \"skipped\": \"out of time\"}"
    echo "check.sh: $name skipped: out of time" >&2
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  STEP[$name]="{\"rc\": $rc, \"seconds\": $((SECONDS - t0))}"
  echo "check.sh: $name rc=$rc in $((SECONDS - t0)) s" >&2
  return $rc
}
summary() {
  {
    echo "{"
    local first=1
    for k in "${!STEP[@]}"; do
      [ $first -eq 1 ] || echo ","
      first=0
      printf '  "%s": %s' "$k" "${STEP[$k]}"
    done
    echo ""
    echo "}"
  } > "$OUT/summary.json"
}
trap summary EXIT

# 1. The Debian packages the image lacks, unpacked into a prefix (never into /).
unpack() {
  mkdir -p "$PREFIX"
  for f in .debs/*.deb; do dpkg -x "$f" "$PREFIX" || return 1; done
  # .pc files say prefix=/usr: point them into the prefix.
  for pc in "$PREFIX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i -e "s|^prefix=/usr\$|prefix=$PREFIX/usr|" \
      -e "s|^libdir=/usr/|libdir=$PREFIX/usr/|" -e "s|^includedir=/usr/|includedir=$PREFIX/usr/|" "$pc"
  done
  return 0
}
export -f unpack
step unpack 60 bash -c unpack || exit 1
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig"
PKG_CONFIG=$(command -v pkg-config || echo "$PREFIX/usr/bin/pkgconf")

# 2. The peers' wheels (a wheel that does not install is reported by bench.py as an error).
if [ "$CONFIGURE_ONLY" -eq 0 ] && ls .whl/*.whl > /dev/null 2>&1; then
  step wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# 3. Configure against the prefix and PyTorch's own LibTorch, for Hopper (sm_90).
# PyTorch's CMake files can stop a configure outright (a FATAL_ERROR is not silenced by QUIET,
# e.g. a CUDA library they expect and this toolkit lacks): then configure again without
# LibTorch — nothing built here needs it yet — and say so in configure-torch.log.
TORCH_CMAKE=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2> /dev/null || true)
configure() {  # configure LOADSTONE_TORCH LOG
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr;${TORCH_CMAKE}" \
    -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLOADSTONE_CUDA=ON -DLOADSTONE_TORCH="$1" > "$2" 2>&1
}
export -f configure
export BUILD TORCH_CMAKE PKG_CONFIG
if ! step configure 120 bash -c 'configure "$@"' _ AUTO "$OUT/configure.log"; then
  mv "$OUT/configure.log" "$OUT/configure-torch.log"
  rm -rf "$BUILD"
  step configure-without-torch 120 bash -c 'configure "$@"' _ OFF "$OUT/configure.log" ||
    { tail -40 "$OUT/configure.log"; exit 1; }
fi
[ "$CONFIGURE_ONLY" -eq 1 ] && exit 0

# 4. Build, the GPU tests, the benchmark.
step build 240 cmake --build "$BUILD" -j"$JOBS" > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
step ctest 150 ctest --test-dir "$BUILD" -L gpu --output-on-failure \
  --output-junit "$OUT/ctest.xml" > "$OUT/ctest.log" 2>&1
tail -30 "$OUT/ctest.log"
export PYTHONUNBUFFERED=1
# The measurements start only while 30 s are left: the last one has time to finish.
step bench 300 python3 bench/gpu/bench.py --out "$OUT/bench.json" --size-gb "$SIZE_GB" \
  --budget-s $((DEADLINE - SECONDS - 30)) --loadstone "$BUILD/loadstone" > "$OUT/bench.log" 2>&1
tail -40 "$OUT/bench.log"
