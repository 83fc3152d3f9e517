#!/usr/bin/env bash
# Installs what loadstone needs to build and test on Debian 12. Idempotent; needs root (or sudo).
#   scripts/setup.sh          everything: the library, the CLI, the tests, the LibTorch face and
#                             the Python extension's build
#   scripts/setup.sh --cli    only what the library and the CLI need (scripts/demo.sh)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libasio-dev liburing-dev libfmt-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libcurl4-openssl-dev
)
if [ "${1:-}" != "--cli" ]; then
  # libgloo-dev: the headers c10d's ProcessGroupGloo.hpp includes (the distributed face).
  # nginx: the http reader's tests serve files on 127.0.0.1 with it (they start and stop it);
  # openssl makes the certificate of its https listener.
  packages+=(git python3 python3-venv python3-dev catch2 libtorch-dev libgloo-dev nginx openssl)
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
  # Debian's nginx starts a server on port 80 of every address once installed: a policy-rc.d
  # (made here only if there is none, removed after) keeps any service from starting.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    policy=/usr/sbin/policy-rc.d
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" || status=$?
  [ -z "$policy" ] || $SUDO rm -f "$policy"
  [ "$status" -eq 0 ] || exit "$status"
fi
