#!/usr/bin/env bash
# One command for a machine with a GPU (CI has none): builds ringdist with its
# CUDA sources against the torch installed there, runs the CUDA tests and the
# GPU kernel benchmark, and leaves what it measured in ${OUT:-gpu-check}/.
# Installs into a private folder; nothing of the machine's Python changes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
PY=${PYTHON:-python3}
SITE=${RINGDIST_GPU_SITE:-/tmp/ringdist-site}
mkdir -p "$OUT"
{ nvidia-smi || true; "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  2>&1 | tee "$OUT/machine.txt"

start=$(date +%s)
export TORCH_RINGDIST_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
"$PY" -m pip install -q --no-build-isolation --no-deps --upgrade --target "$SITE" . 2>&1 | tee "$OUT/build.log"
echo "built in $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1

set +e
"$PY" -P -m pytest tests/test_shared_arithmetic.py tests/test_cuda_kernels.py -q -rs "$@" 2>&1 \
  | tee "$OUT/tests.log"
tests=${PIPESTATUS[0]}
"$PY" -P benchmarks/cuda_kernels.py --json "$OUT/cuda_kernels.json" 2>&1 | tee "$OUT/bench.log"
bench=${PIPESTATUS[0]}
set -e
echo "tests exit $tests, benchmark exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
