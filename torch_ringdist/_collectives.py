"""Python entry points for ringdist-only operations: compressed allreduce and statistics."""
from __future__ import annotations

import torch
import torch.distributed as dist

from torch_ringdist._extension import load

CODECS = ("fp16", "bf16", "int8", "int4")


def ringdist_backend(group=None, what: str = "torch_ringdist"):
    """The ProcessGroupRingdist behind ``group`` (default group if None).

    Raises a ValueError naming ``what`` when the group does not run on ringdist.
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError as exc:
        raise ValueError(f"{what}: the process group has no CPU backend ({exc})") from exc
    if not isinstance(backend, load().ProcessGroupRingdist):
        name = dist.get_backend(pg)
        raise ValueError(
            f"{what}: rank {dist.get_rank()}: needs a process group on the 'ringdist' backend; "
            f"this group uses '{name}'")
    return backend


def all_reduce(tensor: torch.Tensor, codec: str | None = None, op=dist.ReduceOp.SUM,
               group=None, async_op: bool = False, residual: torch.Tensor | None = None):
    """Allreduce ``tensor`` in place, optionally compressed on the wire.

    Args:
        tensor: dense CPU tensor. With a codec: float32, bfloat16 or float16
            (half types are summed in float32 and rounded once at the end).
        codec: ``None`` (plain ``dist.all_reduce``), ``"fp16"``, ``"bf16"``,
            ``"int8"`` or ``"int4"``. Compressed results are bitwise identical on all ranks;
            each element is quantised at most twice whatever the world size (once between
            two ranks or two hosts).
        op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (with a codec; any op without).
        group: process group (default group if None); must be ringdist for a codec.
        async_op: return the Work (``wait()``, ``get_future()``) instead of waiting.
        residual: with a codec, error feedback: a float32 tensor of ``tensor.numel()``
            elements (zeros at first), added to the tensor, then given what the codec lost of
            this rank's contributions, for the next call (both on the backend's thread in
            call order). On several hosts with the same number of ranks each, the sum of
            each host's ranks is quantised once per chunk and the rank that quantised a chunk
            keeps its loss (zeros elsewhere); summed over the ranks, what the first
            quantisation lost.

    Returns:
        The Work if ``async_op``, else None.

    Example::

        residual = torch.zeros_like(grad)  # once
        torch_ringdist.all_reduce(grad, codec="int8", op=dist.ReduceOp.AVG, residual=residual)
    """
    if codec is None:
        if residual is not None:
            raise ValueError(f"torch_ringdist.all_reduce: rank {dist.get_rank()}: a residual "
                             "needs a codec (an allreduce without one loses nothing)")
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    if codec not in CODECS:
        raise ValueError(f"torch_ringdist.all_reduce: rank {dist.get_rank()}: unknown codec "
                         f"{codec!r} (known: {', '.join(CODECS)})")
    if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        raise ValueError(f"torch_ringdist.all_reduce: rank {dist.get_rank()}: a compressed "
                         f"allreduce supports SUM and AVG, got {op}")
    backend = ringdist_backend(group, "torch_ringdist.all_reduce")
    work = backend.allreduce_compressed(tensor, codec, op == dist.ReduceOp.AVG,
                                        residual=residual)
    if async_op:
        return work
    work.wait()
    return None


_REDUCE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
               dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band",
               dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor"}
_SUM = dist.ReduceOp.SUM
_direct_ops = None  # (all_reduce_, all_gather) overloads, once the extension is loaded


def _ops():
    # Bound once: a call through torch.ops' overload packet costs ~0.3 us more.
    global _direct_ops
    if _direct_ops is None:
        load()
        _direct_ops = (torch.ops.ringdist.all_reduce_.default, torch.ops.ringdist.all_gather.default)
    return _direct_ops


def _group_name(group) -> str:
    """torch's name of the group (the operator checks that it runs on ringdist)."""
    if group is None:
        # The default group without _get_default_group's checks, which cost a few tenths of
        # a microsecond per call; that call raises torch's error when there is none.
        group = dist.GroupMember.WORLD
        if group is None:
            group = dist.distributed_c10d._get_default_group()
    return group.group_name


