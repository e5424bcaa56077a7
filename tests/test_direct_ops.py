"""The direct operators (torch.ops.ringdist.all_reduce_ / all_gather, torch_ringdist.direct_*):
the same bits as dist.all_reduce / all_gather_into_tensor at every size and path, the fallback
for other tensors, clear errors, and torch.compile tracing them without a graph break."""
import pytest

WORLD_SIZES = [2, 3]
# One round, ring (and single copy from 64 KiB with two ranks), several segments.
COUNTS = [1, 7, 1024, 16384 + 3, 1 << 20]


def _case_same_bits(rank, ws, counts):
    import torch
    import torch.distributed as dist

    import torch_ringdist

    ops = [(torch.float32, dist.ReduceOp.SUM), (torch.float64, dist.ReduceOp.AVG),
           (torch.bfloat16, dist.ReduceOp.SUM), (torch.float16, dist.ReduceOp.MAX),
           (torch.int64, dist.ReduceOp.PRODUCT), (torch.int32, dist.ReduceOp.BXOR)]
    for n in counts:
        for dtype, op in ops:
            g = torch.Generator().manual_seed(1000 * rank + n)
            if dtype.is_floating_point:
                x = torch.randn(n, generator=g).to(dtype)
            else:
                x = torch.randint(-3, 4, (n,), generator=g, dtype=dtype)
            reference = x.clone()
            dist.all_reduce(reference, op=op)
            out = torch_ringdist.direct_all_reduce(x, op=op)
            assert out is x
            assert torch.equal(x.view(torch.uint8), reference.view(torch.uint8)), (n, dtype, op)
        mine = torch.arange(n, dtype=torch.float32) + rank * n
        gathered = torch_ringdist.direct_all_gather(mine.view(1, n) if n > 1 else mine)
        expected = torch.arange(ws * n, dtype=torch.float32)
        assert torch.equal(gathered.reshape(-1), expected), n
    return True


def _case_fallback_and_errors(rank, ws):
    import torch
    import torch.distributed as dist

    import torch_ringdist

    torch_ringdist.reset_stats()
    strided = torch.arange(12, dtype=torch.float32).view(3, 4).t() + rank
    torch_ringdist.direct_all_reduce(strided)  # not contiguous: copied in and back by the op
    expected = (torch.arange(12, dtype=torch.float32).view(3, 4).t() * ws + ws * (ws - 1) / 2)
    assert torch.equal(strided, expected)
    gathered = torch_ringdist.direct_all_gather(torch.arange(6.0).view(2, 3).t() + 10 * rank)
    assert torch.equal(gathered, torch.cat([torch.arange(6.0).view(2, 3).t() + 10 * r
                                            for r in range(ws)]))
    scalar = torch_ringdist.direct_all_gather(torch.tensor(float(rank)))
    assert torch.equal(scalar, torch.arange(ws, dtype=torch.float32))
    stats = torch_ringdist.stats()
    assert stats["allreduce"]["calls"] == 1 and stats["allgather"]["calls"] == 2, stats
    # Sparse tensors take dist.all_reduce (ringdist's sparse allreduce).
    sparse = torch.sparse_coo_tensor([[rank]], [1.0], (ws,))
    summed = torch_ringdist.direct_all_reduce(sparse).to_dense()
    assert torch.equal(summed, torch.ones(ws)), summed
    assert torch_ringdist.stats()["allreduce_sparse"]["calls"] == 1
    name = dist.distributed_c10d._get_default_group().group_name
    errors = {}
    for key, call in {
        "op": lambda: torch.ops.ringdist.all_reduce_(torch.ones(2), "median", name),
        "dtype": lambda: torch.ops.ringdist.all_reduce_(torch.ones(2, dtype=torch.complex64),
                                                        "sum", name),
        "group": lambda: torch.ops.ringdist.all_reduce_(torch.ones(2), "sum", "no-such-group"),
    }.items():
        try:
            call()
        except RuntimeError as exc:
            errors[key] = str(exc).splitlines()[0]
    gloo = dist.new_group(backend="gloo")
    try:
        torch_ringdist.direct_all_reduce(torch.ones(2), group=gloo)
    except RuntimeError as exc:
        errors["gloo"] = str(exc).splitlines()[0]
    dist.barrier()
    return errors


