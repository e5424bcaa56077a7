#!/usr/bin/env bash
# What the aarch64 check (tests/test_arm.py) needs on an x86-64 machine: Debian's cross
# compiler and qemu-user; the headers and libraries of PyPI's aarch64 torch wheel of the
# torch version installed here (a CUDA build: only its CPU libraries are unpacked), in
# ${RINGDIST_ARM_TORCH:-$RINGDIST_CACHE/arm-torch/<version>}; and OpenSSL's libcrypto for
# aarch64 (the TCP transport's cryptography): Debian's arm64 libssl-dev and libssl3 .debs of
# the libssl-dev version installed here, unpacked (not installed: no foreign dpkg architecture)
# into ${RINGDIST_ARM_OPENSSL:-$RINGDIST_CACHE/arm-openssl/<version>}. Both caches are outside
# the checkout (scripts/build_cache.sh), so a fresh clone reuses them. Downloads about 410 MB
# the first time.
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

ssl_version=$(dpkg-query -W -f '${Version}' libssl-dev)
ssl_dest=${RINGDIST_ARM_OPENSSL:-$RINGDIST_CACHE/arm-openssl/$ssl_version}
if [ ! -f "$ssl_dest/usr/include/openssl/configuration.h" ]; then
  tmp=$(mktemp -d)
  for pkg in libssl-dev libssl3; do
    # The security archive holds the current update, the main archive the point release's.
    for pool in debian-security/pool/updates/main debian/pool/main; do
      if curl -sfL -o "$tmp/$pkg.deb" \
          "http://deb.debian.org/$pool/o/openssl/${pkg}_${ssl_version}_arm64.deb"; then
        break
      fi
      rm -f "$tmp/$pkg.deb"
    done
    [ -f "$tmp/$pkg.deb" ] || { echo "no arm64 $pkg $ssl_version in Debian's archives" >&2; exit 1; }
    mkdir -p "$ssl_dest"
    dpkg-deb -x "$tmp/$pkg.deb" "$ssl_dest"
  done
  # One include folder: the architecture's configuration headers beside the others.
  cp "$ssl_dest"/usr/include/aarch64-linux-gnu/openssl/* "$ssl_dest/usr/include/openssl/"
  rm -rf "$tmp"
fi
echo "aarch64 OpenSSL $ssl_version in $ssl_dest"
