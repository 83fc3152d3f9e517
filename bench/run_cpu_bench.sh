#!/usr/bin/env bash
# The CPU benchmark of bench/README.md, in one run:
#   bench/run_cpu_bench.sh [MODEL_DIR] [REPEAT]
# Makes (once) a 40-layer synthetic Llama-shaped bf16 checkpoint (3.6 GiB) unless MODEL_DIR is
# given, runs `loadstone bench` cold and warm: loadstone, its pread backend, bf16→f32, the
# first-touch bounds, read-per-tensor, mmap+memcpy, the raw O_DIRECT ceiling and the Python peers
# (safetensors, Run:ai's streamer, from a pinned venv) interleaved in one loop, and writes both
# documents to bench/results/cpu-DATE.json (cpu-DATE-HHMM.json when that exists).
# VENV=DIR reuses a venv that already has the pins.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-/var/tmp/loadstone-bench-llama40}
repeat=${2:-3}
pins="torch==2.5.1 numpy==2.2.6 safetensors==0.8.0 runai-model-streamer==0.17.1"
venv=${VENV:-build/bench-venv}

scripts/build.sh >/dev/null
[ -e "$model" ] || ./build/loadstone demo --layers 40 --dir "$model" >/dev/null
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q $pins
fi
out=bench/results/cpu-$(date +%Y-%m-%d).json
[ -e "$out" ] && out=bench/results/cpu-$(date +%Y-%m-%d-%H%M).json  # never overwrite a record
mkdir -p bench/results
tmp=$(mktemp -d)
peers="$venv/bin/python bench/peers.py"
./build/loadstone bench "$model" --cold --repeat "$repeat" --peers "$peers" --json > "$tmp/cold.json"
./build/loadstone bench "$model" --repeat "$repeat" --peers "$peers" --json > "$tmp/warm.json"
python3 - "$tmp" "$out" <<'PY'
import json, os, platform, sys
tmp, out = sys.argv[1], sys.argv[2]
doc = {mode: json.load(open(os.path.join(tmp, mode + ".json"))) for mode in ("cold", "warm")}
doc["machine"] = {"cpus": os.cpu_count(), "kernel": platform.release()}
json.dump(doc, open(out, "w"), indent=2)
print(out)
PY
rm -rf "$tmp"
