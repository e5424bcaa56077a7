"""Gradient accumulation inside the hook: communicate every K backward passes."""

import logging

import torch

from torch_ringdist.hooks._base import HookState, completed_future
from torch_ringdist.hooks._registry import add_hook, inner_state

logger = logging.getLogger(__name__)


class AccumulateState(HookState):
    """State of the ``accumulate`` hook: communicate only every ``steps`` backward passes.

    The training loop does K forward/backward passes without zeroing the
    gradients, then one ``optimizer.step()`` and ``zero_grad()``, exactly as
    with ``DDP.no_sync()``, but without the context manager. On the K-1
    skipped passes the hook returns ``bucket.buffer()`` unchanged (what DDP
    requires of a hook that does not communicate), so each parameter's
    ``.grad`` keeps the local sum; on the K-th the wrapped hook reduces the
    accumulated gradient. With the default inner hook (``allreduce``) the
    result is bitwise identical to ``no_sync()`` for K-1 passes plus one
    synchronised pass.

    Args:
        steps: K, backward passes per communication (default 4).
        hook: name of the wrapped hook (default ``"allreduce"``), or a state
            of another ringdist hook.
        **options: options of the wrapped hook (e.g. ``error_feedback=True``).

    Example::

        >>> register(ddp_model, "accumulate", steps=4, hook="int8")
        >>> for i, (x, y) in enumerate(loader):
        ...     loss_fn(ddp_model(x), y).backward()
        ...     if i % 4 == 3:
        ...         opt.step(); opt.zero_grad()
    """

    __slots__ = ("steps", "inner")
    _saved = ("steps", "inner")

    def __init__(self, steps: int = 4, hook="allreduce", process_group=None, **options):
        super().__init__(process_group)
        if steps < 1:
            raise ValueError(f"torch_ringdist.hooks.accumulate: steps must be >= 1, got {steps}")
        self.steps = int(steps)
        self.inner = inner_state("accumulate", hook, ("accumulate",), process_group, options)

    def bind(self, ddp_model) -> None:
        super().bind(ddp_model)
        self.inner.process_group = self.process_group
        # The inner state sees only the communicating passes, through this one's
        # (already stable) buckets; it needs no layout of its own.

    def _run(self, bucket, provisional):
        communicate = self.iteration % self.steps == self.steps - 1
        if bucket.is_last():
            self.iteration += 1
        if not communicate:
            return completed_future(bucket.buffer())
        return self.inner._run(bucket, provisional)


def accumulate_hook(state: AccumulateState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Communicate every K backward passes, else leave the bucket unchanged.

    Args:
        state: an :class:`AccumulateState`.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the bucket buffer: unchanged on skipped passes, reduced by the
        inner hook on every K-th.
    """
    return state(bucket)


add_hook("accumulate", accumulate_hook, AccumulateState)
