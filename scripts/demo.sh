#!/usr/bin/env bash
# Sets up, builds and runs loadstone's main job on its built-in default model (the README's
# main-job command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/loadstone demo "$@"
