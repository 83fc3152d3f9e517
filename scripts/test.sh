#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs every test (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)"
