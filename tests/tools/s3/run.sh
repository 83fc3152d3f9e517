#!/usr/bin/env bash
# The S3 test: tests/tools/s3/run.sh LOADSTONE_CLI [pytest args...]
# Makes (once per change of requirements.txt) a venv with moto's server and boto3 under
# build/s3venv (LOADSTONE_S3VENV elsewhere) and runs test_s3.py with pytest: moto serves S3 on
# 127.0.0.1 (started and stopped by the test), the CLI loads s3:// addresses from it. Exits 77
# (CTest: skipped, with the reason) when the venv cannot be made, e.g. no PyPI.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cli=${1:?usage: run.sh LOADSTONE_CLI [pytest args...]}
shift
venv=${LOADSTONE_S3VENV:-$root/build/s3venv}
# shellcheck source=../../testing/pinned_venv.sh
. "$root/tests/testing/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" "s3 test"
cd "$(mktemp -d)" || exit 1
trap 'rm -rf "$PWD"' EXIT
LOADSTONE_CLI="$cli" LOADSTONE_FIXTURES="$root/tests/fixtures" MOTO_SERVER="$venv/bin/moto_server" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  --rootdir "$here" "$here/test_s3.py" "$@"
