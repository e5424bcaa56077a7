"""Loads the compiled extension with an error message that says what to do."""
import importlib


def load():
    try:
        return importlib.import_module("torch_ringdist._C")
    except ImportError as exc:
        import torch

        raise ImportError(
            "torch_ringdist: the compiled extension torch_ringdist._C could not be loaded "
            f"({exc}). Build it against the installed torch ({torch.__version__}) with "
            "`pip install --no-build-isolation .`; the extension must be rebuilt after every "
            "torch minor-version change. If you are running from the source checkout, its "
            "torch_ringdist/ folder may be shadowing the installed package."
        ) from exc
