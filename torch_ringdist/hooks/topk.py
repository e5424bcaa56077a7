"""Top-k sparsification hook with error feedback."""

import logging
import math

import torch
import torch.distributed as dist

from torch_ringdist._extension import load
from torch_ringdist.hooks._base import HookState, check_float32, completed_future, group_size
from torch_ringdist.hooks._registry import add_hook

logger = logging.getLogger(__name__)


class TopKState(HookState):
    """State of the ``topk`` hook: each rank sends only its k largest gradient entries.

    Per bucket, every rank picks the ``ratio`` fraction of entries with the
    largest magnitude (of gradient + residual), all-gathers their values and
    indices (top-k is not allreduce-shaped), and every rank adds all ranks'
    sparse contributions in rank order in float32 and divides by the world
    size, so replicas stay bitwise identical. With error feedback the entries
    not sent are kept and added to the next step's gradient.

    Wire bytes per rank and step: (N-1) x 8 bytes x k (value + int32 index),
    about ``2 x ratio`` of a float32 ring allreduce at N=2.

    Args:
        ratio: fraction of each bucket's entries sent (default 0.01).
        error_feedback: carry unsent entries to the next step (default True;
            without it top-k 1% converges far worse).
        process_group: group (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "topk", ratio=0.01)
    """

    __slots__ = ("ratio", "error_feedback", "residuals")
    _saved = ("ratio", "error_feedback", "residuals")

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True, process_group=None):
        super().__init__(process_group)
        if not 0 < ratio <= 1:
            raise ValueError(f"torch_ringdist.hooks.topk: ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)
        self.error_feedback = bool(error_feedback)
        self.residuals: dict[int, torch.Tensor] = {}

    def _run(self, bucket, provisional):
        buffer = bucket.buffer()
        if bucket.is_last():
            self.iteration += 1
        n = buffer.numel()
        group = self.process_group
        world = group_size(group)
        if n == 0:
            return completed_future(buffer)
        if n >= 2 ** 31:
            raise ValueError(f"torch_ringdist.hooks.topk: rank {dist.get_rank()}: bucket of {n} "
                             "elements; int32 indices need buckets under 2^31 elements")
        ext = load()
        # Selection and scatter run where the bucket is: fused C++ passes on the
        # host (csrc/topk/topk.cc) or, for a CUDA bucket, the GPU kernels
        # (csrc/gpu/cuda/topk.cu), so only the selection leaves the GPU. A build
        # without CUDA kernels copies a CUDA bucket to the host for them.
        device = buffer.device
        if device.type != "cpu" and not ext.cuda_compiled():
            device = torch.device("cpu")
        use_ef = self.error_feedback and not provisional
        residual = None
        if use_ef:
            check_float32("topk", buffer)
            residual = self.residuals.get(bucket.index())
            if residual is None or residual.numel() != n:
                residual = torch.zeros(n, dtype=torch.float32, device=device)
            # A checkpoint may bring it from another device.
            residual = residual.to(device)
            self.residuals[bucket.index()] = residual
        on_device = buffer.dtype == torch.float32 and buffer.device == device
        x = buffer if on_device else buffer.to(device, torch.float32)
        k = min(n, max(1, math.ceil(self.ratio * n)))
        # Values and int32 indices (as float32 bit patterns) in one all_gather.
        packed = torch.empty(2 * k, dtype=torch.float32, device=device)
        ext.topk_select(x, residual, k, packed)
        gathered = torch.empty(world * 2 * k, dtype=torch.float32, device=device)
        work = dist.all_gather_into_tensor(gathered, packed, group=group, async_op=True)

        def combine(fut):
            fut.wait()
            # Every rank adds all ranks' entries in rank order: identical results.
            ext.topk_scatter(gathered, world, k, x)
            if x is not buffer:
                buffer.copy_(x)
            return buffer

        return work.get_future().then(combine)


def topk_hook(state: TopKState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k sparsified mean with error feedback. See :class:`TopKState`.

    Args:
        state: a :class:`TopKState`.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the bucket buffer holding the averaged sparse gradient.
    """
    return state(bucket)


add_hook("topk", topk_hook, TopKState)
