#!/usr/bin/env bash
# The reference tests' runner: run_with_reference.sh VENV_DIR SCRIPT.py [ARGS...]
# Makes VENV_DIR once with the pinned reference (tests/fixtures/st_reference.py PINS) and runs
# SCRIPT with it. Exits 77 (CTest: skipped, with the reason) when the venv cannot be made, e.g.
# no PyPI. For crosscheck.py, LOADSTONE_CROSSCHECK_SEED / LOADSTONE_CROSSCHECK_COUNT replay or
# resize a run.
set -uo pipefail
export PYTHONDONTWRITEBYTECODE=1
venv_dir=$1 script=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
fixtures="$here/../fixtures"
pins=$(cd "$fixtures" && python3 -c 'import st_reference; print(" ".join(st_reference.PINS))') || {
  echo "SKIPPED: the reference tests need python3, which did not run"
  exit 77
}
if [ "$(cat "$venv_dir/.pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$venv_dir"
  if ! python3 -m venv "$venv_dir"; then
    echo "SKIPPED: the reference tests cannot make a venv (python3 -m venv failed; install python3-venv)"
    exit 77
  fi
  # shellcheck disable=SC2086
  if ! "$venv_dir/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 2 $pins; then
    rm -rf "$venv_dir"
    echo "SKIPPED: the reference tests cannot install $pins from PyPI (offline?); nothing was compared"
    exit 77
  fi
  echo "$pins" > "$venv_dir/.pins"
fi
args=("$@")
if [ "$(basename "$script")" = crosscheck.py ]; then
  [ -n "${LOADSTONE_CROSSCHECK_SEED:-}" ] && args+=(--seed "$LOADSTONE_CROSSCHECK_SEED")
  [ -n "${LOADSTONE_CROSSCHECK_COUNT:-}" ] && args+=(--count "$LOADSTONE_CROSSCHECK_COUNT")
fi
exec "$venv_dir/bin/python" "$script" "${args[@]}"
