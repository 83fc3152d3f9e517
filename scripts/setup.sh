#!/usr/bin/env bash
# Installs what loadstone needs to build and test on Debian 12. Idempotent; needs root (or sudo).
#   scripts/setup.sh          everything: the library, the CLI, the tests, the LibTorch face and
#                             the Python extension's build
#   scripts/setup.sh --cli    only what the library and the CLI need (scripts/demo.sh)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libasio-dev liburing-dev libfmt-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
)
if [ "${1:-}" != "--cli" ]; then
  # libgloo-dev: the headers c10d's ProcessGroupGloo.hpp includes (the distributed face).
  packages+=(git python3 python3-venv python3-dev catch2 libtorch-dev libgloo-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
