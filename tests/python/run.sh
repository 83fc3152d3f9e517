#!/usr/bin/env bash
# The Python tests: tests/python/run.sh [pytest args...]
# Makes (once per change of requirements.txt) a venv with the pinned libraries under
# build/pyvenv (LOADSTONE_PYVENV elsewhere), installs the package as a user does (`pip install .`
# at the checkout's root: scikit-build-core builds libloadstone and the extension, incrementally
# in build/wheel), and runs pytest on tests/python from outside the checkout, so that
# `import loadstone` is the installed package. Exits 77 (CTest: skipped, with the reason) when
# the venv cannot be made, e.g. no PyPI.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${LOADSTONE_PYVENV:-$root/build/pyvenv}
# shellcheck source=../testing/pinned_venv.sh
. "$root/tests/testing/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" "python tests"
echo "python tests: pip install $root"
"$venv/bin/pip" install -q --timeout 60 --retries 3 "$root" || exit 1
cd "$(mktemp -d)" || exit 1
trap 'rm -rf "$PWD"' EXIT
"$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  --rootdir "$here" "$here" "$@"
