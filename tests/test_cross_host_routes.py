"""The routes across hosts and the route model (issue 44, item 3).

A group of one rank per host whose links are long leaves the ring where the route model predicts
another route faster. The direct exchange: every rank talks to every peer at once; allreduce is a
reduce-scatter and an allgather of one round each (2 one-way trips where the ring takes 2(N-1)),
allgather and reduce-scatter one round (1 trip where the ring takes N-1). Recursive
halving-doubling (allreduce): 2 log2(P) trips, P the largest power of two <= N, and 2 more when
N is not one. The pair exchange (allreduce, two hosts): each rank sends its whole buffer and
reduces the other's as it arrives, one trip. The route model (csrc/collectives/route_model.h) decides from the group's agreed
round trip, so every rank picks alike.

Here: the model's predictions against its closed forms (float64 here, from the constants), the
route each size takes with and without long links and by the setting, and results of
allreduce, allgather and reduce-scatter against closed forms on 3-8 emulated hosts with a 100 ms
round trip (RINGDIST_TEST_ROUND_TRIP_US, test builds only), also when only one rank reports it.
The bytes an op sent tell its route: each direct exchange sends its 40-byte header to every peer,
a ring to its neighbours only, halving-doubling to its partner of each halving round. (Their
speed on long links: benchmarks/wan_allreduce.py.)
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time

import pytest
import torch
import torch.distributed as dist

from harness.closed_forms import expected, require_test_build, values
from harness.spawned import RINGDIST_ONLY

pytestmark = [RINGDIST_ONLY]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The model's constants (csrc/collectives/route_model.h, csrc/common/options.h).
LINK_BITS_PER_S = 10e9       # kRingFillBitsPerSecond
REDUCE_BYTES_PER_US = 1000   # kReduceBytesPerUs
ROUTE_GAIN = 0.8             # kRouteGain
PAIR_GAIN = 0.95             # kPairGain
MAX_DIRECT_RANKS = 16        # kMaxDirectRanks
RATE_SAMPLE_BYTES = 1 << 20  # kRateSampleBytes
RATE_AGREE_EVERY = 32        # kRateAgreeEvery

SIZES = [1 << 10, 64 << 10, (64 << 10) + 4, 256 << 10, 1 << 20, 16 << 20, 256 << 20]


def _model(n, size, rtt_us, bits_per_s=LINK_BITS_PER_S):
    """Each allowed route's predicted allreduce time (us), in the order the model breaks ties."""
    alpha, beta = rtt_us / 2, 8 / (bits_per_s / 1e6)
    wire = 2 * (n - 1) / n * size * beta
    out = {"ring": 2 * (n - 1) * alpha + wire}
    if 2 <= n <= MAX_DIRECT_RANKS:
        out["direct"] = 2 * alpha + wire + (n - 1) / n * size / REDUCE_BYTES_PER_US
    if n >= 3:
        p = 2 ** int(math.log2(n))
        fold = 2 * alpha + 2 * size * beta if p < n else 0
        out["halving-doubling"] = 2 * math.log2(p) * alpha + 2 * (p - 1) / p * size * beta + fold
    if n == 2:  # each sends its buffer once and reduces the other's as it arrives
        out["pair"] = alpha + size * max(beta, 1 / REDUCE_BYTES_PER_US)
    return out


def _best(times):
    """The ring unless another route gains: by ROUTE_GAIN, the pair exchange by PAIR_GAIN."""
    others = [(t, i, r) for i, (r, t) in enumerate(times.items())
              if r != "ring" and t <= (PAIR_GAIN if r == "pair" else ROUTE_GAIN) * times["ring"]]
    return min(others)[2] if others else "ring"


def _expected_route(n, size, rtt_us, one_round_bytes):
    return "one round" if size <= one_round_bytes else _best(_model(n, size, rtt_us))


