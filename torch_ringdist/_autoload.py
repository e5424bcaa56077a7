"""Entry point torch calls at `import torch` (group `torch.backends`).

Registers the backend name only; the compiled extension is imported lazily
when a "ringdist" process group is actually created, so `import torch` stays
cheap and never fails because of this package.
"""


def register():
    from torch_ringdist._registration import register_backend

    register_backend()
