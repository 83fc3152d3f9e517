#!/usr/bin/env bash
# The GPU check. Run THERE (one H200, no package registry; PyTorch, safetensors, accelerate,
# nvcc and CMake present), from the repository root, with .debs and .whl carried (made here by
# bench/gpu/fetch-debs.sh). Everything it reports goes to $OUT as JSON/logs:
#   build.log, ctest.json (+ ctest.log), bench.json (+ bench.log), summary.json
# Each step is bounded with `timeout`; the whole run stays well under 8 minutes.
# Usage: OUT=/some/dir bench/gpu/check.sh [--configure-only] [--size-gb N]
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
declare -A STEP
step() {  # step NAME SECONDS CMD...: runs with a time limit, records its exit status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
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
TORCH_CMAKE=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2> /dev/null || true)
step configure 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr;${TORCH_CMAKE}" \
  -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLOADSTONE_CUDA=ON \
  > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
[ "$CONFIGURE_ONLY" -eq 1 ] && exit 0

# 4. Build, the GPU tests, the benchmark.
step build 240 cmake --build "$BUILD" -j"$JOBS" > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
step ctest 150 ctest --test-dir "$BUILD" -L gpu --output-on-failure \
  --output-junit "$OUT/ctest.xml" > "$OUT/ctest.log" 2>&1
tail -30 "$OUT/ctest.log"
export PYTHONUNBUFFERED=1
step bench 300 python3 bench/gpu/bench.py --out "$OUT/bench.json" --size-gb "$SIZE_GB" \
  --loadstone "$BUILD/tools/loadstone/loadstone" > "$OUT/bench.log" 2>&1
tail -40 "$OUT/bench.log"
