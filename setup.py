"""Builds torch_ringdist._C against the torch installed in this environment.

Install with `pip install --no-build-isolation .` so the build sees that torch
(see pyproject.toml for why torch is not a build requirement). The extension
is tied to the torch minor version it was built against: rebuild after
upgrading torch.
"""
import glob
import os

from setuptools import setup

try:
    import torch  # noqa: F401
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as exc:  # pragma: no cover - explained to the user
    raise SystemExit(
        "torch_ringdist builds against an installed torch: first `pip install torch==<version>`, "
        "then `pip install --no-build-isolation .`"
    ) from exc

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources():
    # The engine (common, transport, reduce, codec, collectives, hooks) is
    # torch-free C++; csrc/backend/ is the only layer that includes torch headers.
    return sorted(glob.glob(os.path.join("csrc", "**", "*.cc"), recursive=True))


cxx_flags = ["-O3", "-fvisibility=hidden", "-Wall", "-Wno-sign-compare", "-Wno-unused-parameter"]
if os.environ.get("RINGDIST_DEBUG_BUILD"):
    cxx_flags = ["-O0", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]

setup(
    ext_modules=[
        CppExtension(
            name="torch_ringdist._C",
            sources=sources(),
            include_dirs=[ROOT],
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=["-fsanitize=address,undefined"] if os.environ.get("RINGDIST_DEBUG_BUILD") else [],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
