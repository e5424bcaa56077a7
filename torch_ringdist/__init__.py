"""torch_ringdist: a ring-allreduce torch.distributed backend.

`import torch_ringdist` registers the backend "ringdist" (torch also does it
at `import torch` through the package's entry point):

    import torch.distributed as dist
    dist.init_process_group(backend="ringdist")
"""
import importlib as _importlib
import os as _os

# The one place the version is written: pyproject.toml and CMakeLists.txt read it from here.
__version__ = "0.1.0"

from torch_ringdist import _extension
from torch_ringdist._registration import BACKEND_NAME, register_backend

register_backend()

# Compressed allreduce and statistics (ringdist groups only); DDP hooks live
# in torch_ringdist.hooks.
from torch_ringdist._collectives import (  # noqa: E402
    all_reduce, direct_all_gather, direct_all_reduce, reset_stats, stats, trace)
# After a failure: which ranks to pass to dist.shrink_group.
from torch_ringdist._recovery import ExcludedError, lost_ranks  # noqa: E402

__all__ = ["BACKEND_NAME", "register_backend", "reduce_kernel_family", "all_reduce",
           "direct_all_reduce", "direct_all_gather", "stats",
           "reset_stats", "lost_ranks", "ExcludedError", "trace", "hooks", "cmake_prefix_path"]

# For C++ users: what to pass as CMAKE_PREFIX_PATH so that CMake's
# find_package(TorchRingdist) finds lib/cmake/TorchRingdist/ (README, "Using ringdist from C++").
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "lib", "cmake")

# Subpackages imported on first attribute access, so `import torch_ringdist`
# stays light (the hooks import torch's DDP hook machinery).
_LAZY_SUBPACKAGES = ("hooks",)


def __getattr__(name):
    if name in _LAZY_SUBPACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reduce_kernel_family() -> str:
    """The CPU reduction kernels picked at run time ("avx2" or "generic")."""
    return _extension.load().reduce_kernel_family()