def direct_all_reduce(tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Allreduce ``tensor`` in place through ``torch.ops.ringdist.all_reduce_`` and return it.

    The same operation and result bits as ``dist.all_reduce`` on a ringdist group, without
    c10d's dispatch, Work or Future: synchronous, on the calling thread when the group is idle.
    ``torch.compile`` traces it without a graph break. CUDA and sparse tensors take
    ``dist.all_reduce``.
    """
    if tensor.is_cpu and not tensor.is_sparse:
        # Written out, not shared with direct_all_gather: each Python call costs ~0.1 us here.
        if group is None:
            group = dist.GroupMember.WORLD or dist.distributed_c10d._get_default_group()
        (_direct_ops or _ops())[0](tensor, "sum" if op is _SUM else _REDUCE_OPS[op],
                                   group.group_name)
    else:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def direct_all_gather(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``tensor`` stacked along dimension 0 (as ``all_gather_into_tensor``),
    through ``torch.ops.ringdist.all_gather``: synchronous, no Work or Future; traced by
    ``torch.compile``. CUDA and sparse tensors take ``dist.all_gather_into_tensor``."""
    if tensor.is_cpu and not tensor.is_sparse:
        return _ops()[1](tensor, _group_name(group))
    size = dist.get_world_size(group)
    out = tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (size,))
    dist.all_gather_into_tensor(out, tensor, group=group)
    return out


def stats(group=None) -> dict:
    """Per-operation statistics of a ringdist group since creation or :func:`reset_stats`.

    Returns:
        ``{op_name: {"calls", "bytes_sent", "bytes_received", "bytes_sent_across_hosts",
        "payload_bytes", "seconds", "inline_calls", "shared_core_waits", "sleeps",
        "single_copy_bytes", "device_messages", "wire_ratio"}}``.
        ``bytes_sent_across_hosts`` is the part of ``bytes_sent`` that went to peers on
        other hosts (what crosses the network); ``inline_calls`` counts the calls that
        took the latency path (run on the calling thread); ``shared_core_waits`` the waits that slept at once
        because a peer on the same host last waited on the same CPU;
        ``sleeps`` the shared-memory waits that went to sleep on their doorbell
        (after spinning ~50 us, or at once as above: a peer that wakes a
        sleeper adds a wake-up to the call);
        ``single_copy_bytes`` the bytes this rank copied straight from or into
        same-host peers' memory (broadcast and allgather from
        ``RINGDIST_SINGLE_COPY_BYTES``); ``device_messages`` the sends handed
        over GPU to GPU (ranks sharing a GPU: the receiver copies from the
        sender's memory). Compressed allreduces appear per codec
        (``"compressed_allreduce/int8"``). ``wire_ratio`` is bytes sent divided
        by what a plain ring allreduce of the same payload sends
        (``2 (N-1)/N`` x payload): ~0.5 for fp16/bf16, ~0.254 for int8; it is
        given for allreduce entries only and is None for N=1.

    Example::

        torch_ringdist.reset_stats()
        train_step()
        print(torch_ringdist.stats()["compressed_allreduce/int8"]["wire_ratio"])
    """
    backend = ringdist_backend(group, "torch_ringdist.stats")
    world = dist.get_world_size(group)
    out = {}
    for name, entry in backend.stats().items():
        entry = dict(entry)
        ratio = None
        if (name == "allreduce" or name.startswith("compressed_allreduce")) and world > 1:
            plain = 2 * (world - 1) / world * entry["payload_bytes"]
            ratio = entry["bytes_sent"] / plain if plain else None
        entry["wire_ratio"] = ratio
        out[name] = entry
    return out


def reset_stats(group=None) -> None:
    """Zero the statistics of a ringdist group (see :func:`stats`)."""
    ringdist_backend(group, "torch_ringdist.reset_stats").reset_stats()


def trace(group=None) -> dict:
    """The group's last operations (``RINGDIST_TRACE_BUFFER``, default 2000), live, as the dict
    torch's flight recorder dumps: ``{"version", "pg_config", "pg_status", "entries"}``, each
    entry with its op, sizes, dtypes, sequence number and state (scheduled, started,
    completed). With ``RINGDIST_TRACE_DUMP=PREFIX`` each rank writes the same to
    ``PREFIX<rank>`` at the group's first failure (timeout, dead peer, desync); torch's
    analyser then names the first operation where the ranks diverged and the rank at fault::

        python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX
    """
    import pickle

    return pickle.loads(ringdist_backend(group, "torch_ringdist.trace")._trace_pickle())

