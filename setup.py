"""Builds torch_ringdist._C against the torch installed in this environment.

Install with `pip install --no-build-isolation .` so the build sees that torch
(see pyproject.toml for why torch is not a build requirement). The extension
is tied to the torch minor version it was built against: rebuild after
upgrading torch.

CUDA: the kernels in csrc/cuda/ are compiled (CUDAExtension) when the
installed torch is a CUDA build and nvcc is found; otherwise the extension is
CPU-only. TORCH_RINGDIST_CUDA=1 requires the CUDA build (an error says what is
missing), TORCH_RINGDIST_CUDA=0 forbids it. TORCH_CUDA_ARCH_LIST picks the GPU
architectures as for any torch extension.
"""
import glob
import os
import subprocess

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# torch finds CUDA_HOME from `which nvcc` before its own default /usr/local/cuda;
# where nvcc is a wrapper script elsewhere (e.g. /usr/local/bin), that guess has
# no CUDA headers. Prefer the default when it is complete and nothing was set.
if not os.environ.get("CUDA_HOME") and not os.environ.get("CUDA_PATH") and os.path.exists(
        "/usr/local/cuda/include/cuda_runtime_api.h"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as exc:  # pragma: no cover - explained to the user
    raise SystemExit(
        "torch_ringdist builds against an installed torch: first `pip install torch==<version>`, "
        "then `pip install --no-build-isolation .`"
    ) from exc

# Architectures when none were asked for and no GPU is visible to detect:
# A100 (8.0) and H100/H200 (9.0), plus PTX for newer GPUs to JIT-compile.
DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def cuda_build():
    """Whether to compile the CUDA sources; raises if forced on but impossible."""
    wanted = os.environ.get("TORCH_RINGDIST_CUDA", "")
    if wanted not in ("", "0", "1"):
        raise SystemExit(f"TORCH_RINGDIST_CUDA must be 0 or 1, got {wanted!r}")
    if wanted == "0":
        return False
    home = cpp_extension.CUDA_HOME
    missing = None
    if torch.version.cuda is None:
        missing = f"the installed torch {torch.__version__} is not a CUDA build"
    elif home is None or not os.path.exists(os.path.join(home, "bin", "nvcc")):
        missing = "nvcc was not found (set CUDA_HOME to the CUDA toolkit)"
    elif not os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
        missing = f"CUDA_HOME={home} has no include/cuda_runtime_api.h"
    if missing and wanted == "1":
        raise SystemExit(f"TORCH_RINGDIST_CUDA=1 but {missing}")
    if missing:
        print(f"torch_ringdist: building without CUDA ({missing})")
        return False
    return True


def sources(pattern):
    # The engine (common, transport, reduce, codec, collectives, hooks, cuda)
    # is torch-free; csrc/backend/ is the only layer that includes torch headers.
    return sorted(glob.glob(os.path.join("csrc", "**", pattern), recursive=True))


def shared_libstdcxx():
    """Link arguments that make the extension use the shared libstdc++ torch uses.

    Where the compiler has only the static archive (no libstdc++.so development
    link; seen on a GPU machine's image), -lstdc++ silently links a private copy
    of libstdc++ into the extension. Its iostream locale is never initialized,
    and the first number formatted into a message crashes the process.
    """
    try:
        found = subprocess.run([os.environ.get("CXX", "c++"), "-print-file-name=libstdc++.so"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    return [] if os.path.isabs(found) else ["-l:libstdc++.so.6"]


debug = bool(os.environ.get("RINGDIST_DEBUG_BUILD"))
# -ffp-contract=off: no a * b + c fused into one rounding behind the code's back
# (GCC does it in AVX2+FMA code by default), so every kernel rounds each
# operation as written, like the explicit intrinsics and the CUDA kernels.
cxx_flags = ["-O3", "-ffp-contract=off", "-fvisibility=hidden", "-Wall", "-Wno-sign-compare",
             "-Wno-unused-parameter"]
if debug:
    cxx_flags = ["-O0", "-g", "-ffp-contract=off", "-fsanitize=address,undefined",
                 "-fno-omit-frame-pointer"]


def torch_feature_macros():
    """Macros for c10d features that only some supported torch versions have."""
    header = os.path.join(cpp_extension.include_paths()[0], "torch", "csrc", "distributed",
                          "c10d", "Backend.hpp")
    with open(header) as f:
        text = f.read()
    # Backend::shrink (dist.shrink_group), torch >= 2.10.
    return [("RINGDIST_HAVE_SHRINK", "1")] if "supportsShrinking" in text else []


common = dict(
    name="torch_ringdist._C",
    include_dirs=[ROOT],
    define_macros=torch_feature_macros(),
    extra_link_args=(["-fsanitize=address,undefined"] if debug else []) + shared_libstdcxx(),
)

def write_build_config(cuda):
    """torch_ringdist/_build_config.py: what this build contains, readable at
    `import torch` (backend registration) without loading the extension."""
    with open(os.path.join(ROOT, "torch_ringdist", "_build_config.py"), "w") as f:
        f.write('"""Written by setup.py at build time."""\n'
                f"CUDA = {bool(cuda)}\n"
                f"TORCH = {torch.__version__!r}\n")


with_cuda = cuda_build()
write_build_config(with_cuda)
if with_cuda:
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCHS
    # -fmad=false: CUDA kernels must not fuse a * b + c, so every element
    # rounds as on the CPU (csrc/reduce/elementwise.h).
    nvcc_flags = ["-O3", "-fmad=false", "-Xcompiler", "-fvisibility=hidden"]
    extension = cpp_extension.CUDAExtension(
        sources=sources("*.cc") + sources("*.cu"),
        extra_compile_args={"cxx": cxx_flags + ["-Wno-interference-size"], "nvcc": nvcc_flags},
        **dict(common, define_macros=common["define_macros"] + [("RINGDIST_CUDA", "1")]),
    )
else:
    extension = cpp_extension.CppExtension(
        sources=sources("*.cc"), extra_compile_args={"cxx": cxx_flags}, **common)

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
