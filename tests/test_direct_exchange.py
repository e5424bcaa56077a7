"""The direct exchange and the route model (issue 44, item 3).

A group of one rank per host whose links are long takes the direct exchange: every rank talks to
every peer at once. Allreduce: a reduce-scatter and an allgather of one round each (2 one-way
trips where the ring takes 2(N-1)); allgather and reduce-scatter: one round (1 trip where the
ring takes N-1). The route model (csrc/collectives/route_model.h) decides from the group's agreed
round trip, so every rank picks alike.

Here: the allreduce model's predictions against its closed form (float64 here, from the
constants), the route each size takes with and without long links, and results of allreduce,
allgather and reduce-scatter against closed forms on 3-5 emulated hosts with a 100 ms round trip
(RINGDIST_TEST_ROUND_TRIP_US, test builds only), also when only one rank reports it. The bytes an
op sent tell its route: each direct exchange sends its 40-byte header to every peer, a ring to
its neighbour only. (Its speed on long links: benchmarks/wan_allreduce.py.)
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from harness.closed_forms import expected, require_test_build, values
from harness.spawned import RINGDIST_ONLY

pytestmark = [RINGDIST_ONLY]

# The model's constants (csrc/collectives/route_model.h, csrc/common/options.h).
LINK_BITS_PER_S = 10e9       # kRingFillBitsPerSecond
REDUCE_BYTES_PER_US = 1000   # kReduceBytesPerUs
DIRECT_GAIN = 0.8            # kDirectGain
MAX_DIRECT_RANKS = 16        # kMaxDirectRanks

SIZES = [1 << 10, 64 << 10, (64 << 10) + 4, 256 << 10, 1 << 20, 16 << 20, 256 << 20]


def _model(n, size, rtt_us):
    alpha = rtt_us / 2
    link = 2 * (n - 1) / n * size * 8 / (LINK_BITS_PER_S / 1e6)
    ring = 2 * (n - 1) * alpha + link
    direct = 2 * alpha + link + (n - 1) / n * size / REDUCE_BYTES_PER_US
    return ring, direct


def _expected_route(n, size, rtt_us, one_round_bytes):
    if size <= one_round_bytes:
        return "one round"
    ring, direct = _model(n, size, rtt_us)
    return "direct" if 3 <= n <= MAX_DIRECT_RANKS and direct <= DIRECT_GAIN * ring else "ring"


def _backend(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg._get_backend(torch.device("cpu"))


def _routes(rank, ws, report_us, setting="auto"):
    # 0: the round trip measured (loopback), not a reported one.
    os.environ["RINGDIST_TEST_ROUND_TRIP_US"] = str(report_us[rank] if report_us else 0)
    os.environ["RINGDIST_DIRECT_EXCHANGE"] = setting  # read when the group is made
    try:
        group = dist.new_group(backend="ringdist")
    finally:
        os.environ["RINGDIST_DIRECT_EXCHANGE"] = "auto"
    out = {size: _backend(group).allreduce_route(size) for size in SIZES}
    dist.destroy_process_group(group)
    return out


def _hosts(ws):
    """One emulated host per rank; no one-round path, so every count above zero takes the
    direct exchange or the ring (one world per size serves every test here)."""
    return {"RINGDIST_HOST_ID": ",".join(f"h{r}" for r in range(ws)),
            "RINGDIST_TRANSPORT": "tcp", "RINGDIST_SMALL_ALLREDUCE_BYTES": "0"}


@pytest.mark.quick
@pytest.mark.parametrize("ws", [3, 4, 5])
def test_route_model_predictions_and_choice(world_factory, ws):
    require_test_build()
    for routes in world_factory(ws, env=_hosts(ws)).run(_routes, [100_000] * ws):
        for size, got in routes.items():
            ring, direct = _model(ws, size, 100_000)
            assert int(got["round_trip_us"]) == 100_000 and int(got["hosts"]) == ws
            assert float(got["ring_us"]) == pytest.approx(ring, rel=1e-9), size
            assert float(got["direct_us"]) == pytest.approx(direct, rel=1e-9), size
            assert got["route"] == _expected_route(ws, size, 100_000, 0), (size, got)
        # At 100 ms the direct exchange wins from the smallest sizes to beyond 16 MiB.
        assert routes[256 << 10]["route"] == routes[16 << 20]["route"] == "direct"


def test_short_links_keep_the_ring(world_factory):
    # Loopback TCP between emulated hosts: tens of microseconds, the ring stays from 64 KiB on
    # (a LAN's figures unchanged).
    for routes in world_factory(4, env=_hosts(4)).run(_routes, None):
        assert int(routes[1 << 20]["round_trip_us"]) < 2000
        assert [routes[s]["route"] for s in SIZES[1:]] == ["ring"] * 6, routes


def test_the_setting_overrides_the_model(world_factory):
    world = world_factory(4, env=_hosts(4))
    for routes in world.run(_routes, [100_000] * 4, "0"):  # long links, never
        assert {r["route"] for r in routes.values()} == {"ring"}, routes
    for routes in world.run(_routes, None, "1"):  # loopback, always
        assert {r["route"] for r in routes.values()} == {"direct"}, routes


def test_one_host_and_two_ranks_never_take_it(world_factory):
    # Shared memory on one host, and two hosts (the ring is already two trips there).
    for routes in world_factory(3).run(_routes, [100_000] * 3):
        assert all(r["route"] != "direct" for r in routes.values()), routes
    for routes in world_factory(2, env=_hosts(2)).run(_routes, [100_000] * 2):
        assert all(r["route"] != "direct" for r in routes.values()), routes


DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]
# Elements: fewer than the ranks (empty chunks), odd, not divisible by any N, large.
COUNTS = [1, 3, 1001, 65_537, 300_007]


HEADER_BYTES = 40  # sizeof(OpHeader)


def _sent(group, name):
    return _backend(group).stats().get(name, {}).get("bytes_sent", 0)


def _allreduces(rank, ws, report_us, ops):
    """Every dtype x count x op; returns the mismatches and the routes taken."""
    os.environ["RINGDIST_TEST_ROUND_TRIP_US"] = str(report_us[rank])
    group = dist.new_group(backend="ringdist")
    backend = _backend(group)
    wrong, routes = [], set()
    for dtype in DTYPES:
        for count in COUNTS:
            routes.add(backend.allreduce_route(count * dtype.itemsize)["route"])
            for op in ops:
                if op == "avg" and not dtype.is_floating_point:
                    continue
                t = values(rank, count, dtype)
                before = _sent(group, "allreduce")
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), group=group)
                # 2(N-1)/N of the buffer (by chunks) and a header to each of N-1 peers.
                chunks = [count // ws + (r < count % ws) for r in range(ws)]
                share = (sum(chunks) - chunks[rank] + (ws - 1) * chunks[rank]) * dtype.itemsize
                if _sent(group, "allreduce") - before != share + (ws - 1) * HEADER_BYTES:
                    routes.add("sent like a ring")
                tol = 0.05 if dtype == torch.bfloat16 and op == "avg" else 0
                if not torch.allclose(t.to(torch.float64), expected(ws, count, op), rtol=tol,
                                      atol=0):
                    wrong.append((str(dtype), count, op))
    dist.destroy_process_group(group)
    return wrong, routes


def _gathers_and_scatters(rank, ws, report_us):
    """all_gather_into_tensor and reduce_scatter_tensor of every dtype x count against closed
    forms; returns the mismatches and, by (op, block bytes), what each call sent beyond its
    payload (headers)."""
    os.environ["RINGDIST_TEST_ROUND_TRIP_US"] = str(report_us[rank])
    group = dist.new_group(backend="ringdist")
    wrong, extra = [], {}
    for dtype in DTYPES:
        for count in COUNTS:
            mine = values(rank, count, dtype)
            out = torch.empty(ws * count, dtype=dtype)
            before = _sent(group, "allgather")
            dist.all_gather_into_tensor(out, mine, group=group)
            extra["allgather", count * dtype.itemsize] = (
                _sent(group, "allgather") - before - (ws - 1) * count * dtype.itemsize)
            want = torch.cat([values(r, count, dtype) for r in range(ws)])
            if not torch.equal(out, want):
                wrong.append(("allgather", str(dtype), count))
            full = torch.cat([values(rank + r, count, dtype) for r in range(ws)])
            got = torch.empty(count, dtype=dtype)
            before = _sent(group, "reduce_scatter")
            dist.reduce_scatter_tensor(got, full, group=group)
            extra["reduce_scatter", count * dtype.itemsize] = (
                _sent(group, "reduce_scatter") - before - (ws - 1) * count * dtype.itemsize)
            # Block b of rank r holds values(r + b): the sum over r of (i % 7 + r + b + 1).
            total = (ws * (torch.arange(count, dtype=torch.int64) % 7)
                     + sum(r + rank + 1 for r in range(ws)))
            if not torch.equal(got.to(torch.float64), total.to(torch.float64)):
                wrong.append(("reduce_scatter", str(dtype), count))
    dist.destroy_process_group(group)
    return wrong, extra


@pytest.mark.parametrize("ws, reporting", [(3, "all"), (4, "all"), (5, "all"), (4, "one")])
def test_allreduce_over_the_direct_exchange(world_factory, ws, reporting):
    require_test_build()
    # "one": only the last rank reports the long round trip; the group must still agree.
    report = [100_000] * ws if reporting == "all" else [0] * (ws - 1) + [100_000]
    ops = ["sum", "avg", "max"] if reporting == "all" else ["sum"]
    for wrong, routes in world_factory(ws, env=_hosts(ws)).run(_allreduces, report, ops,
                                                               timeout=180):
        assert wrong == []
        assert routes == {"direct"}, routes


@pytest.mark.parametrize("ws", [3, 4])
def test_allgather_and_reduce_scatter_over_the_direct_exchange(world_factory, ws):
    require_test_build()
    for wrong, extra in world_factory(ws, env=_hosts(ws)).run(_gathers_and_scatters,
                                                              [100_000] * ws, timeout=180):
        assert wrong == []
        # A header to every peer and nothing more: the direct exchange (at N=3 a ring's two
        # headers weigh the same; N=4 tells them apart).
        assert set(extra.values()) == {(ws - 1) * HEADER_BYTES}, extra


def test_allgather_and_reduce_scatter_keep_the_ring_on_short_links(world_factory):
    for wrong, extra in world_factory(4, env=_hosts(4)).run(_gathers_and_scatters, [0] * 4,
                                                            timeout=180):
        assert wrong == []
        # From 64 KiB a block takes the ring: headers to its two neighbours. (Smaller blocks
        # may take the direct exchange even on loopback: a few microseconds per trip.)
        large = {k: v for k, v in extra.items() if k[1] >= 64 << 10}
        assert large and set(large.values()) == {2 * HEADER_BYTES}, extra
