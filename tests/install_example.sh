#!/usr/bin/env bash
# Installs the built library into a temporary prefix (`make install PREFIX=...`: the C library,
# header, CMake package and pkg-config file), builds examples/c against it with find_package(dynamo)
# and with pkg-config (as an outside project would), and runs the example. The Python package
# installs with pip: tests/wheel_install.sh.
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

put_back_manifest
if [ "$(manifest_sum)" != "$manifest_before" ]; then
  echo "install_example: $manifest differs from before the temporary install" >&2
  exit 1
fi
echo "install_manifest.txt as before the temporary install: ok"
