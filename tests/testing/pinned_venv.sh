# Sourced by the test scripts that need PyPI packages (tests/python/run.sh, tests/tools/s3/run.sh):
#   pinned_venv VENV REQUIREMENTS WHAT
# makes VENV with the pins of REQUIREMENTS, once per change of that file (its hash is kept in
# VENV/.pins), and exits 77 (CTest: skipped, with the reason) when it cannot: no python3-venv,
# or no PyPI. WHAT names the tests in what is printed.
pinned_venv() {
  local venv=$1 requirements=$2 what=$3 pins
  pins=$(sha256sum "$requirements" | cut -d' ' -f1)
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
  [ "$(cat "$venv/.pins" 2>/dev/null)" = "$pins" ] && return 0
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "SKIPPED: cannot make a venv (python3 -m venv failed; install python3-venv)"
    exit 77
  fi
  echo "$what: installing the pinned libraries into $venv"
  if ! "$venv/bin/pip" install -q --timeout 60 --retries 3 -r "$requirements"; then
    rm -rf "$venv"
    echo "SKIPPED: cannot install $requirements from PyPI (offline?); nothing was tested"
    exit 77
  fi
  echo "$pins" > "$venv/.pins"
}
