#!/usr/bin/env bash
# Makes one of the project's Pythons: a venv in the checkout (.venv from CPython 3.11, the
# default; .venv-3.12 and .venv-3.13 beside it for the other supported versions) with the pinned
# packages of the requirements files given (default: requirements.txt). Idempotent: the venv is
# made once, and pip runs only when a requirements file changed since it last ran.
#   [PYTHON_VERSION=3.12] [VENV=.venv-3.12] scripts/setup-python.sh [requirements.txt ...]
# With OPTIONAL=1 a CPython that is not on the machine is reported and skipped (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${PYTHON_VERSION:-3.11}
VENV=${VENV:-.venv}
reqs=("$@")
[ ${#reqs[@]} -gt 0 ] || reqs=(requirements.txt)

find_python() {  # python$ver on PATH that runs (a pyenv shim may name a version not selected), else pyenv's
  local p
  p=$(command -v "python$ver" || true)
  if [ -n "$p" ] && "$p" -c "" 2>/dev/null; then echo "$p"; return; fi
  local root
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for p in "$root"/versions/"$ver".*/bin/python"$ver"; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
}

if [ ! -x "$VENV/bin/python" ]; then
  py=$(find_python)
  if [ -z "$py" ]; then
    if [ "${OPTIONAL:-0}" = 1 ]; then
      echo "setup-python: python$ver not found: skipping $VENV (its tests do not run)" >&2
      exit 0
    fi
    echo "setup-python: python$ver not found (dynamo runs on CPython 3.11, 3.12 and 3.13)" >&2
    exit 1
  fi
  echo "setup-python: creating $VENV with $($py --version 2>&1)"
  "$py" -m venv "$VENV"
fi

for req in "${reqs[@]}"; do
  stamp="$VENV/.installed-$(basename "$req")"
  sum=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then continue; fi
  if [ "$ver" = 3.11 ]; then
    echo "setup-python: installing $req into $VENV (torch is a large wheel: a minute or two)"
  else
    echo "setup-python: installing $req into $VENV (pip downloads torch for Python $ver, with its CUDA libraries: about 3 GB the first time)"
  fi
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$req" \
      > "$VENV/pip.log" 2>&1; then
    grep -v "^WARNING: Location .* is ignored" "$VENV/pip.log" | tail -20 >&2
    echo "setup-python: pip could not install $req (whole log: $VENV/pip.log)" >&2
    exit 1
  fi
  echo "$sum" > "$stamp"
done
