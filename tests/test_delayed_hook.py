"""The ``delayed`` hook against closed-form references simulated in one process.

- average (Pipe-SGD): w <- w - lr * g(t - s), g the gradient of the global batch's loss at
  the replicas' common parameters; step 0 synchronous, steps 1..s apply nothing. Replicas
  must stay bitwise identical.
- local (DGA): each of the N replicas, simulated side by side,
  w_k <- w_k - lr * (g_k(t) + mean_j g_j(t - s) - g_k(t - s)), step 0 synchronous.
- Convergence on a least-squares problem: within 2% of synchronous DDP's final loss.
The functions named ``_w_*`` run inside the world's ranks (tests/harness/world.py).
"""
import collections
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.world import ranks_equal

LR = 0.05
PER_RANK = 8


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).double()


def _batch(step, ws):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(ws * PER_RANK, 6, generator=g, dtype=torch.float64)
    w = torch.linspace(-1, 1, 18, dtype=torch.float64).reshape(6, 3)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(ws * PER_RANK, 3, generator=g,
                                                      dtype=torch.float64)


def _shard(t, rank):
    return t[rank * PER_RANK:(rank + 1) * PER_RANK]


def _grads(model, x, y):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _apply(model, update):
    with torch.no_grad():
        for p, u in zip(model.parameters(), update):
            p.sub_(LR * u)


def _reference(ws, steps, staleness, correction, rank):
    """Rank `rank`'s parameters after `steps` steps of the delayed rule, in one process."""
    replicas = [_model() for _ in range(ws)]
    queue = collections.deque()  # (mean of the local gradients, each replica's own)
    for step in range(steps):
        x, y = _batch(step, ws)
        local = [_grads(m, _shard(x, k), _shard(y, k)) for k, m in enumerate(replicas)]
        mean = [sum(g[i] for g in local) / ws for i in range(len(local[0]))]
        if step == 0:  # provisional buckets: synchronous
            for m in replicas:
                _apply(m, mean)
            continue
        queue.append((mean, local))
        old = queue.popleft() if len(queue) > staleness else None
        for k, m in enumerate(replicas):
            if correction == "average":
                if old is not None:
                    _apply(m, old[0])
            else:
                update = [g.clone() for g in local[k]]
                if old is not None:
                    update = [u + a - o for u, a, o in zip(update, old[0], old[1][k])]
                _apply(m, update)
    return torch.cat([p.detach().reshape(-1) for p in replicas[rank].parameters()])


def _w_delayed(rank, ws, steps, staleness, correction, inner):
    import torch_ringdist.hooks as hooks

    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.0002)  # several buckets, rebuilt after step 0
    hooks.register(ddp, "delayed", staleness=staleness, correction=correction, hook=inner)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    per_step = []
    for step in range(steps):
        x, y = _batch(step, ws)
        opt.zero_grad()
        F.mse_loss(ddp(_shard(x, rank)), _shard(y, rank)).backward()
        opt.step()
        per_step.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                        .numpy().tobytes())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    want = _reference(ws, steps, staleness, correction, rank)
    return {"diff": (flat - want).abs().max().item(), "per_step": per_step}


@pytest.mark.parametrize("ws,staleness", [(2, 1), (3, 2)])
@pytest.mark.parametrize("correction", ["average", "local"])
def test_delayed_matches_its_closed_form(world_factory, ws, staleness, correction):
    results = world_factory(ws).run(_w_delayed, 10, staleness, correction, "allreduce",
                                    timeout=120)
    worst = max(r["diff"] for r in results)
    assert worst < 1e-12, f"{correction} s={staleness}: off the reference by {worst}"
    if correction == "average":
        for step in range(10):
            ranks_equal([r["per_step"][step] for r in results], f"parameters after step {step}")
    else:
        assert results[0]["per_step"][-1] != results[1]["per_step"][-1], \
            "local correction left the replicas identical: not local"


def _w_least_squares(rank, ws, steps, name, options):
    import torch_ringdist.hooks as hooks

    torch.manual_seed(0)
    model = nn.Linear(16, 1, bias=False)
    ddp = DDP(model)
    if name != "sync":
        hooks.register(ddp, name, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7)
    w_true = torch.randn(16, 1, generator=g)
    x_all = torch.randn(ws * 64, 16, generator=g)
    y_all = x_all @ w_true + 0.01 * torch.randn(ws * 64, 1, generator=g)
    x, y = x_all[rank * 64:(rank + 1) * 64], y_all[rank * 64:(rank + 1) * 64]
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    with torch.no_grad():
        return F.mse_loss(model(x_all), y_all).item()


@pytest.mark.parametrize("ws", [2, 4])
def test_delayed_converges_like_synchronous(world_factory, ws):
    world = world_factory(ws)
    sync = world.run(_w_least_squares, 150, "sync", {}, timeout=120)[0]
    for options in ({"correction": "average"}, {"correction": "local"},
                    {"correction": "average", "hook": "int8", "error_feedback": True}):
        loss = max(world.run(_w_least_squares, 150, "delayed", options, timeout=120))
        assert loss <= sync * 1.02 + 1e-4, f"{options}: final loss {loss} vs synchronous {sync}"


def _w_rejects(rank, ws):
    import torch_ringdist.hooks as hooks

    out = []
    for bad in ({"staleness": 0}, {"correction": "median"}, {"hook": "local_sgd"}):
        try:
            hooks.make_state("delayed", **bad)
            out.append(f"{bad}: no error")
        except ValueError as exc:
            out.append(str(exc))
    return out


def test_delayed_rejects_bad_options(world_factory):
    msgs = world_factory(1).run(_w_rejects, timeout=60)[0]
    assert "staleness must be >= 1" in msgs[0] and "correction must be one of" in msgs[1] \
        and "cannot wrap" in msgs[2], msgs


def _busy(seconds):
    """Pure-Python work that holds the GIL: nothing else in this process runs Python."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _w_overlap(rank, ws):
    import torch_ringdist.hooks as hooks

    torch.manual_seed(0)
    model = nn.Linear(512, 512)  # 1 MB of gradients, one bucket
    ddp = DDP(model)
    state = hooks.register(ddp, "delayed", hook="allreduce")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    out = {}
    for step in range(4):
        x = torch.randn(8, 512, generator=torch.Generator().manual_seed(step + 10 * rank))
        opt.zero_grad()
        ddp(x).square().mean().backward()
        if step == 0:
            continue
        # backward returned without waiting for this step's exchange ...
        [(started, _)] = [entry for queue in state.pending.values() for entry in queue]
        # ... which completes while this thread computes, holding the GIL: the backend's
        # worker moves it on its own.
        _busy(1.0)
        out[f"step {step}"] = started.done()
        opt.step()
    return out


def test_delayed_exchange_completes_while_python_computes(world_factory):
    results = world_factory(2).run(_w_overlap, timeout=120)
    for rank, res in enumerate(results):
        assert res and all(res.values()), f"rank {rank}: exchange not done after 1 s of compute: {res}"
