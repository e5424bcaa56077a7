#!/usr/bin/env bash
# The project's test command: installs everything on a fresh machine, then
# runs the whole suite (multi-process tests spawn real ranks on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh
# The multi-host recipe test emulates hosts with network namespaces (ip, tc); the C++
# tests launch the LibTorch example with mpirun too (Open MPI, pinned as in
# benchmarks/setup_mpi.sh).
packages=()
command -v tc >/dev/null || packages+=(iproute2)
command -v mpirun >/dev/null || packages+=(openmpi-bin=4.1.4-3+b1)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q && apt-get install -y -q "${packages[@]}" >/dev/null
fi
# The aarch64 cross-build and emulated run (tests/test_arm.py): cross compiler, qemu-user,
# the aarch64 torch wheel's headers and libraries.
bash scripts/setup_arm.sh
bash scripts/run_pytest.sh "$PY" "$@"
