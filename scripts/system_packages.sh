#!/usr/bin/env bash
# The system packages the suite and CI's builds use, installed where missing and where this user
# may (root with apt-get): ccache (every build, scripts/build_cache.sh), OpenSSL's libcrypto
# headers (the build links libcrypto: the TCP transport's encryption), iproute2 (hosts emulated
# with network namespaces), Open MPI (the C++ example's mpirun launch; pinned as in
# benchmarks/setup_mpi.sh).
set -euo pipefail
packages=()
command -v ccache >/dev/null || packages+=(ccache)
[ -f /usr/include/openssl/evp.h ] || packages+=(libssl-dev)
command -v tc >/dev/null || packages+=(iproute2)
command -v mpirun >/dev/null || packages+=(openmpi-bin=4.1.4-3+b1)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q && apt-get install -y -q "${packages[@]}" >/dev/null
fi
