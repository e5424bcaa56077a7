#!/usr/bin/env bash
# The project's test command: installs everything on a fresh machine, then
# runs the whole suite (multi-process tests spawn real ranks on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh
bash scripts/run_pytest.sh "$PY" "$@"
