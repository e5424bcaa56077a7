#!/usr/bin/env bash
# The quick check: every layer once (kernels, transports, each collective on two worlds, the
# c10d backend, hooks, DiLoCo, failures, the doctor, the docs) in under 3 minutes on a 2-core
# machine, on the installed package. Run it after scripts/install.sh; the full suite
# (scripts/test.sh) is what CI runs. Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)
bash scripts/run_pytest.sh "$PY" -m "quick and not slow" "$@"
echo "quick check finished in $(( $(date +%s) - start )) s"
