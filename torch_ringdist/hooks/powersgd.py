"""PowerSGD: torch's implementation, with a checkpoint that resumes exactly."""

import logging
import types

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as _torch_powersgd

from torch_ringdist.hooks._base import HookState
from torch_ringdist.hooks._registry import add_hook

logger = logging.getLogger(__name__)


class _CudaSkippingCpu:
    """``torch.cuda`` whose ``synchronize`` ignores CPU devices."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def synchronize(device=None):
        if device is None or torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)


class _TorchForCpuBuckets:
    """``torch`` as torch's PowerSGD hook sees it for CPU buckets."""

    cuda = _CudaSkippingCpu()

    def __getattr__(self, name):
        return getattr(torch, name)


# torch's hook calls torch.cuda.synchronize(<the bucket's device>) whenever a GPU is
# visible, which raises for a CPU bucket ("Expected a cuda device, but got: cpu"), with
# any backend. The same code, seeing a torch whose synchronize skips CPU devices, serves
# CPU buckets on GPU machines.
_powersgd_for_cpu_buckets = types.FunctionType(
    _torch_powersgd.powerSGD_hook.__code__,
    {**vars(_torch_powersgd), "torch": _TorchForCpuBuckets()},
    "powerSGD_hook", _torch_powersgd.powerSGD_hook.__defaults__,
    _torch_powersgd.powerSGD_hook.__closure__)


class PowerSGDState(HookState):
    """State of the ``powersgd`` hook: torch's PowerSGD (low-rank gradient approximation).

    Runs ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`` (which
    works on ringdist: its allreduces issued from completion callbacks run
    inline on the worker). What this wrapper adds: torch's state keys its
    error feedback and P/Q memories by bucket index, which a freshly built
    DDP model (provisional buckets) does not reproduce after a restart; the
    ringdist state records the final bucket layout and regroups gradients
    into it, so a run resumed from ``torch.save(state)`` continues bitwise
    identically.

    Args:
        matrix_approximation_rank: rank of the approximation (default 1; 2-4
            for harder models).
        start_powerSGD_iter: plain allreduce before this step (>= 2: DDP's
            bucket rebuild must have happened; default 10).
        use_error_feedback, warm_start, min_compression_rate, random_seed,
        orthogonalization_epsilon: as in torch's ``PowerSGDState``.
        process_group: group (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "powersgd", matrix_approximation_rank=2)
    """

    __slots__ = ("inner",)
    _saved = ("inner",)

    def __init__(self, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 10,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 min_compression_rate: float = 2, random_seed: int = 0,
                 orthogonalization_epsilon: float = 0, process_group=None):
        super().__init__(process_group)
        self.inner = _torch_powersgd.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=int(matrix_approximation_rank),
            start_powerSGD_iter=int(start_powerSGD_iter),
            min_compression_rate=min_compression_rate,
            use_error_feedback=bool(use_error_feedback),
            warm_start=bool(warm_start),
            orthogonalization_epsilon=orthogonalization_epsilon,
            random_seed=int(random_seed),
        )

    def bind(self, ddp_model) -> None:
        super().bind(ddp_model)
        self.inner.process_group = self.process_group

    def _run(self, bucket, provisional):
        if bucket.is_last():
            self.iteration += 1
        hook = _torch_powersgd.powerSGD_hook if bucket.buffer().is_cuda else _powersgd_for_cpu_buckets
        return hook(self.inner, bucket)


def powersgd_hook(state: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """torch's PowerSGD with an exactly resumable state. See :class:`PowerSGDState`.

    Args:
        state: a :class:`PowerSGDState`.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the bucket buffer holding the averaged low-rank gradient.
    """
    return state(bucket)


add_hook("powersgd", powersgd_hook, PowerSGDState)
