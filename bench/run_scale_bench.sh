#!/usr/bin/env bash
# The tensor-count benchmark of bench/README.md ("Scale with the tensor count"), in one run:
#   bench/run_scale_bench.sh [MODEL_DIR] [REPEAT]
# Makes (once) a 100,000-tensor checkpoint with the real producer (bench/make_many_tensors.py:
# 4 shards x 25,000 bf16 tensors of 1-8 KiB, 460 MB), runs `loadstone bench` warm — loadstone
# and the native baselines and the safetensors peers in one shuffled loop — and writes the
# document to bench/results/scale-DATE[-HHMM].json. VENV=DIR reuses a venv with torch and
# safetensors (else the pins of run_cpu_bench.sh are installed into build/bench-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-/var/tmp/loadstone-many100k}
repeat=${2:-5}
pins="torch==2.5.1 numpy==2.2.6 safetensors==0.8.0"
venv=${VENV:-build/bench-venv}

scripts/build.sh >/dev/null
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q $pins
fi
[ -e "$model/model.safetensors.index.json" ] || "$venv/bin/python" bench/make_many_tensors.py "$model"
out=bench/results/scale-$(date +%Y-%m-%d).json
[ -e "$out" ] && out=bench/results/scale-$(date +%Y-%m-%d-%H%M).json  # never overwrite a record
mkdir -p bench/results
./build/loadstone bench "$model" --repeat "$repeat" --peers "$venv/bin/python bench/peers.py" \
  --json > "$out"
echo "$out"
