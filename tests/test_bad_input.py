"""Input validation: bad calls raise at once, on every rank, naming the operation,
and leave the process group usable (a correct all_reduce follows each failure).

Every case fails identically on all ranks, so no rank is left waiting in a
collective. Cases go through the public torch.distributed API where torch's Python
layer passes them to the backend unchecked, and through the ProcessGroup methods
where the Python layer would otherwise reject them before the backend sees them.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from harness.world import default_backend

pytestmark = pytest.mark.quick

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

OP_RE = {
    "all_reduce": r"(?i)all_?reduce",
    "broadcast": r"(?i)broadcast",
    "reduce": r"(?i)reduce",
    "all_gather": r"(?i)all_?gather",
    "reduce_scatter": r"(?i)reduce_?scatter",
    "gather": r"(?i)gather",
    "scatter": r"(?i)scatter",
    "all_to_all": r"(?i)all_?to_?all",
}


def _pg():
    return c10d._get_default_group()


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _premul():
    return dist._make_nccl_premul_sum(2.0)


def _f(n=4, dtype=torch.float32):
    return torch.ones(n, dtype=dtype)


# name -> (operation, builder(rank, ws) returning a Work or None). Builders ask for
# async work where the API allows it, so an error deferred to wait() is visible as such.
CASES = {
    # empty tensor lists
    "all_reduce_coalesced-empty_list": ("all_reduce", lambda r, ws: dist.all_reduce_coalesced([], async_op=True)),
    "all_gather-empty_output_list": ("all_gather", lambda r, ws: dist.all_gather([], _f(), async_op=True)),
    "reduce_scatter-empty_input_list": ("reduce_scatter", lambda r, ws: dist.reduce_scatter(_f(), [], async_op=True)),
    "all_to_all-empty_lists": ("all_to_all", lambda r, ws: dist.all_to_all([], [], async_op=True)),
    # bad roots (gather/scatter lists left None: torch's Python layer only checks those)
    "broadcast-root=world_size": ("broadcast", lambda r, ws: dist.broadcast(_f(), ws, async_op=True)),
    "broadcast-root=-1": ("broadcast", lambda r, ws: dist.broadcast(_f(), -1, async_op=True)),
    "reduce-root=world_size": ("reduce", lambda r, ws: dist.reduce(_f(), ws, async_op=True)),
    "gather-root=world_size": ("gather", lambda r, ws: dist.gather(_f(), None, ws, async_op=True)),
    "scatter-root=world_size": ("scatter", lambda r, ws: dist.scatter(_f(), None, ws, async_op=True)),
    # mixed dtypes in one call (ProcessGroup methods: the Python API rejects these itself)
    "all_reduce_coalesced-mixed_dtypes": ("all_reduce", lambda r, ws: _pg().allreduce_coalesced(
        [_f(3), _f(3, torch.float64)], dist.AllreduceCoalescedOptions())),
    "all_gather-mixed_dtypes": ("all_gather", lambda r, ws: _pg().allgather(
        [[_f(4, torch.float64) for _ in range(ws)]], [_f()], c10d.AllgatherOptions())),
    "all_gather_single-mixed_dtypes": ("all_gather", lambda r, ws: all_gather_single(
        _f(4 * ws, torch.float64), _f(), async_op=True)),
    "reduce_scatter-mixed_dtypes": ("reduce_scatter", lambda r, ws: _pg().reduce_scatter(
        [_f()], [[_f(4, torch.float64) for _ in range(ws)]], dist.ReduceScatterOptions())),
    # a device ringdist does not take (straight to the backend: torch's dispatch by device
    # type would refuse it before any backend saw it)
    "all_reduce-meta_device": ("all_reduce", lambda r, ws: _pg()._get_backend(torch.device("cpu")).allreduce(
        [torch.ones(4, device="meta")], dist.AllreduceOptions())),
    # sparse and unsupported dtypes
    "all_reduce-sparse_MAX": ("all_reduce", lambda r, ws: dist.all_reduce(
        _f().to_sparse(), op=dist.ReduceOp.MAX, async_op=True)),
    "broadcast-sparse": ("broadcast", lambda r, ws: dist.broadcast(_f().to_sparse(), 0, async_op=True)),
    "all_reduce-complex64": ("all_reduce", lambda r, ws: _pg().allreduce(
        [_f(4, torch.complex64)], dist.AllreduceOptions())),
    # (the public all_reduce/broadcast pass complex tensors on as real views: legal)
    "broadcast-complex64": ("broadcast", lambda r, ws: _pg().broadcast(
        [_f(4, torch.complex64)], dist.BroadcastOptions())),
    "all_reduce-uint16": ("all_reduce", lambda r, ws: dist.all_reduce(_f(4, torch.uint16), async_op=True)),
    # unsupported reduce ops
    "all_reduce-PREMUL_SUM": ("all_reduce", lambda r, ws: dist.all_reduce(_f(), op=_premul(), async_op=True)),
    "reduce-PREMUL_SUM": ("reduce", lambda r, ws: dist.reduce(_f(), 0, op=_premul(), async_op=True)),
    "reduce_scatter_single-PREMUL_SUM": ("reduce_scatter", lambda r, ws: reduce_scatter_single(
        _f(), _f(4 * ws), op=_premul(), async_op=True)),
    "all_reduce-bool_AVG": ("all_reduce", lambda r, ws: dist.all_reduce(
        _f(4, torch.bool), op=dist.ReduceOp.AVG, async_op=True)),
    # size mismatches
    "all_gather_single-output_too_large": ("all_gather", lambda r, ws: all_gather_single(
        _f(4 * ws + 1), _f(), async_op=True)),
    "all_gather_single-output_too_small": ("all_gather", lambda r, ws: all_gather_single(
        _f(4 * ws - 1), _f(), async_op=True)),
    "reduce_scatter_single-input_size_mismatch": ("reduce_scatter", lambda r, ws: reduce_scatter_single(
        _f(), _f(4 * ws + 1), async_op=True)),
}

# Gloo reference run only: cases gloo accepts (so there is nothing to check) ...
GLOO_GAPS = {
    "all_reduce-sparse_MAX": "gloo's sparse all_reduce has its own rules",
    "all_reduce-complex64": "gloo supports complex tensors",
    "broadcast-complex64": "gloo supports complex tensors",
}
# ... and cases gloo rejects only when the work is waited on, not at the call.
GLOO_LATE_ERRORS = {"all_reduce-uint16", "all_reduce-PREMUL_SUM", "reduce-PREMUL_SUM",
                    "reduce_scatter_single-PREMUL_SUM", "all_reduce-bool_AVG"}


def _bad_call(rank, ws, case):
    warnings.simplefilter("ignore")  # deprecation and not-in-group chatter
    _, build = CASES[case]
    report = {"phase": None, "type": None, "message": None, "is_runtime_or_value": None}
    try:
        work = build(rank, ws)
    except Exception as e:  # noqa: BLE001  (the type is checked in the parent)
        report.update(phase="call", type=type(e).__name__, message=str(e),
                      is_runtime_or_value=isinstance(e, (RuntimeError, ValueError)))
    else:
        try:
            if work is not None:
                work.wait()
        except Exception as e:  # noqa: BLE001
            report.update(phase="wait", type=type(e).__name__, message=str(e),
                          is_runtime_or_value=isinstance(e, (RuntimeError, ValueError)))
    # The group must still work after the failure.
    x = torch.arange(5, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    report["good_allreduce_ok"] = torch.equal(x, torch.arange(5, dtype=torch.float32) * (ws * (ws + 1) // 2))
    return report


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("ws", [1, 2, 3, 4], ids=lambda w: f"ws{w}")
def test_bad_call_raises_on_every_rank_and_leaves_the_group_usable(world_factory, ws, case):
    backend = default_backend()
    if backend == "gloo" and case in GLOO_GAPS:
        pytest.skip(GLOO_GAPS[case])
    results = world_factory(ws).run(_bad_call, case, timeout=30)
    op = CASES[case][0]
    for rank, rep in enumerate(results):
        where = f"rank {rank}, {case}"
        assert rep["phase"] is not None, f"{where}: no exception raised"
        assert rep["is_runtime_or_value"], \
            f"{where}: raised {rep['type']}, not RuntimeError/ValueError: {rep['message']}"
        if not (backend == "gloo" and case in GLOO_LATE_ERRORS):
            assert rep["phase"] == "call", f"{where}: error deferred to wait(): {rep['message']}"
        if backend == "ringdist":
            assert re.search(OP_RE[op], rep["message"]), \
                f"{where}: message does not name the operation ({OP_RE[op]}): {rep['message']!r}"
            if case.endswith("PREMUL_SUM"):
                assert "reduce op PREMUL_SUM (NCCL-only" in rep["message"], \
                    f"{where}: message does not name the reduce op: {rep['message']!r}"
        assert rep["good_allreduce_ok"], f"{where}: all_reduce after the error gave a wrong result"
