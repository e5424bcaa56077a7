#!/usr/bin/env bash
# CI's release stage: builds the sdist and the wheel (scripts/build_wheel.sh) against the pinned
# torch, installs the wheel into a fresh venv that holds only that torch, and there, with no
# compiler, CMake or nvcc on PATH, runs scripts/wheel_check.py (no test hooks, fault variables
# ignored, a 2-rank allreduce and a DDP hook correct). Then, with the compilers back, builds the
# C++ example against the wheel's CMake package.
#
#   test_wheel.sh                  both phases
#   test_wheel.sh --build-only     the artifacts (into dist/) and the venv (CI runs it beside
#                                  the suite)
#   test_wheel.sh --check-only     the checks, on the build of this same tree
#
# The build runs in a copy of the checkout (scripts/copy_checkout.sh), in a venv of its own, so
# it can run while the suite or another build uses the checkout and its Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}  # as scripts/install.sh
source scripts/build_cache.sh
phase=all
case "${1:-}" in
  --build-only) phase=build ;;
  --check-only) phase=check ;;
esac
VENV=build/wheel-venv
tree_id=$(bash scripts/copy_checkout.sh --id)  # what the build was built from

fresh_venv() {  # fresh_venv DIR PACKAGES...: a new venv holding the pinned torch and PACKAGES
  local dir=$1
  shift
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install -q "torch==$TORCH_VERSION" "$@"
}

if [ "$phase" != check ]; then
  rm -f "$VENV/.ringdist-tree"
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  bash scripts/copy_checkout.sh "$src"
  builder=build/wheel-build-venv
  fresh_venv "$builder" "$(grep '^ninja==' scripts/requirements-dev.txt)"
  # The builder's bin first: its ninja. Paths hashed relative to the copy (build_cache.sh).
  PATH="$PWD/$builder/bin:$PATH" PYTHON="$PWD/$builder/bin/python" CCACHE_BASEDIR="$src" \
    bash "$src/scripts/build_wheel.sh"
  rm -rf dist
  cp -r "$src/dist" dist
  fresh_venv "$VENV" dist/torch_ringdist-*.whl
  echo "$tree_id" >"$VENV/.ringdist-tree"
  [ "$phase" = build ] && exit 0
fi

if [ "$(cat "$VENV/.ringdist-tree" 2>/dev/null)" != "$tree_id" ]; then
  echo "wheel stage: no wheel of this tree in $VENV: run scripts/test_wheel.sh --build-only first" >&2
  exit 1
fi
# PATH: the venv's bin alone (python, torchrun), so no compiler or CMake can be found.
(cd "$VENV" && env -i HOME="$HOME" PATH="$PWD/bin" OMP_NUM_THREADS=1 \
  bin/python -P ../../scripts/wheel_check.py)

prefix=$("$VENV/bin/python" -P -c "import torch_ringdist; print(torch_ringdist.cmake_prefix_path)")
rm -rf build/wheel-example
cmake -S examples/cpp -B build/wheel-example -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/wheel-example --parallel "${MAX_JOBS:-2}" >/dev/null
echo "C++ example built against the wheel: build/wheel-example/ringdist_train"
