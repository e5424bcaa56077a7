#!/usr/bin/env bash
# The project's test command: installs everything on a fresh machine, then
# runs the whole suite (multi-process tests spawn real ranks on loopback).
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/system_packages.sh  # ccache, libssl-dev, iproute2, Open MPI where missing
source scripts/build_cache.sh
# The suite needs the test hooks (_C.testing, fault injection), which releases leave out.
export TORCH_RINGDIST_TESTING=1
bash scripts/install.sh
# The aarch64 cross-build and emulated run (tests/test_arm.py): cross compiler, qemu-user,
# the aarch64 torch wheel's headers and libraries.
bash scripts/setup_arm.sh
bash scripts/run_pytest.sh "$PY" "$@"
