#!/usr/bin/env bash
# Installs the Debian packages the model zoo (`make zoo`, perf/models.py) needs: torchvision and
# torchaudio for Debian's python3-torch, and a threaded OpenBLAS. Optional (not part of
# setup-deps.sh); idempotent, skips what is present.
set -euo pipefail

PKGS=(python3-torchvision python3-torchaudio libopenblas0-pthread)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup-models: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-models: done"
