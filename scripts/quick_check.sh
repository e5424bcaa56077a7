#!/usr/bin/env bash
# The quick check: every layer once (kernels, transports, each collective on two worlds, the
# c10d backend, hooks, DiLoCo, failures, the doctor, the docs) in under 3 minutes on a 2-core
# machine. It rebuilds the package from this tree with the test hooks (incremental; run
# scripts/install.sh once first) and tests that. The full suite
# (scripts/test.sh) is what CI runs. Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/build_cache.sh
start=$(date +%s)
# The tree as it is now, with the test hooks the suite needs (only what changed recompiles).
TORCH_RINGDIST_TESTING=1 "$PY" -m pip install -q --no-build-isolation -e .
bash scripts/run_pytest.sh "$PY" -m "quick and not slow" "$@"
echo "quick check finished in $(( $(date +%s) - start )) s"
