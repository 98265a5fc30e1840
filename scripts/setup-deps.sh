#!/usr/bin/env bash
# Installs the Debian packages of dynamo's native side (LLVM, SLEEF, oneDNN, cmocka, DLPack, the
# compilers); idempotent, skips what is present. With arguments, installs those packages instead.
# Python and its packages (torch and the LibTorch the library builds against) are not Debian's:
# scripts/setup-python.sh puts them in .venv/.
set -euo pipefail

PKGS=(
  cmake make g++ pkg-config
  llvm-19-dev libzstd-dev zlib1g-dev libedit-dev libffi-dev libxml2-dev libcurl4-openssl-dev
  libsleef-dev libcmocka-dev libdlpack-dev libdnnl-dev libjemalloc2
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
