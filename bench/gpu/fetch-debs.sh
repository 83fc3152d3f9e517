#!/usr/bin/env bash
# Run HERE (Debian 12, with a package registry): downloads what bench/gpu/check.sh needs on the
# GPU machine, which has no registry, into ignored folders that a device call carries:
#   .debs/  the Debian packages of the build's dependencies (unpacked there with dpkg -x)
#   .whl/   the peers' wheels for the GPU image's Python 3.12 (installed there with pip)
# Prints the sizes; the carry limit is 64 MiB per call for everything together.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEBS=(
  liburing2 liburing-dev          # io_uring
  libfmt9 libfmt-dev
  libasio-dev
  catch2
  nlohmann-json3-dev
  libcli11-dev
  zlib1g zlib1g-dev
  pkgconf pkgconf-bin libpkgconf3 # pkg-config finds liburing; the image may lack it
)
# Pinned peer wheels (+ their small dependencies the image lacks; humanize is there already).
WHEELS=(
  instanttensor==0.2.2
  fastsafetensors==0.5.0
  runai-model-streamer==0.17.1
)

mkdir -p .debs .whl
(cd .debs && apt-get download "${DEBS[@]}")
# manylinux tags as /work/.library/device/README.md says; pip matches N exactly.
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for w in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d .whl "$w" \
    || echo "fetch-debs: no wheel for $w (check.sh reports that peer as not installed)" >&2
done
for w in .whl/*.whl; do
  echo "$w requires: $(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' \
    | grep -v 'extra ==' | sed 's/Requires-Dist: //' | tr '\n' ' ')"
done
du -sh .debs .whl
du -cb .debs .whl | tail -1 | awk '{ printf "total %.1f MiB (carry limit 64 MiB)\n", $1 / 1048576 }'
