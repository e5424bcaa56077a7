# Sourced by the install and test scripts: compiler caching and where downloads are kept.
#
# Every build of ringdist (the package, the CUDA build, the tests' own builds: ASan, aarch64,
# the C++ tests) goes through ccache when it is installed, so a second run on one machine
# recompiles only what changed. Paths under the checkout are hashed relative to it
# (CCACHE_BASEDIR), so a fresh clone in another folder hits the same cache. A machine without
# ccache builds as before. RINGDIST_NO_CCACHE=1 turns it off.
RINGDIST_CACHE=${RINGDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_ringdist}
export RINGDIST_CACHE
if command -v ccache >/dev/null && [ "${RINGDIST_NO_CCACHE:-0}" != 1 ]; then
  export CCACHE_DIR=${CCACHE_DIR:-$RINGDIST_CACHE/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
  export CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-6G}
  # The library's precompiled torch headers (CMakeLists.txt: TORCH_RINGDIST_PCH) are cached
  # only with these: the .gch is created during the build, and its macros are checked by gcc.
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
