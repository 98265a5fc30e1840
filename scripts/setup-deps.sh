#!/usr/bin/env bash
# Installs the Debian packages dynamo builds and tests with; idempotent, skips what is present.
# With arguments, installs those packages instead (scripts/setup-models.sh).
set -euo pipefail

PKGS=(
  cmake make g++ pkg-config
  llvm-19-dev libzstd-dev zlib1g-dev libedit-dev libffi-dev libxml2-dev libcurl4-openssl-dev
  libtorch-dev python3-torch python3-pytest python3-hypothesis python3-numpy python3-dev pybind11-dev
  libsleef-dev libcmocka-dev libdlpack-dev
  libopenblas0-pthread libdnnl-dev libjemalloc2
  python3-networkx
)

if [ $# -gt 0 ]; then PKGS=("$@"); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-deps: done"