def _case_failures(rank, ws):
    """A direct call that fails (counts that differ; a rank that never calls) raises
    DistBackendError on every rank that called, naming what went wrong, within the group's
    timeout; the default group is unharmed."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    import torch_ringdist

    def attempt(tensor, group):
        start = time.monotonic()
        try:
            torch_ringdist.direct_all_reduce(tensor, group=group)
            return None
        except Exception as exc:  # noqa: BLE001
            return ([c.__name__ for c in type(exc).__mro__], str(exc).splitlines()[0],
                    time.monotonic() - start)

    out = {}
    sub = dist.new_group(list(range(ws)), timeout=datetime.timedelta(seconds=5))
    dist.barrier(group=sub)
    x = torch.ones(5 if rank == 0 else 7)
    out["mismatch"] = attempt(x, sub)
    out["unchanged"] = bool((x == 1).all())
    dist.destroy_process_group(sub)
    sub = dist.new_group(list(range(ws)), timeout=datetime.timedelta(seconds=2))
    dist.barrier(group=sub)
    out["skipped"] = attempt(torch.ones(3), sub) if rank != 1 else None
    dist.barrier()
    dist.destroy_process_group(sub)
    y = torch.full((4,), float(rank))
    torch_ringdist.direct_all_reduce(y)
    out["after"] = torch.equal(y, torch.full((4,), float(sum(range(ws)))))
    return out


def _case_compile(rank, ws):
    import torch
    import torch.distributed as dist

    import torch_ringdist

    def layer(x, w):
        y = x @ w
        torch_ringdist.direct_all_reduce(y)
        return torch.relu(y) + 1

    torch.manual_seed(0)
    x = torch.randn(4, 8) + rank
    w = torch.randn(8, 8)
    eager = layer(x.clone(), w)
    explained = torch._dynamo.explain(layer)(x.clone(), w)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x.clone(), w)
    dist.barrier()
    return explained.graph_break_count, explained.graph_count, torch.equal(eager, compiled)


@pytest.mark.quick
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_direct_ops_give_the_bits_of_the_ordinary_path(world_factory, ws):
    assert world_factory(ws).run(_case_same_bits, COUNTS, timeout=300) == [True] * ws


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_direct_ops_fallback_and_errors(world_factory, ws):
    for rank, errors in enumerate(world_factory(ws).run(_case_fallback_and_errors)):
        assert "unknown reduce op 'median'" in errors["op"], errors
        assert f"ringdist allreduce: rank {rank}" in errors["dtype"] and "ComplexFloat" in errors["dtype"]
        assert "no-such-group" in errors["group"], errors
        assert "uses backend 'gloo', not ringdist" in errors["gloo"], errors


@pytest.mark.slow
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_direct_op_failures_raise_on_every_rank(world_factory, ws):
    for rank, out in enumerate(world_factory(ws).run(_case_failures, timeout=120)):
        mro, message, elapsed = out["mismatch"]
        assert "DistBackendError" in mro and f"rank {rank}" in message, out
        assert "count=5" in message or "count=7" in message, out
        assert elapsed < 5 and out["unchanged"] and out["after"], out
        if rank != 1:
            mro, message, elapsed = out["skipped"]
            assert "DistBackendError" in mro and "Timed out" in message and "rank(s) 1" in message, out
            assert elapsed < 2 + 3, out


def test_torch_compile_traces_the_direct_op_without_a_graph_break(world_factory):
    results = world_factory(2).run(_case_compile, timeout=300)
    for breaks, graphs, same in results:
        assert breaks == 0 and graphs == 1 and same, (breaks, graphs, same)
