"""Loads the compiled extension with an error message that says what to do."""
import importlib
import os

# torch_ringdist is built from its source checkout (it is not on the package index).
REINSTALL = ("pip install --no-build-isolation --force-reinstall --no-deps <your torch_ringdist "
             "checkout>")


def source_checkout():
    """The checkout this package is imported from when it is an unbuilt source folder (no
    compiled extension beside it), else None."""
    package = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(package)
    built = any(name.startswith("_C.") and name.endswith(".so") for name in os.listdir(package))
    is_checkout = all(os.path.exists(os.path.join(root, f)) for f in ("setup.py", "CMakeLists.txt"))
    return root if is_checkout and not built else None


def minor(version: str) -> str:
    """"2.14.1+cu130" -> "2.14": extensions are tied to torch's minor version."""
    return ".".join(version.split("+")[0].split(".")[:2])


def build_record():
    """What the build recorded of itself (`CUDA`, `TORCH`; cmake/build_config.py.in), readable
    without loading the extension; None in a source checkout that was never built."""
    try:
        from torch_ringdist import _build_config
    except ImportError:
        return None
    return _build_config


def _check_torch_version():
    """The extension only works with the torch minor version it was compiled against:
    say so before a symbol error would (the build records that version)."""
    record = build_record()
    if record is None:  # the import in load() explains
        return
    import torch

    built_with = record.TORCH
    if minor(built_with) != minor(torch.__version__):
        raise ImportError(
            f"torch_ringdist was built against torch {built_with}, but torch {torch.__version__} "
            f"is installed; the extension must be rebuilt for every torch minor version: "
            f"{REINSTALL}")


_loaded = None


def load():
    """The extension module (hooks call this per bucket: the checks run once)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _check_torch_version()
    try:
        _loaded = importlib.import_module("torch_ringdist._C")
        return _loaded
    except ImportError as exc:
        import torch

        checkout = source_checkout()
        if checkout is not None:
            raise ImportError(
                f"torch_ringdist is imported from the source checkout {checkout} (Python looks "
                "in the current folder first), which holds no compiled extension. Build it in "
                f"place, so the checkout is the installed package: `pip install "
                f"--no-build-isolation -e {checkout}` (it is rebuilt by the same command after "
                "a torch minor-version change); or run from another folder, or with `python -P`."
            ) from exc
        raise ImportError(
            "torch_ringdist: the compiled extension torch_ringdist._C could not be loaded "
            f"({exc}). Build it against the installed torch ({torch.__version__}) with "
            f"`{REINSTALL}`; the extension must be rebuilt after every torch minor-version "
            "change."
        ) from exc
