"""One-step-delayed gradients: exchange step t's gradients while step t+1 computes."""

import collections
import logging

import torch

from torch_ringdist.hooks._base import HookState, VirtualBucket, completed_future
from torch_ringdist.hooks._registry import add_hook, inner_state

logger = logging.getLogger(__name__)

CORRECTIONS = ("average", "local")


class DelayedState(HookState):
    """State of the ``delayed`` hook: each bucket's exchange overlaps the next step.

    The hook starts this step's exchange of the bucket (with the wrapped hook, on a copy of
    the bucket) and returns at once, with the result of the exchange it started
    ``staleness`` steps ago, which had that long to finish. So backward never waits for the
    wire, and a rank late by less than a step's worth of communication delays no one.

    Update rules (``correction``):

    - ``"local"`` (default; Delayed Gradient Averaging): the step applies this rank's own
      gradient of step t plus the correction ``average(t - s) - own(t - s)``. Nothing is
      applied late, but replicas differ by the last ``staleness`` local terms (with plain
      SGD the parameters differ by exactly lr x those terms); rank 0's checkpoint is rank
      0's view, and each rank saves its own hook state to resume bitwise.
    - ``"average"`` (Pipe-SGD): the step applies the average of the gradients of step
      t - staleness. Every gradient is applied exactly once, ``staleness`` steps late, and
      replicas stay bitwise identical. The ``staleness`` steps after the first apply no
      update (their gradients arrive later). A stale step acts like extra momentum: with
      SGD momentum 0.9 at the digits example's lr 0.1 it does not converge (accuracy 0.45
      where synchronous DDP reaches 0.967, local 0.964), so lower the momentum or lr.

    The first backward pass (DDP's provisional buckets) is synchronous in both rules.
    ``torch.save(state)`` waits for the exchanges in flight and saves their results, so a
    resumed run continues bitwise identically.

    Args:
        staleness: steps between an exchange's start and its use (default 1).
        correction: ``"local"`` (default) or ``"average"``.
        hook: the wrapped hook's name (default ``"allreduce"``; ``"int8"``, ``"bf16"``,
            ``"fp16"``, ``"topk"``... compress the delayed exchanges), or its state.
        **options: the wrapped hook's options (e.g. ``error_feedback=True``).

    Example::

        >>> register(ddp_model, "delayed", staleness=1, hook="int8", error_feedback=True)
    """

    __slots__ = ("staleness", "correction", "inner", "pending")
    _saved = ("staleness", "correction", "inner", "pending")

    def __init__(self, staleness: int = 1, correction: str = "local", hook="allreduce",
                 process_group=None, **options):
        super().__init__(process_group)
        if int(staleness) < 1:
            raise ValueError(f"torch_ringdist.hooks.delayed: staleness must be >= 1, got {staleness}")
        if correction not in CORRECTIONS:
            raise ValueError(f"torch_ringdist.hooks.delayed: correction must be one of "
                             f"{', '.join(CORRECTIONS)}, got {correction!r}")
        self.staleness = int(staleness)
        self.correction = correction
        self.inner = inner_state("delayed", hook, ("delayed", "local_sgd", "diloco", "accumulate"),
                                 process_group, options)
        # bucket index -> exchanges in flight, oldest first: (future or result, own gradient)
        self.pending: dict[int, collections.deque] = {}

    def bind(self, ddp_model) -> None:
        super().bind(ddp_model)
        self.inner.process_group = self.process_group

    def __getstate__(self):
        # Drain: a checkpoint holds the results of the exchanges in flight, not futures.
        for queue in self.pending.values():
            for i, (result, own) in enumerate(queue):
                if not isinstance(result, torch.Tensor):  # a future
                    queue[i] = (result.wait(), own)
        return super().__getstate__()

    def _run(self, bucket, provisional):
        if provisional:  # first pass: DDP's buckets are not final, no per-bucket state yet
            if bucket.is_last():
                self.iteration += 1
            return self.inner._run(bucket, provisional)
        if bucket.is_last():
            self.iteration += 1
        buffer = bucket.buffer()
        # The exchange works on its own copy: DDP reuses the bucket's memory next step.
        sent = buffer.clone()
        own = buffer.clone() if self.correction == "local" else None
        started = self.inner._run(VirtualBucket(bucket.index(), sent, [sent], [],
                                                bucket.is_last()), False)
        queue = self.pending.setdefault(bucket.index(), collections.deque())
        queue.append((started, own))
        if len(queue) <= self.staleness:  # pipeline filling: nothing old enough yet
            if self.correction == "average":
                buffer.zero_()
            return completed_future(buffer)
        result, old_own = queue.popleft()
        average = result if isinstance(result, torch.Tensor) else result.wait()
        if self.correction == "average":
            buffer.copy_(average)
        else:
            buffer.add_(average).sub_(old_own)
        return completed_future(buffer)


def delayed_hook(state: DelayedState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Start this step's exchange, return the one from ``staleness`` steps ago.

    Args:
        state: a :class:`DelayedState`.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        A completed future of the bucket buffer holding the delayed update.
    """
    return state(bucket)


add_hook("delayed", delayed_hook, DelayedState)
