#!/usr/bin/env bash
# Builds examples/rust (std FFI only, no crates) against the built library and runs it.
# Skipped, saying so, when no Rust compiler is installed.
set -euo pipefail
src=$1
build=$2
RUSTC=${RUSTC:-$(command -v rustc || true)}
if [ -z "$RUSTC" ] && [ -x "$HOME/.cargo/bin/rustc" ]; then RUSTC=$HOME/.cargo/bin/rustc; fi
if [ -z "$RUSTC" ]; then
  echo "SKIPPED: no rustc found (install Rust to build examples/rust)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$RUSTC" --edition 2021 -O -L "$build" -l dynamo -C link-arg=-Wl,-rpath,"$build" \
  "$src/examples/rust/main.rs" -o "$tmp/example_rust"
"$tmp/example_rust"
