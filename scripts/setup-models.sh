#!/usr/bin/env bash
# Installs the Debian packages the model zoo (`make zoo`, perf/models.py) needs: torchvision and
# torchaudio for Debian's python3-torch, a threaded OpenBLAS and matplotlib (the chart). Optional (not part of
# `make test`); idempotent, skips what is present (the installer is setup-deps.sh's).
set -euo pipefail
exec bash "$(dirname "$0")/setup-deps.sh" python3-torchvision python3-torchaudio libopenblas0-pthread python3-matplotlib
