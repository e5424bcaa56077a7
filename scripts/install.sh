#!/usr/bin/env bash
# Sets up a fresh machine: pinned torch (CPU build), the build and test
# tools, then builds and installs torch_ringdist against that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/build_cache.sh

# OpenSSL's libcrypto and its headers (the TCP transport's encryption), where this user may
# install them; elsewhere the build stops naming the package to install.
if [ ! -f /usr/include/openssl/evp.h ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q && apt-get install -y -q libssl-dev >/dev/null
fi
# Pinned: an unpinned "torch" would pull the newest CUDA build (several GB).
"$PY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$PY" -m pip install -q -r scripts/requirements-dev.txt
# The build backend: --no-build-isolation uses the one installed here, and pyproject.toml needs
# setuptools >= 77 (a new venv on Python 3.11 holds 65.5).
"$PY" -m pip install -q setuptools==80.9.0
# --no-build-isolation: compile against the torch installed above. -e: in place, so the
# checkout itself is the installed package (commands run from its root import a built one).
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" -P -c "import torch, torch_ringdist; print('torch', torch.__version__, '| torch_ringdist', torch_ringdist.__version__, '| reduce kernels', torch_ringdist.reduce_kernel_family())"