def _backend(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg._get_backend(torch.device("cpu"))


def _new_group(round_trip_us, **settings):
    """A ringdist group made with this rank reporting `round_trip_us` for its links (0: the
    measured one) and the given RINGDIST_* settings, which are read when a group is made; the
    environment is restored after."""
    env = {"RINGDIST_TEST_ROUND_TRIP_US": str(round_trip_us),
           **{f"RINGDIST_{k.upper()}": str(v) for k, v in settings.items()}}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dist.new_group(backend="ringdist")
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def _routes(rank, ws, report_us, setting="auto"):
    # 0: the round trip measured (loopback), not a reported one.
    group = _new_group(report_us[rank] if report_us else 0, route=setting)
    out = {size: _backend(group).allreduce_route(size) for size in SIZES}
    dist.destroy_process_group(group)
    return out


def _hosts(ws):
    """One emulated host per rank; no one-round path, so every count above zero takes a route
    across hosts (one world per size serves every test here)."""
    return {"RINGDIST_HOST_ID": ",".join(f"h{r}" for r in range(ws)),
            "RINGDIST_TRANSPORT": "tcp", "RINGDIST_SMALL_ALLREDUCE_BYTES": "0"}


@pytest.mark.quick
@pytest.mark.parametrize("ws", [3, 4, 5])
def test_route_model_predictions_and_choice(world_factory, ws):
    require_test_build()
    for routes in world_factory(ws, env=_hosts(ws)).run(_routes, [100_000] * ws):
        for size, got in routes.items():
            want = _model(ws, size, 100_000)
            assert int(got["round_trip_us"]) == 100_000 and int(got["hosts"]) == ws
            assert {k[:-3] for k in got if k.endswith("_us") and k != "round_trip_us"} == set(want)
            for route, us in want.items():
                assert float(got[route + "_us"]) == pytest.approx(us, rel=1e-9), (size, route)
            assert got["route"] == _expected_route(ws, size, 100_000, 0), (size, got)
        # At 100 ms the direct exchange wins from the smallest sizes to beyond 16 MiB.
        assert routes[256 << 10]["route"] == routes[16 << 20]["route"] == "direct"


@pytest.mark.quick
def test_route_model_for_many_hosts():
    """The model as the docs' predictions use it (torch_ringdist._C.allreduce_route_model): its
    times against the closed forms and its choice from 2 to 1,024 hosts, at a 100 ms and a 1 ms
    round trip and 1 and 10 Gbit/s links."""
    from torch_ringdist import _C

    seen = set()
    for n in [2, 3, 4, 8, 16, 17, 64, 100, 1024]:
        for rtt_us in [1_000, 100_000]:
            for bits in [1e9, 10e9]:
                for size in [4 << 10, 1 << 20, 64 << 20, 1 << 30]:
                    got = _C.allreduce_route_model(n, size, rtt_us, bits)
                    want = _model(n, size, rtt_us, bits)
                    assert {k[:-3] for k in got if k.endswith("_us")} == set(want), (n, got)
                    for route, us in want.items():
                        assert float(got[route + "_us"]) == pytest.approx(us, rel=1e-9)
                    assert got["route"] == _best(want), (n, rtt_us, bits, size, got)
                    seen.add((n > MAX_DIRECT_RANKS, got["route"]))
    # Beyond the direct exchange's limit, halving-doubling takes over from the ring where
    # trips dominate; within it the direct exchange does, and for two hosts the pair exchange.
    assert {(True, "halving-doubling"), (False, "direct"), (True, "ring"), (False, "pair")} <= seen, seen
    with pytest.raises(RuntimeError, match="ranks must be >= 1"):
        _C.allreduce_route_model(0, 1, 1, 1e9)


def test_short_links_keep_the_ring(world_factory):
    # Loopback TCP between emulated hosts: tens of microseconds, the ring stays from 64 KiB on
    # (a LAN's figures unchanged).
    for routes in world_factory(4, env=_hosts(4)).run(_routes, None):
        assert int(routes[1 << 20]["round_trip_us"]) < 2000
        assert [routes[s]["route"] for s in SIZES[1:]] == ["ring"] * 6, routes


def test_the_setting_overrides_the_model(world_factory):
    world = world_factory(4, env=_hosts(4))
    for routes in world.run(_routes, [100_000] * 4, "ring"):  # long links, never
        assert {r["route"] for r in routes.values()} == {"ring"}, routes
    for setting in ["direct", "halving-doubling"]:  # loopback, always
        for routes in world.run(_routes, None, setting):
            assert {r["route"] for r in routes.values()} == {setting}, routes


def test_one_host_keeps_the_ring_and_two_hosts_pair(world_factory):
    # Shared memory on one host keeps the ring, also when a route is forced. Two hosts: the
    # model never takes the direct exchange there (the ring's two trips and a reduction more),
    # nor halving-doubling (3 ranks or more); the pair exchange (one trip) where it predicts
    # it 5% faster: on long links up to where reducing on one core (slower than the assumed
    # 10 Gbit/s link) takes that gain back, on loopback only below the pair threshold (1 MiB).
    # Forced, the direct exchange runs at two hosts too, above the pair threshold.
    across = {"direct", "halving-doubling", "pair"}
    for routes in world_factory(3).run(_routes, [100_000] * 3, "halving-doubling"):
        assert not {r["route"] for r in routes.values()} & across, routes
    world = world_factory(2, env=_hosts(2))
    for setting in ["auto", "direct", "halving-doubling"]:
        for routes in world.run(_routes, [100_000] * 2, setting):
            above = {"auto": "ring", "direct": "direct", "halving-doubling": "ring"}[setting]
            want = ["pair" if size <= 1 << 20 or setting == "auto" else above for size in SIZES]
            want[-1] = above  # 256 MiB: reducing at 1 GB/s is slower than the link
            assert [routes[s]["route"] for s in SIZES] == want, (setting, routes)
    for routes in world.run(_routes, None, "auto"):  # loopback
        assert [routes[s]["route"] for s in SIZES] == ["pair"] * 5 + ["ring"] * 2, routes
    for routes in world.run(_routes, None, "pair"):  # forced
        assert {routes[s]["route"] for s in SIZES} == {"pair"}, routes


DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]
# Elements: fewer than the ranks (empty chunks), odd, not divisible by any N, large.
COUNTS = [1, 3, 1001, 65_537, 300_007]


