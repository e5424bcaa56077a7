#!/usr/bin/env bash
# Runs the suite with the Python given as $1 (further arguments go to pytest); "no tests
# collected" (pytest's exit code 5) fails instead of passing. Every run reports the 25 slowest
# tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1
shift
export OMP_NUM_THREADS=1
# -P: do not put the source tree on sys.path, so the tests import the
# installed package (with its compiled extension), not ./torch_ringdist.
set +e
"$PY" -P -m pytest tests -q -rs --timeout=900 --durations=25 --durations-min=1 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$status"
