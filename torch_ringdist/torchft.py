"""ringdist inside torchft (fault-tolerant training, ``pip install torchft``).

torchft re-forms the process group of its replicas whenever the quorum changes, through a
``ProcessGroupWrapper`` whose ``_create_pg`` builds a fresh group on each ``configure``. This
module's :class:`ProcessGroupRingdist` is that wrapper for ringdist, so torchft's Manager, DDP,
LocalSGD and (Streaming) DiLoCo run their replica collectives on ringdist::

    from torch_ringdist.torchft import ProcessGroupRingdist
    manager = torchft.Manager(pg=ProcessGroupRingdist(codec="int8"), ...)

``codec`` ("fp16", "bf16", "int8", "int4"; default None: exact) sends the float32 SUM
allreduces torchft issues (gradients, DiLoCo's pseudo-gradients) through ringdist's compressed
allreduce: the wire carries the codec, sums stay float32, and the result is bitwise identical on
every replica. Without error feedback: what the codec loses in one call is not carried over.
``abort()`` fails the group's queued and running operations at once; ``errored()`` returns the
first error of an operation of the current group (None after a new ``configure``).
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torchft.process_group import ProcessGroupWrapper

from torch_ringdist._collectives import CODECS
from torch_ringdist._extension import load
from torch_ringdist._registration import _devices


class ProcessGroupRingdist(ProcessGroupWrapper):
    """A reconfigurable ringdist group for torchft (see the module's docstring).

    Args:
        timeout: deadline of each operation and of the group's creation.
        codec: wire codec for float32 SUM allreduces (None: exact).
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), codec: str | None = None):
        if codec is not None and codec not in CODECS:
            raise ValueError(f"torch_ringdist.torchft.ProcessGroupRingdist: unknown codec "
                             f"{codec!r} (known: {', '.join(CODECS)})")
        super().__init__(timeout=timeout)
        self._codec = codec
        self._error: Exception | None = None

    def _create_pg(self, store, rank: int, world_size: int):
        self._error = None
        pg = dist.ProcessGroup(store, rank, world_size)
        backend = load().create_backend(store, rank, world_size, self._timeout)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        for device in _devices():
            pg._register_backend(torch.device(device), custom, backend)
        pg._set_default_backend(custom)
        self._backend = backend
        return pg

    def getBackendName(self) -> str:
        return "torchft-ringdist"

    def shutdown(self) -> None:
        # torchft only drops the group; end it here, before the store it talks to goes away.
        if self._pg is not None:
            self._pg.shutdown()
        super().shutdown()

    def errored(self) -> Exception | None:
        return self._error

    def allreduce(self, tensors, opts):
        if (self._codec is not None and len(tensors) == 1 and tensors[0].dtype == torch.float32
                and tensors[0].device.type == "cpu" and _is_sum(opts)):
            with self._run_context():
                work = self._backend.allreduce_compressed(tensors[0], self._codec, False)
                return self._wrap_work(work, opts)
        return super().allreduce(tensors, opts)

    def _wrap_work(self, work, opts):
        def record(fut):
            try:
                fut.value()
            except Exception as exc:  # noqa: BLE001 (kept for errored(); the caller sees it too)
                if self._error is None:
                    self._error = exc

        work.get_future().then(record)
        return work


def _is_sum(opts) -> bool:
    """AllreduceOptions or a bare ReduceOp (torchft passes either) asking for SUM."""
    return getattr(opts, "reduceOp", opts) == dist.ReduceOp.SUM
