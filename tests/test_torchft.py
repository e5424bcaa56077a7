"""torch_ringdist.torchft.ProcessGroupRingdist inside torchft (test-only dependency, pinned in
scripts/requirements-dev.txt): the wrapper's collectives against closed forms, its codec, abort
and errored, reconfiguration, and torchft's own DiLoCo over it with two replicas.

Replicas run as threads of this process, as torchft's own integration tests do."""
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.distributed_c10d import AllgatherOptions

pytest.importorskip("torchft")

import torch_ringdist  # noqa: E402,F401  (registers the backend)
from torch_ringdist.torchft import ProcessGroupRingdist  # noqa: E402

pytestmark = pytest.mark.quick

TIMEOUT = timedelta(seconds=30)


def _threads(fn, n=2):
    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=120) for f in [pool.submit(fn, r) for r in range(n)]]


@pytest.fixture
def store():
    return dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)


def test_collectives_codec_and_reconfigure(store):
    """Two ranks: exact SUM allreduce and allgather equal their closed forms; with codec="int8"
    a float32 SUM goes through the compressed allreduce (bitwise the same on both ranks, within
    the two-quantisation bound), other dtypes stay exact; a second configure replaces the group."""
    def rank_main(rank):
        out = {}
        pg = ProcessGroupRingdist(timeout=TIMEOUT, codec="int8")
        for generation in range(2):  # torchft re-configures on every quorum change
            pg.configure(f"localhost:{store.port}/gen{generation}", f"replica{rank}", rank, 2)
            x = torch.randn(5000, generator=torch.Generator().manual_seed(rank))
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            pg.allreduce([x], opts).wait()
            ints = torch.arange(6, dtype=torch.int64) * (rank + 1)
            pg.allreduce([ints], dist.ReduceOp.SUM).wait()
            gathered = [torch.empty(3) for _ in range(2)]
            pg.allgather([gathered], [torch.full((3,), float(rank))], AllgatherOptions()).wait()
            stats = pg.parent._get_backend(torch.device("cpu")).stats()
            out[generation] = (x, ints, gathered, stats)
        pg.shutdown()
        return out

    results = _threads(rank_main)
    xs = [torch.randn(5000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    exact = (xs[0].double() + xs[1].double())
    # Two quantisations, each at most half a step (max |block| / 254) per element.
    bound = (xs[0].abs().max() + xs[1].abs().max() + exact.abs().max()) / 254 * 1.02
    for generation in range(2):
        (x0, i0, g0, s0), (x1, i1, g1, s1) = results[0][generation], results[1][generation]
        assert torch.equal(x0, x1), "compressed result differs between ranks"
        assert (x0.double() - exact).abs().max() <= bound
        assert torch.equal(i0, torch.arange(6) * 3) and torch.equal(i1, i0)
        for gathered, stats in ((g0, s0), (g1, s1)):
            assert [g.tolist() for g in gathered] == [[0.0] * 3, [1.0] * 3]
            assert stats["compressed_allreduce/int8"]["calls"] == 1
            assert stats["allreduce"]["calls"] == 1


def test_abort_fails_the_pending_operation_and_errored_reports_it(store):
    """Rank 0 starts an allreduce rank 1 never joins, then aborts: the operation fails at once
    (not at its 30 s deadline) and errored() returns that failure."""
    pg = ProcessGroupRingdist(timeout=TIMEOUT)
    other = ProcessGroupRingdist(timeout=TIMEOUT)
    threads = [threading.Thread(target=g.configure, args=(f"localhost:{store.port}/a", f"r{r}", r, 2))
               for r, g in enumerate((pg, other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert pg.errored() is None
    work = pg.allreduce([torch.ones(10)], dist.ReduceOp.SUM)
    pg.abort()
    import time
    start = time.monotonic()
    with pytest.raises(Exception):
        work.wait()
    assert time.monotonic() - start < 10
    for _ in range(100):  # the recording callback runs on the backend's thread
        if pg.errored() is not None:
            break
        time.sleep(0.01)
    assert pg.errored() is not None
    other.abort()


def _model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _diloco_replica(replica_id, lighthouse, make_pg, steps, sync_every, start):
    from torchft import Manager
    from torchft.local_sgd import DiLoCo

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    model = _model()
    model.load_state_dict(start)  # the same start (init_sync=False), made outside the threads
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    pg = make_pg()
    manager = Manager(
        pg=pg, min_replica_size=2, replica_id=str(replica_id), store_addr="localhost",
        store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse, port=0,
        timeout=TIMEOUT, use_async_quorum=False, init_sync=False,
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), inner.load_state_dict(s["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()})
    g = torch.Generator().manual_seed(100 + replica_id)
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=sync_every):
            for _ in range(steps):
                x, y = torch.randn(16, 8, generator=g), torch.randint(4, (16,), generator=g)
                inner.zero_grad()
                F.cross_entropy(model(x), y).backward()
                inner.step()
        backend = pg.parent._get_backend(torch.device("cpu"))
        stats = backend.stats() if hasattr(backend, "stats") else None
        return (torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                manager.current_step(), pg.getBackendName(), stats)
    finally:
        manager.shutdown(wait=False)
        pg.shutdown()


def _diloco(make_pg):
    """torchft's DiLoCo, two replicas from one start, 12 inner steps, a round every 4."""
    from torchft._torchft import LighthouseServer

    torch.manual_seed(0)
    start = _model().state_dict()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    try:
        return _threads(lambda r: _diloco_replica(r, lighthouse.address(), make_pg, 12, 4, start))
    finally:
        lighthouse.shutdown()


@pytest.mark.parametrize("codec", [None, "int8"])
def test_torchft_diloco_over_ringdist(codec):
    """Every round commits, the pseudo-gradients travel on ringdist (compressed with a codec),
    both replicas end with the same model bit for bit, and without a codec it is the model
    torchft's own gloo group gives."""
    from torchft.process_group import ProcessGroupGloo

    (p0, step0, name, stats), (p1, step1, _, _) = _diloco(
        lambda: ProcessGroupRingdist(timeout=TIMEOUT, codec=codec))
    assert (step0, step1, name) == (3, 3, "torchft-ringdist")
    assert torch.equal(p0, p1), "replicas differ after the last round"
    key = "allreduce" if codec is None else f"compressed_allreduce/{codec}"
    assert stats[key]["calls"] >= 3 * 4, stats  # a round allreduces each of the 4 tensors
    gloo = _diloco(lambda: ProcessGroupGloo(timeout=TIMEOUT))[0][0]
    if codec is None:
        assert torch.equal(p0, gloo), (p0 - gloo).abs().max()
    else:
        assert (p0 - gloo).abs().max() < 0.05 * gloo.abs().max(), (p0 - gloo).abs().max()
