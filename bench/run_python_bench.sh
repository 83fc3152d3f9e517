#!/usr/bin/env bash
# The Python drop-ins' benchmark of bench/README.md (bench/python_bench.py), in one run:
#   bench/run_python_bench.sh [ROUNDS] [more python_bench.py options, e.g. --cases load_file]
# Writes the record to bench/results/python-DATE.json (python-DATE-HHMM.json when that exists;
# never overwrites one) and the table to stdout.
#   PYTHON=INTERPRETER      the interpreter of the timed runs: torch, safetensors, diffusers,
#                           transformers, accelerate and loadstone importable (default: python3)
#   LOADSTONE_PYTHONPATH=D  prepended to PYTHONPATH (a development copy of the package)
#   MODEL=DIR               the 3.6 GiB bench model of the shards case (default
#                           /var/tmp/loadstone-bench-llama40; made once with build/loadstone demo)
#   WORKDIR=DIR             where the generated models live (default /var/tmp/loadstone-pybench)
# Run it on a quiet machine: every run is timed against the others in the same shuffled loop.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
python=${PYTHON:-python3}
model=${MODEL:-/var/tmp/loadstone-bench-llama40}
workdir=${WORKDIR:-/var/tmp/loadstone-pybench}
if [ -n "${LOADSTONE_PYTHONPATH:-}" ]; then
  export PYTHONPATH="$LOADSTONE_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c 'import torch, safetensors, loadstone.torch' || {
  echo "$python cannot import torch, safetensors and loadstone: set PYTHON (and LOADSTONE_PYTHONPATH)" >&2
  exit 1
}
mkdir -p bench/results
out=bench/results/python-$(date +%Y-%m-%d).json
[ -e "$out" ] && out=bench/results/python-$(date +%Y-%m-%d-%H%M).json  # never overwrite a record
[ -e "$out" ] && out=bench/results/python-$(date +%Y-%m-%d-%H%M%S).json
"$python" bench/python_bench.py --python "$python" --rounds "$rounds" --model "$model" \
  --workdir "$workdir" --json "$out" "$@"
echo "$out"
