#!/usr/bin/env bash
# CI's CUDA-build stage (no GPU needed). In its own virtual environment with torch 2.14.1 (the
# CUDA 13.0 build), compiles ringdist with its CUDA sources (nvcc; TORCH_RINGDIST_CUDA=1 makes
# a missing piece an error), checks the CUDA code is in, then tests what differs from the
# first stage's build: every test marked cuda (the CUDA paths' logic on the CPU; GPU tests
# skip), one case of every other test file, leaving out slow tests (--smoke: the extension and
# torch 2.14.1's API), and the C++ package. The host code's full matrix and the slow tests ran
# in the first stage, which this stage does not repeat.
#
# The venv (about 5.5 GB) is kept in $RINGDIST_CACHE (scripts/build_cache.sh) and reused
# while torch and scripts/requirements-dev.txt are unchanged; a fresh machine builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_CUDA_VERSION=${TORCH_CUDA_VERSION:-2.14.1}
source scripts/build_cache.sh

start=$(date +%s)
requirements=$(sha1sum scripts/requirements-dev.txt | cut -c1-12)
VENV=${RINGDIST_CUDA_VENV:-$RINGDIST_CACHE/venv-cuda-torch$TORCH_CUDA_VERSION-$requirements}
VPY="$VENV/bin/python"
if [ -f "$VENV/.complete" ] && "$VPY" -c "import torch; assert torch.__version__.startswith('$TORCH_CUDA_VERSION')" 2>/dev/null; then
  echo "cuda stage: reusing $VENV"
else
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # Pinned: the CUDA 13.0 build of torch with its NVIDIA runtime wheels.
  "$VPY" -m pip install -q "torch==${TORCH_CUDA_VERSION}"
  "$VPY" -m pip install -q -r scripts/requirements-dev.txt
  touch "$VENV/.complete"
fi
echo "cuda stage: venv and torch ready after $(( $(date +%s) - start )) s"

# H100/H200 (sm_90) plus PTX; nvcc as cmake/RingdistCuda.cmake picks it.
export TORCH_RINGDIST_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0+PTX}"
export TORCH_RINGDIST_TESTING=1  # the suite's test hooks
export MAX_JOBS=${MAX_JOBS:-2}
"$VPY" -m pip install -q setuptools==80.9.0  # the build backend (the venv's own is too old)
"$VPY" -m pip install -q --no-build-isolation .
"$VPY" -P -c "import torch, torch_ringdist._C as C; assert C.cuda_compiled(), 'CUDA code missing'; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| ringdist CUDA build:', C.cuda_compiled())"
echo "cuda stage: built after $(( $(date +%s) - start )) s"

set +e
# Slow tests (trainings, launches, soaks) test host code and the Python side, which the first
# stage ran on the same sources; of them only the C++ package's test depends on the build (its
# CMake package and library with CUDA), so it runs here too.
bash scripts/run_pytest.sh "$VPY" --smoke -m "not own_build and not slow" "$@"
status=$?
OMP_NUM_THREADS=1 "$VPY" -P -m pytest tests/test_cpp.py -q -rs --timeout=900 -m slow \
  --durations=5 "$@" || status=1  # exit code 5 (nothing collected) fails too
set -e
echo "cuda stage: finished after $(( $(date +%s) - start )) s"
exit "$status"
