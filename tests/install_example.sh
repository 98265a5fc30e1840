#!/usr/bin/env bash
# Installs the built library into a temporary prefix, builds examples/c against it with
# find_package(dynamo) (as an outside project would), and runs the example.
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
# `cmake --install` rewrites $build/install_manifest.txt, which `make uninstall` reads: the
# manifest of a real install is put back afterwards (and a temporary one never left behind).
manifest="$build/install_manifest.txt"
if [ -f "$manifest" ]; then cp "$manifest" "$tmp/manifest.kept"; fi
manifest_sum() { if [ -f "$manifest" ]; then sha1sum < "$manifest"; else echo none; fi; }
manifest_before=$(manifest_sum)
put_back_manifest() {
  if [ -f "$tmp/manifest.kept" ]; then cp "$tmp/manifest.kept" "$manifest"; else rm -f "$manifest"; fi
}
trap 'put_back_manifest; rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples/c" -B "$tmp/example" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/example" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/example/example"

# The same example built with pkg-config instead of CMake.
if command -v pkg-config >/dev/null; then
  flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs dynamo)
  cc -std=c99 -o "$tmp/example_pc" "$src/examples/c/main.c" $flags -lm
  LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/example_pc" >/dev/null
  echo "pkg-config build of examples/c: ok ($flags)"
else
  echo "pkg-config not installed: skipped the pkg-config build"
fi

# The Python package as the project's Python sees it after `make install`, from another directory:
# it must find the installed library and both extensions without the source tree.
cd "$tmp"
env -u DYNAMO_LIBRARY PYTHONPATH="$tmp/prefix/lib/python3.11/site-packages" "${PYTHON:?the project Python (.venv/bin/python)}" - <<'PY'
import torch, dynamo
from dynamo import frontend, hook
assert dynamo.__file__.startswith(__import__("os").getcwd()), dynamo.__file__
f = dynamo.optimize(lambda x: torch.relu(x) * 2)
x = torch.randn(10)
f(x)
assert torch.equal(f(x), torch.relu(x) * 2) and dynamo.counters()["native_runs"] == 1
assert frontend._fastcall() is not None and hook._load() is not None
print("installed Python package: import, compile, native run, extensions: ok")
PY

# torch.compile finds backend="dynamo" through the installed package's entry point, without
# `import dynamo` first.
env -u DYNAMO_LIBRARY PYTHONPATH="$tmp/prefix/lib/python3.11/site-packages" "$PYTHON" - <<'PY'
import sys, torch
f = torch.compile(lambda x: torch.relu(x) * 2, backend="dynamo")
x = torch.randn(10)
for _ in range(3):
    assert torch.equal(f(x), torch.relu(x) * 2)
import dynamo
assert dynamo.__file__.startswith(__import__("os").getcwd()), dynamo.__file__
assert dynamo.counters()["native_runs"] >= 1, dynamo.counters()
print("installed entry point: torch.compile(backend=\"dynamo\"): ok")
PY

put_back_manifest
if [ "$(manifest_sum)" != "$manifest_before" ]; then
  echo "install_example: $manifest differs from before the temporary install" >&2
  exit 1
fi
echo "install_manifest.txt as before the temporary install: ok"
