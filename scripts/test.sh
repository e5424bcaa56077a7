#!/usr/bin/env bash
# The project's test command: installs everything on a fresh machine, then
# runs the whole suite (multi-process tests spawn real ranks on loopback).
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# System packages the suite uses, where this user may install them: ccache (every build
# below, scripts/build_cache.sh), iproute2 (hosts emulated with network namespaces), Open
# MPI (the C++ example's mpirun launch; pinned as in benchmarks/setup_mpi.sh), OpenSSL's
# libcrypto headers (the build links libcrypto: the TCP transport's encryption).
packages=()
command -v ccache >/dev/null || packages+=(ccache)
[ -f /usr/include/openssl/evp.h ] || packages+=(libssl-dev)
command -v tc >/dev/null || packages+=(iproute2)
command -v mpirun >/dev/null || packages+=(openmpi-bin=4.1.4-3+b1)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q && apt-get install -y -q "${packages[@]}" >/dev/null
fi
source scripts/build_cache.sh
# The suite needs the test hooks (_C.testing, fault injection), which releases leave out.
export TORCH_RINGDIST_TESTING=1
bash scripts/install.sh
# The aarch64 cross-build and emulated run (tests/test_arm.py): cross compiler, qemu-user,
# the aarch64 torch wheel's headers and libraries.
bash scripts/setup_arm.sh
bash scripts/run_pytest.sh "$PY" "$@"