HEADER_BYTES = 40  # sizeof(OpHeader)


def _sent(group, name):
    return _backend(group).stats().get(name, {}).get("bytes_sent", 0)


def _direct_sent(rank, ws, count, itemsize):
    """Bytes a rank's direct-exchange allreduce sends: 2(N-1)/N of the buffer (by chunks) and a
    header to each of N-1 peers."""
    chunks = [count // ws + (r < count % ws) for r in range(ws)]
    return (sum(chunks) - chunks[rank] + (ws - 1) * chunks[rank]) * itemsize + (ws - 1) * HEADER_BYTES


def _halving_sent(rank, ws, count, itemsize):
    """Bytes a rank's halving-doubling allreduce sends, from the ranges each round holds: P
    blocks as the ring cuts a buffer into P chunks; a header to each partner it receives from."""
    p = 2 ** int(math.log2(ws))
    folded = ws - p
    edge = [b * (count // p) + min(b, count % p) for b in range(p + 1)]
    size = lambda lo, hi: (edge[hi] - edge[lo]) * itemsize  # noqa: E731
    if rank < 2 * folded and rank % 2 == 0:
        return HEADER_BYTES + count * itemsize  # hands its buffer over
    v = rank // 2 if rank < 2 * folded else rank - folded
    sent = HEADER_BYTES + count * itemsize if rank < 2 * folded else 0  # header in, result out
    lo, hi = 0, p
    for d in [p >> k for k in range(1, int(math.log2(p)) + 1)]:  # halving: the other half out
        half = (hi - lo) // 2
        keep, give = (lo, lo + half) if v & d == 0 else (lo + half, lo)
        sent += HEADER_BYTES + size(give, give + half)
        lo, hi = keep, keep + half
    for d in [1 << k for k in range(int(math.log2(p)))]:  # doubling: what it holds out
        sent += size(lo, hi)
        width = hi - lo
        lo = min(lo, hi if v & d == 0 else lo - width)
        hi = lo + 2 * width
    return sent


def _pair_sent(rank, ws, count, itemsize):
    """The pair exchange: the whole buffer and a header, to the one peer."""
    return count * itemsize + HEADER_BYTES


SENT = {"direct": _direct_sent, "halving-doubling": _halving_sent, "pair": _pair_sent}


def _allreduces(rank, ws, report_us, ops, setting="auto"):
    """Every dtype x count x op; returns the mismatches and the routes taken (and "sent
    unlike <route>" where the bytes sent did not match it)."""
    group = _new_group(report_us[rank], route=setting)
    backend = _backend(group)
    wrong, routes = [], set()
    for dtype in DTYPES:
        for count in COUNTS:
            route = backend.allreduce_route(count * dtype.itemsize)["route"]
            routes.add(route)
            for op in ops:
                if op == "avg" and not dtype.is_floating_point:
                    continue
                t = values(rank, count, dtype)
                before = _sent(group, "allreduce")
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), group=group)
                sent = _sent(group, "allreduce") - before
                if route in SENT and sent != SENT[route](rank, ws, count, dtype.itemsize):
                    routes.add(f"sent unlike {route}")
                tol = 0.05 if dtype == torch.bfloat16 and op == "avg" else 0
                if not torch.allclose(t.to(torch.float64), expected(ws, count, op), rtol=tol,
                                      atol=0):
                    wrong.append((str(dtype), count, op))
    dist.destroy_process_group(group)
    return wrong, routes


def _gathers_and_scatters(rank, ws, report_us, setting="auto"):
    """all_gather_into_tensor and reduce_scatter_tensor of every dtype x count against closed
    forms; returns the mismatches and, by (op, block bytes), what each call sent beyond its
    payload (headers)."""
    group = _new_group(report_us[rank], route=setting)
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


def test_allreduce_over_the_direct_exchange_at_two_hosts(world_factory):
    """RINGDIST_ROUTE=direct at two hosts: the direct exchange's two rounds at every size (no
    pair threshold), its bytes, and the closed forms."""
    require_test_build()
    env = dict(_hosts(2), RINGDIST_PAIR_ALLREDUCE_BYTES="0")
    for wrong, routes in world_factory(2, env=env).run(_allreduces, [100_000] * 2,
                                                       ["sum", "avg", "max"], "direct",
                                                       timeout=180):
        assert wrong == []
        assert routes == {"direct"}, routes


def test_allreduce_over_the_pair_exchange(world_factory):
    """Two hosts on long links: the model's pair exchange at every size (no pair threshold)."""
    require_test_build()
    env = dict(_hosts(2), RINGDIST_PAIR_ALLREDUCE_BYTES="0")
    for wrong, routes in world_factory(2, env=env).run(_allreduces, [100_000] * 2,
                                                       ["sum", "avg", "max"], timeout=180):
        assert wrong == []
        assert routes == {"pair"}, routes


def _lanes(rank, ws, report_us, lanes, buffer_bytes="32M"):
    """Each peer's number of TCP connections (lanes) in a new group, and the stream window the
    group agreed on (the same on every TCP link)."""
    group = _new_group(report_us[rank], tcp_lanes=lanes, tcp_buffer_bytes=buffer_bytes)
    links = _backend(group).links
    dist.destroy_process_group(group)
    windows = {link["stream_window"] for link in links if "stream_window" in link}
    return [link.get("lanes") for link in links], windows


def test_long_links_get_lanes(world_factory):
    """The peer on the other host of a two-host group gets as many connections (at most
    TcpOptions::lanes) as its streams' windows need to cover kDefaultTcpBufferBytes (32 MiB) per
    100 ms of the group's round trip, where that round trip is at least 1 ms (kLanesRoundTripUs);
    one on shorter links, when the setting says 1, or in a group of three hosts (only the pair
    exchange sends on lanes). A buffer of 1 MiB (set with CAP_NET_ADMIN, else the kernel's
    autotuning up to a few MiB) needs all 4 at 100 ms; 64 MiB set needs one, and two at 300 ms."""
    world = world_factory(2, env=_hosts(2))
    # (reported round trip, RINGDIST_TCP_BUFFER_BYTES, lanes where the window is 64 MiB: set
    # with CAP_NET_ADMIN). 1 MiB is below what autotuning may reach, so never set: the window is
    # autotuning's maximum (4-6 MiB by default: all 4 lanes at 100 ms).
    for report_us, buffer, when_set in [(100_000, "1M", None), (100_000, "64M", "1"),
                                        (300_000, "64M", "2")]:
        for rank, (got, windows) in enumerate(world.run(_lanes, [report_us] * 2, 4, buffer)):
            assert got[rank] is None and len(windows) == 1, (got, windows)
            window = int(windows.pop())
            want = min(4, max(1, math.ceil(32 * 2**20 * report_us / 100_000 / window)))
            assert got[1 - rank] == str(want), (report_us, buffer, window, got)
            if window == 64 << 20:
                assert got[1 - rank] == when_set, (report_us, buffer, got)
            if buffer == "1M" and window <= 8 << 20:
                assert got[1 - rank] == "4", (window, got)
    for report, lanes in [([0, 0], 4), ([100_000] * 2, 1)]:
        for rank, (got, _) in enumerate(world.run(_lanes, report, lanes, "1M")):
            assert got[1 - rank] == "1", (report, lanes, got)
    for rank, (got, _) in enumerate(world_factory(3, env=_hosts(3)).run(_lanes, [100_000] * 3,
                                                                         4, "1M")):
        assert [g for r, g in enumerate(got) if r != rank] == ["1", "1"], got


def test_two_level_allreduce_pairs_two_hosts(world_factory):
    """Two hosts of two ranks each on long links: the cross stage is a pair exchange."""
    require_test_build()
    env = dict(_hosts(4), RINGDIST_HOST_ID="h0,h0,h1,h1")
    for wrong, routes in world_factory(4, env=env).run(
            _allreduces, [100_000] * 4, ["sum", "avg", "max"], timeout=240):
        assert wrong == []
        assert routes == {"two-level, pair across hosts"}, routes


# 3, 5, 6: N folds onto P = 2, 4, 4 ranks (1, 1, 2 pairs); 8: a power of two.
@pytest.mark.parametrize("ws", [3, 5, 6, 8])
def test_allreduce_by_halving_doubling(world_factory, ws):
    require_test_build()
    for wrong, routes in world_factory(ws, env=_hosts(ws)).run(
            _allreduces, [0] * ws, ["sum", "avg", "max"], "halving-doubling", timeout=240):
        assert wrong == []
        assert routes == {"halving-doubling"}, routes


# Three emulated hosts of two ranks each: the two-level allreduce, whose cross stage (each
# rank's chunk among the ranks at its position on every host) takes the route a group of one
# rank per host would.
@pytest.mark.parametrize("setting, reported, route", [
    ("auto", 100_000, "two-level, direct across hosts"),
    ("halving-doubling", 0, "two-level, halving-doubling across hosts"),
    ("auto", 0, "two-level")])
def test_two_level_allreduce_crosses_hosts_by_the_model(world_factory, setting, reported, route):
    require_test_build()
    env = dict(_hosts(6), RINGDIST_HOST_ID="h0,h0,h1,h1,h2,h2")
    for wrong, routes in world_factory(6, env=env).run(
            _allreduces, [reported] * 6, ["sum", "avg", "max"], setting, timeout=240):
        assert wrong == []
        # Counts below the hosts' chunk leave some positions' chunks empty ("two-level"); on
        # loopback the smaller chunks may cross directly (trips of microseconds).
        allowed = {route, "two-level"} | ({"two-level, direct across hosts"} if reported == 0
                                          and setting == "auto" else set())
        assert route in routes and routes <= allowed, routes


@pytest.mark.parametrize("ws, setting", [(3, "auto"), (4, "auto"), (2, "direct")])
def test_allgather_and_reduce_scatter_over_the_direct_exchange(world_factory, ws, setting):
    require_test_build()
    for wrong, extra in world_factory(ws, env=_hosts(ws)).run(_gathers_and_scatters,
                                                              [100_000] * ws, setting,
                                                              timeout=180):
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


def _rate_rounds(rank, ws):
    """2 * kRateAgreeEvery sampled allreduces (1 MiB, ring on loopback) and one below the sample
    size; per call its time here, and the agreed rate before each round."""
    backend = _backend()
    rtt_us = int(backend.allreduce_route(RATE_SAMPLE_BYTES)["round_trip_us"])
    agreed, seconds = [], []
    small = torch.ones(RATE_SAMPLE_BYTES // 4 - 1)
    for _ in range(2 * RATE_AGREE_EVERY):  # not sampled: they never agree
        dist.all_reduce(small)
    agreed.append(float(backend.allreduce_route(RATE_SAMPLE_BYTES)["link_bits_per_s"]))
    t = torch.empty(RATE_SAMPLE_BYTES // 4)
    wrong = 0
    for call in range(2 * RATE_AGREE_EVERY):
        t.fill_(rank + 1)
        start = time.perf_counter()
        dist.all_reduce(t)
        seconds.append(time.perf_counter() - start)
        wrong += int((t != ws * (ws + 1) / 2).sum())
        agreed.append(float(backend.allreduce_route(RATE_SAMPLE_BYTES)["link_bits_per_s"]))
    return {"rtt_us": rtt_us, "agreed": agreed, "seconds": seconds, "wrong": wrong}


def test_the_group_agrees_on_the_rate_its_allreduces_measure(world_factory):
    """Every kRateAgreeEvery-th sampled allreduce agrees first: the slowest rank's fastest
    sample. Each rank's sample is the rate at which the model's ring time equals what the call
    took inside the engine, at most what it took here, so the agreed rate is at least the
    slowest rank's fastest rate computed from the times here."""
    ws = 3
    results = world_factory(ws, env=_hosts(ws)).run(_rate_rounds)
    assert [r["wrong"] for r in results] == [0] * ws
    agreed = [r["agreed"] for r in results]
    assert all(a == agreed[0] for a in agreed), agreed  # every rank, after every call
    rounds = agreed[0]
    # None before the first 32 sampled calls (the 64 smaller ones do not count); set by the
    # 32nd's agreement, and again by the 64th's.
    assert rounds[:RATE_AGREE_EVERY] == [0.0] * RATE_AGREE_EVERY, rounds
    assert rounds[RATE_AGREE_EVERY] > 0 and rounds[2 * RATE_AGREE_EVERY] > 0, rounds
    wire_bits = 2 * (ws - 1) / ws * RATE_SAMPLE_BYTES * 8

    def rate(seconds, rtt_us):  # the ring's model time solved for the rate, bits/s
        return wire_bits / (seconds - 2 * (ws - 1) * rtt_us / 2 / 1e6)

    rtt = max(r["rtt_us"] for r in results)
    first = min(max(rate(s, rtt) for s in r["seconds"][:RATE_AGREE_EVERY - 1]) for r in results)
    assert rounds[RATE_AGREE_EVERY] >= first, (rounds[RATE_AGREE_EVERY], first)


def _broadcasts(rank, ws, report_us, setting="auto"):
    """Broadcasts of every dtype x count from every root against the root's values; returns
    the mismatches and the roots and counts whose bytes sent differ from the direct broadcast's
    closed form: the header to every peer; the root sends each rank its block and then its own
    block to every rank, a rank its block to every rank but the root and one byte to the
    root."""
    group = _new_group(report_us[rank], route=setting)
    wrong, unlike = [], []
    for dtype in DTYPES:
        for count in COUNTS:
            blocks = [(count // ws + (r < count % ws)) * dtype.itemsize for r in range(ws)]
            for root in range(ws):
                t = values(root, count, dtype) if rank == root else torch.zeros(count, dtype=dtype)
                before = _sent(group, "broadcast")
                dist.broadcast(t, src=root, group=group)
                sent = _sent(group, "broadcast") - before
                want = (ws - 1) * HEADER_BYTES + (
                    sum(blocks) + (ws - 2) * blocks[root] if rank == root
                    else (ws - 2) * blocks[rank] + 1)
                if sent != want:
                    unlike.append((str(dtype), count, root, sent, want, count * dtype.itemsize))
                if not torch.equal(t, values(root, count, dtype)):
                    wrong.append((str(dtype), count, root))
    dist.destroy_process_group(group)
    return wrong, unlike


@pytest.mark.parametrize("ws, setting", [(3, "auto"), (4, "auto"), (2, "direct")])
def test_broadcast_over_the_direct_exchange(world_factory, ws, setting):
    require_test_build()
    for wrong, unlike in world_factory(ws, env=_hosts(ws)).run(_broadcasts, [100_000] * ws,
                                                               setting, timeout=180):
        assert wrong == [] and unlike == [], (wrong, unlike[:5])


def test_broadcast_keeps_the_chain_on_short_links(world_factory):
    for wrong, unlike in world_factory(4, env=_hosts(4)).run(_broadcasts, [0] * 4, timeout=180):
        assert wrong == []
        # Loopback: from 64 KiB the chain (headers to two neighbours), not the direct
        # broadcast's bytes. (Smaller ones may take the direct broadcast even on loopback.)
        large = sum(4 for d in DTYPES for c in COUNTS if c * d.itemsize >= 64 << 10)
        assert large and len([u for u in unlike if u[5] >= 64 << 10]) == large, unlike[:5]


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/net/tun")
    or not all(shutil.which(t) for t in ("ip", "unshare", "chrt", "cc")),
    reason="needs root, /dev/net/tun, ip, unshare, chrt and cc (network namespaces, TUN)")


def _when_ready(wan, signals, links):
    """A `during` for Wan.run: gives the hosts `links` once rank 0 created `ready` in the
    signals folder, then creates `go` (tests/scenarios/wan_signals.py)."""
    def change():
        if os.path.exists(signals / "ready") and not os.path.exists(signals / "go"):
            wan.set_links(links)
            (signals / "go").touch()
    return change


def _agreed_rates(wan, *args, during=None):
    """Runs tests/scenarios/wan_link_rate.py on every host (args after the store's port); each
    rank's JSON line, after checking every rank ran and agreed the same rates without a wrong
    result."""
    port = 29600 + os.getpid() % 1000
    argv = [sys.executable, os.path.join(REPO, "tests", "scenarios", "wan_link_rate.py"),
            str(port), *map(str, args)]
    logs = [os.path.join(wan.workdir, f"rate{i}.log") for i in range(wan.n)]
    codes = wan.run(argv, logs=logs, timeout=150, during=during)
    out = [open(p).read() for p in logs]
    assert codes == [0] * wan.n, out
    got = [json.loads(o.strip().splitlines()[-1]) for o in out]
    assert all(g["wrong"] == 0 for g in got), got
    assert all(g["agreed"] == got[0]["agreed"] for g in got), got
    return got


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_the_agreed_rate_is_the_emulated_links():
    """Three emulated hosts on 100 Mbit/s links with a 10 ms round trip: after a round of
    samples the group agrees on about the links' rate (what a 1 MiB ring allreduce delivers
    end to end: 75-110% of it, the ring overlapping some of the trips the model adds), and 1 MiB,
    which took the direct exchange while the model took the links as 10 Gbit/s, keeps the ring
    from then on (its two trips fewer save under 20% at 100 Mbit/s)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks", "wan"))
    import emulator

    rate = 100e6
    with emulator.Wan(3, emulator.HostLink(0.005, rate), timeout=180) as wan:
        got = _agreed_rates(wan)
    agreed = got[0]["agreed"]
    assert agreed[0] == 0, agreed
    assert 0.75 * rate <= agreed[1] <= 1.1 * rate and 0.75 * rate <= agreed[2] <= 1.1 * rate, agreed
    assert all(g["routes"] == ["direct", "ring", "ring"] for g in got), got
    rtt_us = got[0]["round_trips_us"][0]
    assert _best(_model(3, 1 << 20, rtt_us)) == "direct", rtt_us
    assert _best(_model(3, 1 << 20, rtt_us, agreed[1])) == "ring", (rtt_us, agreed)


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_a_link_that_slows_to_a_tenth_is_agreed_and_routed_by(tmp_path):
    """Three emulated hosts at 200 Mbit/s and a 10 ms round trip; the delay line drops every
    link to 20 Mbit/s just before the call that agrees on the first round of samples. That round
    agrees on about 200 Mbit/s, the next, timed wholly on the slow links, on about 20 Mbit/s;
    every result stays right, nothing hangs, and 1 MiB takes the model's route for each agreed
    rate."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks", "wan"))
    import emulator

    fast, slow = 200e6, 20e6
    with emulator.Wan(3, emulator.HostLink(0.005, fast), timeout=180) as wan:
        got = _agreed_rates(wan, tmp_path, during=_when_ready(wan, tmp_path,
                                                              emulator.HostLink(0.005, slow)))
    agreed = got[0]["agreed"]
    assert agreed[0] == 0 and 0.75 * fast <= agreed[1] <= 1.1 * fast, agreed
    assert 0.75 * slow <= agreed[2] <= 1.1 * slow, agreed
    expected = [_best(_model(3, 1 << 20, rtt_us, *([rate] if rate else [])))
                for rate, rtt_us in zip(agreed, got[0]["round_trips_us"])]
    assert all(g["routes"] == expected for g in got), (got, expected)


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_a_round_trip_that_grows_is_agreed_and_routed_by(tmp_path):
    """Three emulated hosts at 200 Mbit/s and a 10 ms round trip, each host's TCP min_rtt window
    (net.ipv4.tcp_min_rtt_wlen) cut to 1 s; the delay line lengthens every link to a 100 ms
    round trip just before the call that agrees on the first round of samples. That agreement
    still sees about 10 ms (the window holds the short samples; up to 30 ms is allowed, as a busy
    2-core runner delays some acknowledgements by a few ms and a 1 s window holds few samples),
    the next, a few seconds later, about 100 ms; every result stays right, nothing hangs, and 1 MiB takes the model's route for
    each agreed link."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks", "wan"))
    import emulator

    rate = 200e6
    with emulator.Wan(3, emulator.HostLink(0.005, rate), timeout=180) as wan:
        wan.sysctl("net.ipv4.tcp_min_rtt_wlen=1")
        got = _agreed_rates(wan, tmp_path, during=_when_ready(wan, tmp_path,
                                                              emulator.HostLink(0.05, rate)))
    trips = got[0]["round_trips_us"]
    assert all(g["round_trips_us"] == trips for g in got), got
    assert 9_500 <= trips[0] <= 30_000 and 9_500 <= trips[1] <= 30_000, trips
    assert 99_000 <= trips[2] <= 110_000, trips
    expected = [_best(_model(3, 1 << 20, rtt_us, *([r] if r else [])))
                for r, rtt_us in zip(got[0]["agreed"], trips)]
    assert all(g["routes"] == expected for g in got), (got, expected)
