"""Builds torch_ringdist against the torch installed in this environment, with
CMake (CMakeLists.txt holds the only list of sources and flags).

Install with `pip install --no-build-isolation .` so the build sees that torch
(see pyproject.toml for why torch is not a build requirement). The build is
tied to the torch minor version it was built against: rebuild after upgrading
torch. The package holds the Python module (_C), lib/libtorch_ringdist.so,
include/torch_ringdist/ and lib/cmake/TorchRingdist/ for C++ users.

Settings (environment), passed on to CMake:
  TORCH_RINGDIST_CUDA   1: CUDA required (an error says what is missing), 0: CPU
                        only; unset: CUDA when torch is a CUDA build and nvcc is found
  TORCH_CUDA_ARCH_LIST  GPU architectures, as for any torch extension
  RINGDIST_DEBUG_BUILD  1: -O0 -g with AddressSanitizer and UBSan
  TORCH_RINGDIST_TESTING  1: with the test hooks (_C.testing, RINGDIST_TEST_* fault
                        injection) that the test suite needs; never for a release
  MAX_JOBS              parallel compile jobs
  CMAKE_ARGS            further arguments for the CMake configure step
"""
import sys

if not sys.platform.startswith("linux"):  # before anything that may not import there
    raise SystemExit(f"torch_ringdist runs on Linux only (x86-64 and aarch64): its transports use "
                     f"futexes, /dev/shm and process_vm_readv, which {sys.platform} does not have.")

import hashlib  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

from setuptools import Extension, setup  # noqa: E402
from setuptools.command.build_ext import build_ext  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
# torch imports every installed backend at its own import: an earlier install of this package
# whose files are gone (an editable install of a deleted checkout) would stop its own rebuild.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

try:
    import torch.utils
except ImportError as exc:  # pragma: no cover - explained to the user
    raise SystemExit(
        "torch_ringdist builds against an installed torch: first `pip install torch==<version>`, "
        "then `pip install --no-build-isolation .`"
    ) from exc


def cmake_cuda_setting():
    wanted = os.environ.get("TORCH_RINGDIST_CUDA", "")
    if wanted not in ("", "0", "1"):
        raise SystemExit(f"TORCH_RINGDIST_CUDA must be 0 or 1, got {wanted!r}")
    return {"": "AUTO", "0": "OFF", "1": "ON"}[wanted]


def testing_build():
    wanted = os.environ.get("TORCH_RINGDIST_TESTING", "0")
    if wanted not in ("0", "1"):
        raise SystemExit(f"TORCH_RINGDIST_TESTING must be 0 or 1, got {wanted!r}")
    return wanted == "1"


def cmake_executable():
    """cmake on PATH, else the one of PyPI's cmake package in this environment."""
    cmake = shutil.which("cmake")
    if cmake is None:
        try:
            import cmake as cmake_package
            cmake = os.path.join(cmake_package.CMAKE_BIN_DIR, "cmake")
        except ImportError:
            raise SystemExit("torch_ringdist builds with CMake (>= 3.18): install it "
                             "(`apt-get install cmake` or `pip install cmake`)") from None
    return cmake


class CMakeBuild(build_ext):
    """Configures, builds and installs CMakeLists.txt into the package folder."""

    def build_extension(self, ext):
        sanitize = bool(os.environ.get("RINGDIST_DEBUG_BUILD"))
        # One build folder per torch (CI builds against two torches in one checkout) and kind.
        torch_id = hashlib.sha1(os.path.dirname(torch.__file__).encode()).hexdigest()[:8]
        kind = ("testing" if testing_build() else "release") + ("-asan" if sanitize else "")
        build_name = f"cmake-torch-{torch.__version__}-{torch_id}-{kind}"
        if getattr(self, "editable_mode", False) or self.inplace:
            # `pip install -e .`: the checkout's own package folder becomes the installed
            # package (module, library, headers, CMake package), so commands run from the
            # checkout's root import a built package. The build folder stays in the checkout
            # (pip's is a new temporary one each time): a rebuild compiles only what changed.
            package_dir = os.path.join(ROOT, "torch_ringdist")
            build_dir = os.path.join(ROOT, "build", build_name)
        else:
            package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
            build_dir = os.path.join(os.path.abspath(self.build_temp), build_name)
        cmake = cmake_executable()
        configure = [
            cmake, "-S", ROOT, "-B", build_dir,
            f"-DCMAKE_BUILD_TYPE={'Debug' if sanitize else 'Release'}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DTORCH_RINGDIST_PYTHON=ON",
            f"-DTORCH_RINGDIST_CUDA={cmake_cuda_setting()}",
            f"-DTORCH_RINGDIST_SANITIZE={'ON' if sanitize else 'OFF'}",
            f"-DTORCH_RINGDIST_TESTING={'ON' if testing_build() else 'OFF'}",
        ]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "Makefile")):
            configure.append("-GNinja")
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run([cmake, "--build", build_dir, "--parallel", jobs], check=True)
        subprocess.run([cmake, "--install", build_dir, "--prefix", package_dir], check=True)
        expected = os.path.abspath(self.get_ext_fullpath(ext.name))
        if not os.path.exists(expected):  # an editable build also collects the module here
            os.makedirs(os.path.dirname(expected), exist_ok=True)
            shutil.copy2(os.path.join(package_dir, os.path.basename(expected)), expected)


def torch_requirement():
    """The torch minor this build is compiled against, the only one it loads in: as a
    requirement, pip keeps a wheel out of another torch (and never replaces the user's torch,
    which already satisfies it)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


setup(
    install_requires=[torch_requirement()],
    ext_modules=[Extension("torch_ringdist._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
