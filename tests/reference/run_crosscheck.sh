#!/usr/bin/env bash
# CTest's reference_crosscheck: run_crosscheck.sh VENV_DIR LOADSTONE_CLI WRITE_TOOL
# Makes VENV_DIR once with the pinned reference (tests/fixtures/st_reference.py PINS) and runs
# crosscheck.py. Exits 77 (CTest: skipped, with the reason) when the venv cannot be made, e.g.
# no PyPI. LOADSTONE_CROSSCHECK_SEED / LOADSTONE_CROSSCHECK_COUNT replay or resize a run.
set -uo pipefail
export PYTHONDONTWRITEBYTECODE=1
venv_dir=$1 cli=$2 write_tool=$3
here=$(cd "$(dirname "$0")" && pwd)
fixtures="$here/../fixtures"
pins=$(cd "$fixtures" && python3 -c 'import st_reference; print(" ".join(st_reference.PINS))') || {
  echo "SKIPPED: reference_crosscheck needs python3, which did not run"
  exit 77
}
if [ "$(cat "$venv_dir/.pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$venv_dir"
  if ! python3 -m venv "$venv_dir"; then
    echo "SKIPPED: reference_crosscheck cannot make a venv (python3 -m venv failed; install python3-venv)"
    exit 77
  fi
  # shellcheck disable=SC2086
  if ! "$venv_dir/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 2 $pins; then
    rm -rf "$venv_dir"
    echo "SKIPPED: reference_crosscheck cannot install $pins from PyPI (offline?); nothing was compared"
    exit 77
  fi
  echo "$pins" > "$venv_dir/.pins"
fi
args=(--loadstone "$cli" --write-tool "$write_tool")
[ -n "${LOADSTONE_CROSSCHECK_SEED:-}" ] && args+=(--seed "$LOADSTONE_CROSSCHECK_SEED")
[ -n "${LOADSTONE_CROSSCHECK_COUNT:-}" ] && args+=(--count "$LOADSTONE_CROSSCHECK_COUNT")
exec "$venv_dir/bin/python" "$here/crosscheck.py" "${args[@]}"
