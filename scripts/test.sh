#!/usr/bin/env bash
# The project's test command: installs everything on a fresh machine, then
# runs the whole suite (multi-process tests spawn real ranks on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh
# The multi-host recipe test emulates hosts with network namespaces (ip, tc).
if ! command -v tc >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q && apt-get install -y -q iproute2 >/dev/null
fi
bash scripts/run_pytest.sh "$PY" "$@"
