#!/usr/bin/env bash
# Makes the project's Python: .venv/ in the checkout, from the machine's Python 3.11, with the
# pinned packages of the requirements files given (default: requirements.txt). Idempotent: the
# venv is made once, and pip runs only when a requirements file changed since it last ran.
#   scripts/setup-python.sh [requirements.txt ...]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
reqs=("$@")
[ ${#reqs[@]} -gt 0 ] || reqs=(requirements.txt)

if [ ! -x "$VENV/bin/python" ]; then
  py=$(command -v python3.11 || true)
  if [ -z "$py" ]; then
    echo "setup-python: python3.11 not found (dynamo's Python package and extensions are for CPython 3.11)" >&2
    exit 1
  fi
  echo "setup-python: creating $VENV with $($py --version 2>&1)"
  "$py" -m venv "$VENV"
fi

for req in "${reqs[@]}"; do
  stamp="$VENV/.installed-$(basename "$req")"
  sum=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then continue; fi
  echo "setup-python: installing $req into $VENV (torch is a large wheel: a minute or two)"
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$req" \
      > "$VENV/pip.log" 2>&1; then
    grep -v "^WARNING: Location .* is ignored" "$VENV/pip.log" | tail -20 >&2
    echo "setup-python: pip could not install $req (whole log: $VENV/pip.log)" >&2
    exit 1
  fi
  echo "$sum" > "$stamp"
done
