#!/usr/bin/env bash
# What the aarch64 check (tests/test_arm.py) needs on an x86-64 machine: Debian's cross
# compiler and qemu-user, and the headers and libraries of PyPI's aarch64 torch wheel of the
# torch version installed here (a CUDA build: only its CPU libraries are unpacked), in
# ${RINGDIST_ARM_TORCH:-$RINGDIST_CACHE/arm-torch/<version>} (scripts/build_cache.sh: outside
# the checkout, so a fresh clone reuses it). Downloads about 410 MB the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/build_cache.sh
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
  apt-get update -q && apt-get install -y -q g++-aarch64-linux-gnu qemu-user-static >/dev/null
fi
version=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
dest=${RINGDIST_ARM_TORCH:-$RINGDIST_CACHE/arm-torch/$version}
if [ ! -f "$dest/torch/share/cmake/Torch/TorchConfig.cmake" ]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
    --python-version "$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
    "torch==$version" -d "$tmp"
  "$PY" - "$tmp" "$dest" <<'PYEOF'
import glob, sys, zipfile
wheel, = glob.glob(f"{sys.argv[1]}/torch-*.whl")
keep = ("torch/include/", "torch/share/cmake/")
libs = {f"torch/lib/lib{n}.so" for n in ("c10", "torch", "torch_cpu", "torch_python")}
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep) or n in libs])
PYEOF
  rm -rf "$tmp"
fi
echo "aarch64 torch $version in $dest"
