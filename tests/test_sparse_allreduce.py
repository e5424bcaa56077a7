"""Sparse COO allreduce (SUM): against the dense sum of every rank's tensor (each rank
rebuilds every other rank's input from its seed), and DDP with a sparse embedding against
a single-process reference trained on the global batch. The functions named ``_w_*`` run
inside the world's ranks (tests/harness/world.py).
"""
import copy
import hashlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.world import default_backend, ranks_equal

pytestmark = pytest.mark.quick

# (shape, nnz per rank (cycled), dtype): 1-D and embedding-like 2-D tensors, duplicate
# indices within a rank, ranks with nothing, every rank with nothing.
CASES = [
    ((50,), [5, 0, 7], torch.float32),
    ((40, 8), [10, 3, 0, 25], torch.float32),
    ((30, 4), [6], torch.float64),
    ((20, 3), [4, 9], torch.int64),
    ((7, 5), [0], torch.float32),
]


def _sparse(rank, case, shape, nnz, dtype):
    g = torch.Generator().manual_seed(1000 * case + rank)
    indices = torch.randint(0, shape[0], (1, nnz), generator=g)
    if dtype.is_floating_point:
        values = torch.randn(nnz, *shape[1:], generator=g, dtype=dtype)
    else:
        values = torch.randint(-1000, 1000, (nnz, *shape[1:]), generator=g, dtype=dtype)
    return torch.sparse_coo_tensor(indices, values, shape)


def _digest(t):
    t = t.coalesce()
    return hashlib.sha1(t.indices().numpy().tobytes() + t.values().numpy().tobytes()).hexdigest()


def _w_sparse(rank, ws):
    out = {}
    for case, (shape, nnzs, dtype) in enumerate(CASES):
        def nnz_of(r):
            return nnzs[r % len(nnzs)]
        t = _sparse(rank, case, shape, nnz_of(rank), dtype)
        dist.all_reduce(t)
        wide = torch.float64 if dtype.is_floating_point else torch.int64
        expected = sum(_sparse(r, case, shape, nnz_of(r), dtype).to_dense().to(wide)
                       for r in range(ws))
        got = t.to_dense().to(wide)
        ok = t.is_sparse and (torch.allclose(got, expected, rtol=1e-6, atol=1e-5)
                              if dtype.is_floating_point else torch.equal(got, expected))
        out[f"{shape} {nnzs} {dtype}"] = (
            None if ok else f"differs from the dense sum by {(got - expected).abs().max()}",
            _digest(t))
    return out


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_sparse_all_reduce_is_the_dense_sum(world_factory, ws):
    results = world_factory(ws).run(_w_sparse, timeout=120)
    failures = [f"rank {r}: {k}: {v[0]}" for r, res in enumerate(results)
                for k, v in res.items() if v[0]]
    assert not failures, "\n".join(failures)
    ranks_equal([{k: v[1] for k, v in res.items()} for res in results], "sparse results")


def _w_bad_sparse(rank, ws, what):
    if what == "avg":
        t = _sparse(rank, 0, (10, 2), 3, torch.float32)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        except (RuntimeError, ValueError) as exc:
            return str(exc)
        return "no error"
    shape = (10, 2) if rank == 0 else (11, 2)
    try:
        dist.all_reduce(_sparse(rank, 0, shape, 3, torch.float32))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@pytest.mark.skipif(default_backend() != "ringdist", reason="ringdist's own messages")
def test_sparse_all_reduce_errors_name_the_problem(world_factory):
    msgs = world_factory(2).run(_w_bad_sparse, "avg", timeout=60)
    assert all("SUM only" in m and "rank" in m for m in msgs), msgs
    # Shapes that differ fail on every rank, naming the other rank's shape (own world: the
    # failed collective aborts the group, as every engine error does).
    msgs = world_factory(2, env={"RINGDIST_TEST_CASE": "sparse-shape"}).run(
        _w_bad_sparse, "shape", timeout=60)
    assert all("has a sparse tensor of shape [1" in m for m in msgs), msgs


class _Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(200, 8, sparse=True)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(1))


def _w_ddp_sparse(rank, ws, steps, per_rank):
    torch.manual_seed(0)
    ref = _Recommender()
    model = copy.deepcopy(ref)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    worst = 0.0
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 200, (ws * per_rank, 5), generator=g)
        labels = torch.randint(0, 3, (ws * per_rank,), generator=g)
        opt_ref.zero_grad()
        F.cross_entropy(ref(ids), labels).backward()
        opt_ref.step()
        shard = slice(rank * per_rank, (rank + 1) * per_rank)
        opt.zero_grad()
        F.cross_entropy(ddp(ids[shard]), labels[shard]).backward()
        assert model.embedding.weight.grad.is_sparse
        opt.step()
        worst = max(worst, max((p - q).abs().max().item()
                               for p, q in zip(model.parameters(), ref.parameters())))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"worst": worst, "params": flat.numpy().tobytes()}


@pytest.mark.parametrize("ws", [2, 3])
def test_ddp_with_a_sparse_embedding_matches_one_process(world_factory, ws):
    results = world_factory(ws).run(_w_ddp_sparse, 8, 4, timeout=120)
    worst = max(r["worst"] for r in results)
    assert worst < 1e-5, f"DDP drifts from the single-process reference by {worst}"
    ranks_equal([r["params"] for r in results], "parameters")
