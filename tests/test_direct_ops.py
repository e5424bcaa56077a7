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

    strided = torch.arange(12, dtype=torch.float32).view(3, 4).t() + rank
    torch_ringdist.direct_all_reduce(strided)  # not contiguous: dist.all_reduce
    expected = (torch.arange(12, dtype=torch.float32).view(3, 4).t() * ws + ws * (ws - 1) / 2)
    assert torch.equal(strided, expected)
    scalar = torch_ringdist.direct_all_gather(torch.tensor(float(rank)))
    assert torch.equal(scalar, torch.arange(ws, dtype=torch.float32))
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


def test_torch_compile_traces_the_direct_op_without_a_graph_break(world_factory):
    results = world_factory(2).run(_case_compile, timeout=300)
    for breaks, graphs, same in results:
        assert breaks == 0 and graphs == 1 and same, (breaks, graphs, same)
