"""DistributedDataParallel on the backend vs a single-process reference.

Every rank also trains a plain (non-DDP) copy of the same model on the *global*
batch; DDP's averaged gradients over equal local shards must reproduce it.
The functions named ``_w_*`` run inside the world's ranks (tests/harness/world.py).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.world import ranks_equal

pytestmark = pytest.mark.quick

# Per-step parity bounds: float32 sums in a different order (per-shard means,
# then an allreduce), so a few ulps of drift per step are expected.
TOL = {torch.float32: dict(atol=1e-6, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ----------------------------------------------------------------- rank side

def _mlp(dtype, seed=0):
    torch.manual_seed(seed)  # identical init on every rank and for the reference
    return nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4),
    ).to(dtype)


def _global_batch(gen, world_size, per_rank, dtype, n_in=8, n_out=4):
    # Same generator seed on every rank: every rank sees the same global batch.
    x = torch.randn(world_size * per_rank, n_in, generator=gen, dtype=dtype)
    y = torch.randn(world_size * per_rank, n_out, generator=gen, dtype=dtype)
    return x, y


def _max_abs_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def _check_step(ddp_model, ref, dtype):
    tol = TOL[dtype]
    ok = all(torch.allclose(p, q, **tol) for p, q in zip(ddp_model.parameters(), ref.parameters()))
    return ok, _max_abs_diff(ddp_model, ref)


def _flat_params(model):
    # Raw bytes so the parent can test bitwise equality across ranks.
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()


def _w_parity(rank, world_size, dtype_name, gradient_as_bucket_view, steps, bucket_cap_mb):
    dtype = DTYPES[dtype_name]
    ref = _mlp(dtype)
    model = copy.deepcopy(ref)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1234)
    per_rank = 4
    steps_out = []
    for _ in range(steps):
        x, y = _global_batch(gen, world_size, per_rank, dtype)
        opt_ref.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt_ref.step()

        shard = slice(rank * per_rank, (rank + 1) * per_rank)
        opt.zero_grad()
        F.mse_loss(ddp(x[shard]), y[shard]).backward()
        opt.step()
        steps_out.append(_check_step(model, ref, dtype))
    # DDP rebuilds its buckets after the first step, under the cap; count them.
    n_buckets = ddp._get_ddp_logging_data().get("num_buckets_reduced", 0)
    return {"steps": steps_out, "params": _flat_params(model), "buckets": n_buckets}


class _Branchy(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(8, 8).to(dtype)
        self.branch = nn.Linear(8, 8).to(dtype)
        self.head = nn.Linear(8, 4).to(dtype)

    def forward(self, x, use_branch):
        h = torch.tanh(self.trunk(x))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.head(h)


def _w_unused(rank, world_size, pattern):
    """pattern[step] = set of ranks that use the branch on that step."""
    dtype = torch.float32
    ref = _Branchy(dtype)
    model = copy.deepcopy(ref)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(99)
    per_rank = 4
    steps_out = []
    for users in pattern:
        x, y = _global_batch(gen, world_size, per_rank, dtype)
        # Reference: DDP averages per-rank mean losses, each rank with its own branch choice.
        opt_ref.zero_grad()
        loss = sum(
            F.mse_loss(ref(x[r * per_rank:(r + 1) * per_rank], r in users),
                       y[r * per_rank:(r + 1) * per_rank])
            for r in range(world_size)
        ) / world_size
        loss.backward()
        opt_ref.step()

        shard = slice(rank * per_rank, (rank + 1) * per_rank)
        opt.zero_grad()
        F.mse_loss(ddp(x[shard], rank in users), y[shard]).backward()
        opt.step()
        steps_out.append(_check_step(model, ref, dtype))
    return {"steps": steps_out, "params": _flat_params(model)}


def _w_no_sync(rank, world_size, gradient_as_bucket_view, accum, steps):
    dtype = torch.float32
    ref = _mlp(dtype)
    model = copy.deepcopy(ref)
    ddp = DDP(model, bucket_cap_mb=0.001, gradient_as_bucket_view=gradient_as_bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(7)
    per_rank = 3
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    steps_out = []
    for _ in range(steps):
        opt.zero_grad()
        opt_ref.zero_grad()
        for micro in range(accum):
            x, y = _global_batch(gen, world_size, per_rank, dtype)
            F.mse_loss(ref(x), y).backward()  # gradients accumulate over micro-batches
            if micro < accum - 1:
                with ddp.no_sync():  # local accumulation only, no allreduce
                    F.mse_loss(ddp(x[shard]), y[shard]).backward()
            else:
                F.mse_loss(ddp(x[shard]), y[shard]).backward()  # allreduces the accumulated sum
        opt.step()
        opt_ref.step()
        steps_out.append(_check_step(model, ref, dtype))
    return {"steps": steps_out, "params": _flat_params(model)}


def _w_powersgd(rank, world_size, steps):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    ddp = DDP(model, bucket_cap_mb=0.01)
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=3, random_seed=0)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    # A linear teacher: an easy problem whose loss must fall.
    gen = torch.Generator().manual_seed(5)
    teacher = torch.randn(32, 1, generator=gen) / 32 ** 0.5
    per_rank = 16
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(world_size * per_rank, 32, generator=gen)
        y = x @ teacher
        opt.zero_grad()
        loss = F.mse_loss(ddp(x[shard]), y[shard])
        loss.backward()
        opt.step()
        with torch.no_grad():  # global-batch loss, identical on every rank if replicas agree
            losses.append(F.mse_loss(model(x), y).item())
    return {
        "losses": losses,
        "params": _flat_params(model),
        # Confirms the hook really compressed (not only the vanilla warm-up allreduces).
        "numel_before": state.total_numel_before_compression,
        "numel_after": state.total_numel_after_compression,
    }


# --------------------------------------------------------------- parent side

def _assert_parity(results, what):
    for rank, res in enumerate(results):
        for step, (ok, diff) in enumerate(res["steps"]):
            assert ok, f"{what}: rank {rank} step {step} diverged from the reference (max |diff| {diff:.3g})"
    ranks_equal([r["params"] for r in results], what=f"{what}: parameters (bitwise)")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("gradient_as_bucket_view", [False, True])
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_ddp_matches_single_process(world_factory, world_size, gradient_as_bucket_view, dtype_name):
    world = world_factory(world_size)
    # 0.0002 MB (~200 B) puts this model's 6 gradients into 3 buckets.
    results = world.run(_w_parity, dtype_name, gradient_as_bucket_view, steps=6, bucket_cap_mb=0.0002)
    assert all(r["buckets"] >= 3 for r in results), [r["buckets"] for r in results]
    _assert_parity(results, f"ws={world_size} gabv={gradient_as_bucket_view} {dtype_name}")


@pytest.mark.parametrize("world_size", [2, 3])
def test_find_unused_parameters(world_factory, world_size):
    # Branch used by: every rank, no rank, only rank 0, all but rank 0, every rank.
    everyone = set(range(world_size))
    pattern = [everyone, set(), {0}, everyone - {0}, everyone, {world_size - 1}]
    results = world_factory(world_size).run(_w_unused, pattern)
    _assert_parity(results, f"find_unused ws={world_size}")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("gradient_as_bucket_view", [False, True])
def test_no_sync_accumulation(world_factory, world_size, gradient_as_bucket_view):
    results = world_factory(world_size).run(_w_no_sync, gradient_as_bucket_view, accum=3, steps=3)
    _assert_parity(results, f"no_sync ws={world_size} gabv={gradient_as_bucket_view}")


def test_powersgd_hook(world_factory):
    steps = 40
    results = world_factory(2).run(_w_powersgd, steps)
    ranks_equal([r["params"] for r in results], what="PowerSGD replicas (bitwise)")
    ranks_equal([r["losses"] for r in results], what="PowerSGD losses")
    res = results[0]
    assert 0 < res["numel_after"] < res["numel_before"], "PowerSGD never compressed a bucket"
    first, last = res["losses"][0], res["losses"][-1]
    assert last < 0.2 * first, f"PowerSGD training did not converge: loss {first:.4g} -> {last:.4g}"
