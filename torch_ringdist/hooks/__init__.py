"""DDP communication hooks for ringdist.

    import torch_ringdist.hooks as hooks
    state = hooks.register(ddp_model, "int8", error_feedback=True)
    hooks.available()   # ['accumulate', 'allreduce', 'bf16', 'delayed', 'diloco', 'fp16', 'int4',
                        #  'int8', 'local_sgd', 'powersgd', 'topk']

Every hook has torch's signature ``hook(state, bucket) -> Future[Tensor]`` and
averages over the group (DDP does not divide when a hook is registered). Each
state pickles without its process group (``torch.save(state)``), including
per-bucket residuals and the recorded bucket layout; pass a loaded state to
``register(model, name, state=loaded)`` to resume bitwise identically.
"""

import logging

from torch_ringdist.hooks._base import HookState, VirtualBucket
from torch_ringdist.hooks._registry import available, check_options, make_state
from torch_ringdist.hooks._registry import lookup as _lookup
# Each hook module adds its hooks to the registry when imported.
from torch_ringdist.hooks.accumulate import AccumulateState, accumulate_hook
from torch_ringdist.hooks.compress import (AllreduceState, CodecState, allreduce_hook, bf16_hook,
                                           fp16_hook, int4_hook, int8_hook)
from torch_ringdist.hooks.delayed import DelayedState, delayed_hook
from torch_ringdist.hooks.diloco import DiLoCoState, diloco_hook
from torch_ringdist.hooks.diloco_optimizer import DiLoCoOptimizer
from torch_ringdist.hooks.local_sgd import LocalSGDState, local_sgd_hook
from torch_ringdist.hooks.powersgd import PowerSGDState, powersgd_hook
from torch_ringdist.hooks.topk import TopKState, topk_hook

logger = logging.getLogger(__name__)


def register(model, name: str, state: HookState | None = None, optimizer=None, **options):
    """Register hook ``name`` on a DDP model and return its state.

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel`` model.
        name: one of :func:`available`.
        state: a state to resume (e.g. from ``torch.load``); options must then be empty.
        optimizer: for ``diloco`` and ``local_sgd``: the rounds run right after this
            optimizer's steps (default: after any optimizer step over this model's parameters).
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
    entry = _lookup(name)
    if state is None:
        # A misspelt option names the hook, its options and the closest one.
        check_options(name, options,
                      ("optimizer",) if issubclass(entry.state_type, DiLoCoState) else ())
        state = make_state(name, **options)
    else:
        if options:
            raise ValueError("torch_ringdist.hooks.register: pass either a state or options")
        if not isinstance(state, entry.state_type):
            raise TypeError(f"torch_ringdist.hooks.register: hook {name!r} needs a "
                            f"{entry.state_type.__name__}, got {type(state).__name__}")
    if optimizer is not None and not isinstance(state, DiLoCoState):
        raise ValueError("torch_ringdist.hooks.register: optimizer= is for diloco and local_sgd only")
    if isinstance(state, DiLoCoState):
        state.bind(model, optimizer)
    else:
        state.bind(model)
    model.register_comm_hook(state, entry.hook)
    logger.info("registered ringdist hook %s", name)
    return state


__all__ = [
    "available", "register", "make_state", "HookState", "VirtualBucket",
    "AllreduceState", "CodecState", "TopKState", "PowerSGDState", "LocalSGDState", "DiLoCoState",
    "DiLoCoOptimizer",
    "AccumulateState", "DelayedState", "allreduce_hook", "fp16_hook", "bf16_hook", "int8_hook",
    "int4_hook", "topk_hook", "powersgd_hook", "local_sgd_hook", "diloco_hook", "accumulate_hook", "delayed_hook",
]
