"""Loads the compiled extension with an error message that says what to do."""
import importlib

REINSTALL = "pip install --no-build-isolation --force-reinstall --no-deps torch_ringdist"


def minor(version: str) -> str:
    """"2.14.1+cu130" -> "2.14": extensions are tied to torch's minor version."""
    return ".".join(version.split("+")[0].split(".")[:2])


def _check_torch_version():
    """The extension only works with the torch minor version it was compiled against:
    say so before a symbol error would (setup.py records that version)."""
    try:
        from torch_ringdist._build_config import TORCH as built_with
    except ImportError:  # a source checkout that was never built: the import below explains
        return
    import torch

    if minor(built_with) != minor(torch.__version__):
        raise ImportError(
            f"torch_ringdist was built against torch {built_with}, but torch {torch.__version__} "
            f"is installed; the extension must be rebuilt for every torch minor version: "
            f"{REINSTALL}")


def load():
    _check_torch_version()
    try:
        return importlib.import_module("torch_ringdist._C")
    except ImportError as exc:
        import torch

        raise ImportError(
            "torch_ringdist: the compiled extension torch_ringdist._C could not be loaded "
            f"({exc}). Build it against the installed torch ({torch.__version__}) with "
            f"`{REINSTALL}`; the extension must be rebuilt after every torch minor-version "
            "change. If you are running from the source checkout, its torch_ringdist/ folder "
            "may be shadowing the installed package."
        ) from exc
