"""Allreduce hooks: plain (DDP's own arithmetic) and the native wire codecs fp16, bf16, int8, int4."""

import functools
import logging

import torch
import torch.distributed as dist

from torch_ringdist._collectives import CODECS, ringdist_backend
from torch_ringdist.hooks._base import HookState, check_float32, group_size
from torch_ringdist.hooks._registry import add_hook

logger = logging.getLogger(__name__)


def allreduce_bucket(group, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Mean of ``buffer`` over the group with DDP's own arithmetic.

    DDP without a hook multiplies each gradient by ``1 / world_size`` while
    copying it into the bucket, then sums; doing exactly that keeps results
    bitwise equal to DDP without a hook.
    """
    buffer.mul_(1.0 / group_size(group))
    return _output(dist.all_reduce(buffer, group=group, async_op=True))


def compressed_bucket(group, buffer: torch.Tensor, codec: str, what: str,
                      residual: torch.Tensor | None = None) -> torch.futures.Future[torch.Tensor]:
    """Mean of ``buffer`` over the group, sent in ``codec`` (native compressed allreduce);
    ``residual``: error feedback (added to the buffer, then given what the codec lost of this
    rank's contributions, on the backend's thread in call order)."""
    backend = ringdist_backend(group, f"torch_ringdist.hooks.{what}")
    return _output(backend.allreduce_compressed(buffer, codec, True, residual=residual))


def _output(work) -> torch.futures.Future[torch.Tensor]:
    """Future of the (single, in-place) output tensor of a collective's Work."""
    return work.get_future().then(lambda f: f.value()[0])


class AllreduceState(HookState):
    """State of the ``allreduce`` hook: uncompressed, identical to DDP without a hook.

    Useful as the reference for the compressed hooks and as the inner hook of
    ``accumulate``.

    Args:
        process_group: group to reduce over (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "allreduce")
    """

    __slots__ = ()
    _saved = ()

    def _run(self, bucket, provisional):
        if bucket.is_last():
            self.iteration += 1
        return allreduce_bucket(self.process_group, bucket.buffer())


class CodecState(HookState):
    """State of the ``fp16``, ``bf16`` and ``int8`` hooks (native compressed allreduce).

    Each bucket is averaged with ``torch_ringdist.all_reduce(codec=...)``: the
    wire carries the codec, sums are taken in float32 (no fp16 overflow), and
    every element is quantised twice whatever the world size. Needs a ringdist
    process group.

    Args:
        codec: ``"fp16"``, ``"bf16"``, ``"int8"`` or ``"int4"`` (coarse: with error
            feedback).
        error_feedback: keep, per bucket, what this rank's contribution lost
            to quantisation (``x - decode(encode(x))``) and add it to the next
            step's gradient. Costs one float32 copy of the gradients; makes
            int8 unbiased over time.
        process_group: group to reduce over (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "int8", error_feedback=True)
        >>> torch.save({"hook": state}, "ckpt.pt")      # residuals included
    """

    __slots__ = ("codec", "error_feedback", "residuals")
    _saved = ("codec", "error_feedback", "residuals")

    def __init__(self, codec: str, error_feedback: bool = False, process_group=None):
        super().__init__(process_group)
        if codec not in CODECS:
            raise ValueError(f"torch_ringdist.hooks: unknown codec {codec!r} (known: "
                             f"{', '.join(CODECS)})")
        self.codec = codec
        self.error_feedback = bool(error_feedback)
        self.residuals: dict[int, torch.Tensor] = {}  # bucket index -> float32 residual

    def _run(self, bucket, provisional):
        buffer = bucket.buffer()
        residual = None
        if self.error_feedback and not provisional:
            check_float32(self.codec, buffer)
            index = bucket.index()
            residual = self.residuals.get(index)
            if residual is None or residual.numel() != buffer.numel():
                residual = torch.zeros_like(buffer)
                self.residuals[index] = residual
        if bucket.is_last():
            self.iteration += 1
        return compressed_bucket(self.process_group, buffer, self.codec, self.codec, residual)


def allreduce_hook(state: AllreduceState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Uncompressed mean over the group, bitwise equal to DDP without a hook.

    Args:
        state: an :class:`AllreduceState`.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the averaged bucket buffer.
    """
    return state(bucket)


def fp16_hook(state: CodecState, bucket) -> torch.futures.Future[torch.Tensor]:
    """fp16 on the wire (block-scaled: no overflow), float32 sums. See :class:`CodecState`."""
    return state(bucket)


def bf16_hook(state: CodecState, bucket) -> torch.futures.Future[torch.Tensor]:
    """bfloat16 on the wire, float32 sums; works on CPU. See :class:`CodecState`."""
    return state(bucket)


def int8_hook(state: CodecState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Blockwise int8 on the wire (~0.254x bytes), float32 sums. See :class:`CodecState`."""
    return state(bucket)


def int4_hook(state: CodecState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Blockwise 4-bit integers on the wire (~0.129x bytes), float32 sums; use it with
    ``error_feedback=True``. See :class:`CodecState`."""
    return state(bucket)


add_hook("allreduce", allreduce_hook, AllreduceState)
add_hook("fp16", fp16_hook, CodecState, functools.partial(CodecState, "fp16"))
add_hook("bf16", bf16_hook, CodecState, functools.partial(CodecState, "bf16"))
add_hook("int8", int8_hook, CodecState, functools.partial(CodecState, "int8"))
add_hook("int4", int4_hook, CodecState, functools.partial(CodecState, "int4"))
