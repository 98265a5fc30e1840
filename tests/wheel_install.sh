#!/usr/bin/env bash
# The Python package as a user gets it: `pip wheel .` (pyproject.toml: CMake through
# scikit-build-core, in pip's isolated build environment, against the torch of the Python that
# runs pip), the wheel installed into a directory of its own, and then, from outside the source
# tree and without DYNAMO_LIBRARY: import, a compiled native call, both extensions, the
# torch.compile backend found through the entry point, `python -m dynamo`, the C header.
#   tests/wheel_install.sh SRC BUILD    (PYTHON: the Python with torch, .venv/bin/python)
set -euo pipefail
src=$1
build=$2
py=${PYTHON:?the project Python (.venv/bin/python)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The wheel's CMake build is kept in $build/wheel: a second run rebuilds only what changed.
if ! "$py" -m pip wheel --no-deps --disable-pip-version-check -q -C build-dir="$build/wheel" \
    -w "$tmp/dist" "$src" > "$tmp/pip.log" 2>&1; then
  tail -30 "$tmp/pip.log" >&2
  echo "wheel_install: pip wheel failed" >&2
  exit 1
fi
wheel=$(ls "$tmp"/dist/dynamo-*.whl)
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
case "$(basename "$wheel")" in
  dynamo-0.1.0-cp311-cp311-linux_x86_64.whl) ;;
  *) echo "wheel_install: unexpected wheel name $(basename "$wheel")" >&2; exit 1 ;;
esac
# What the wheel holds: the package, the one library file, both extensions, the header, the
# metadata with its entry point and the Python and torch it requires; nothing of the tests.
"$py" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["dynamo/__init__.py", "dynamo/__main__.py", "dynamo/libdynamo.so.0", "dynamo/_build.py",
        "dynamo/include/dynamo/dynamo.h", "dynamo-0.1.0.dist-info/entry_points.txt"]
missing = [n for n in need if n not in names]
assert not missing, missing
assert any(n.startswith("dynamo/_evalframe.cpython-311") for n in names), names
assert any(n.startswith("dynamo/_fastcall.cpython-311") for n in names), names
assert not [n for n in names if "test" in n.split("/")[0] or n.endswith(".pyc")], names
z = zipfile.ZipFile(sys.argv[1])
meta = z.read("dynamo-0.1.0.dist-info/METADATA").decode()
assert "Requires-Python: <3.14,>=3.11" in meta or "Requires-Python: >=3.11,<3.14" in meta, meta
assert "Requires-Dist: torch==2.14.1" in meta, meta
entry = z.read("dynamo-0.1.0.dist-info/entry_points.txt").decode()
assert "[torch_dynamo_backends]" in entry and "dynamo.compile_backend:backend" in entry, entry
print(f"wheel contents: {len(names)} files, metadata and entry point: ok")
PY

"$py" -m pip install --no-deps --disable-pip-version-check -q --target "$tmp/site" "$wheel"
cd "$tmp"
export PYTHONPATH="$tmp/site"
unset DYNAMO_LIBRARY
"$py" - <<'PY'
import os, torch, dynamo
from dynamo import frontend, hook, _capi
here = os.getcwd()
assert dynamo.__file__.startswith(here), dynamo.__file__
f = dynamo.optimize(lambda x: torch.relu(x) * 2)
x = torch.randn(10)
f(x)
assert torch.equal(f(x), torch.relu(x) * 2) and dynamo.counters()["native_runs"] == 1
assert frontend._fastcall() is not None and hook._load() is not None
print("installed package: import, compile, native run, extensions: ok")
PY
# torch.compile finds backend="dynamo" through the entry point, without `import dynamo` first.
"$py" - <<'PY'
import os, torch
f = torch.compile(lambda x: torch.relu(x) * 2, backend="dynamo")
x = torch.randn(10)
for _ in range(3):
    assert torch.equal(f(x), torch.relu(x) * 2)
import dynamo
assert dynamo.__file__.startswith(os.getcwd()), dynamo.__file__
assert dynamo.counters()["native_runs"] >= 1, dynamo.counters()
print("installed entry point: torch.compile(backend=\"dynamo\"): ok")
PY
cat > "$tmp/script.py" <<'PY'
import torch
def f(x):
    return torch.sigmoid(x) * x
for _ in range(3):
    y = f(torch.randn(64))
print("script ran")
PY
out=$("$py" -m dynamo --report "$tmp/script.py" 2>&1)
echo "$out" | grep -q "script ran" || { echo "$out" >&2; echo "wheel_install: python -m dynamo failed" >&2; exit 1; }
echo "python -m dynamo --report script.py: ok"
