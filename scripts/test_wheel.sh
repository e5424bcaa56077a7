#!/usr/bin/env bash
# CI's release stage: builds the sdist and the wheel (scripts/build_wheel.sh), installs the
# wheel into a fresh venv that holds only the same torch, and there, with no compiler, CMake
# or nvcc on PATH, runs scripts/wheel_check.py (no test hooks, fault variables ignored, a
# 2-rank allreduce and a DDP hook correct). Then, with the compilers back, builds the C++
# example against the wheel's CMake package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/build_cache.sh
bash scripts/build_wheel.sh
torch_version=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")

VENV=build/wheel-venv
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "torch==$torch_version"
"$VENV/bin/python" -m pip install -q dist/torch_ringdist-*.whl
# PATH: the venv's bin alone (python, torchrun), so no compiler or CMake can be found.
(cd "$VENV" && env -i HOME="$HOME" PATH="$PWD/bin" OMP_NUM_THREADS=1 \
  bin/python -P ../../scripts/wheel_check.py)

prefix=$("$VENV/bin/python" -P -c "import torch_ringdist; print(torch_ringdist.cmake_prefix_path)")
rm -rf build/wheel-example
cmake -S examples/cpp -B build/wheel-example -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/wheel-example --parallel "${MAX_JOBS:-2}" >/dev/null
echo "C++ example built against the wheel: build/wheel-example/ringdist_train"
