"""DDP communication hooks for ringdist.

    import torch_ringdist.hooks as hooks
    state = hooks.register(ddp_model, "int8", error_feedback=True)
    hooks.available()   # ['accumulate', 'allreduce', 'bf16', 'fp16', 'int8', 'local_sgd', 'powersgd', 'topk']

Every hook has torch's signature ``hook(state, bucket) -> Future[Tensor]`` and
averages over the group (DDP does not divide when a hook is registered). Each
state pickles without its process group (``torch.save(state)``), including
per-bucket residuals and the recorded bucket layout; pass a loaded state to
``register(model, name, state=loaded)`` to resume bitwise identically.
"""

import logging

from torch_ringdist.hooks._base import HookState, VirtualBucket
from torch_ringdist.hooks.accumulate import AccumulateState, accumulate_hook
from torch_ringdist.hooks.compress import (AllreduceState, CodecState, allreduce_hook, bf16_hook,
                                           fp16_hook, int8_hook)
from torch_ringdist.hooks.local_sgd import LocalSGDState, local_sgd_hook
from torch_ringdist.hooks.powersgd import PowerSGDState, powersgd_hook
from torch_ringdist.hooks.topk import TopKState, topk_hook

logger = logging.getLogger(__name__)

# name -> (hook function, state factory taking the options)
_REGISTRY = {
    "allreduce": (allreduce_hook, AllreduceState),
    "fp16": (fp16_hook, lambda **o: CodecState("fp16", **o)),
    "bf16": (bf16_hook, lambda **o: CodecState("bf16", **o)),
    "int8": (int8_hook, lambda **o: CodecState("int8", **o)),
    "topk": (topk_hook, TopKState),
    "powersgd": (powersgd_hook, PowerSGDState),
    "local_sgd": (local_sgd_hook, LocalSGDState),
    "accumulate": (accumulate_hook, AccumulateState),
}

_STATE_TYPES = {
    "allreduce": AllreduceState, "fp16": CodecState, "bf16": CodecState, "int8": CodecState,
    "topk": TopKState, "powersgd": PowerSGDState, "local_sgd": LocalSGDState,
    "accumulate": AccumulateState,
}


def available() -> list[str]:
    """Names accepted by :func:`register`."""
    return sorted(_REGISTRY)


def make_state(name: str, **options) -> HookState:
    """A new state for hook ``name`` (options as in :func:`register`)."""
    if name not in _REGISTRY:
        raise ValueError(f"torch_ringdist.hooks: unknown hook {name!r}; available: {available()}")
    try:
        return _REGISTRY[name][1](**options)
    except TypeError as exc:
        raise ValueError(f"torch_ringdist.hooks: bad options for hook {name!r}: {exc}") from exc


def register(model, name: str, state: HookState | None = None, optimizer=None, **options):
    """Register hook ``name`` on a DDP model and return its state.

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel`` model.
        name: one of :func:`available`.
        state: a state to resume (e.g. from ``torch.load``); options must then be empty.
        optimizer: for ``local_sgd``: average right after this optimizer's steps
            (default: after any optimizer step over this model's parameters).
        **options: the hook's options (see each state class).

    Returns:
        The hook state (checkpoint it with ``torch.save``).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp, "topk", ratio=0.01)
        >>> torch.save({"model": ddp.module.state_dict(), "hook": state}, path)
        >>> # later, in a fresh process:
        >>> ckpt = torch.load(path, weights_only=False)
        >>> torch_ringdist.hooks.register(ddp, "topk", state=ckpt["hook"])
    """
    if name not in _REGISTRY:
        raise ValueError(f"torch_ringdist.hooks: unknown hook {name!r}; available: {available()}")
    hook = _REGISTRY[name][0]
    if state is None:
        state = make_state(name, **options)
    else:
        if options:
            raise ValueError("torch_ringdist.hooks.register: pass either a state or options")
        if not isinstance(state, _STATE_TYPES[name]):
            raise TypeError(f"torch_ringdist.hooks.register: hook {name!r} needs a "
                            f"{_STATE_TYPES[name].__name__}, got {type(state).__name__}")
    if optimizer is not None and not isinstance(state, LocalSGDState):
        raise ValueError("torch_ringdist.hooks.register: optimizer= is for local_sgd only")
    if isinstance(state, LocalSGDState):
        state.bind(model, optimizer)
    else:
        state.bind(model)
    model.register_comm_hook(state, hook)
    logger.info("registered ringdist hook %s", name)
    return state


__all__ = [
    "available", "register", "make_state", "HookState", "VirtualBucket",
    "AllreduceState", "CodecState", "TopKState", "PowerSGDState", "LocalSGDState",
    "AccumulateState", "allreduce_hook", "fp16_hook", "bf16_hook", "int8_hook", "topk_hook",
    "powersgd_hook", "local_sgd_hook", "accumulate_hook",
]
