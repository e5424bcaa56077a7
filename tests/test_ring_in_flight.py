"""Data in flight from the measured round trip (issue 44, item 2).

The ring allreduce forwards a segment a number of segments after its arrival (the lag of its
stream order, csrc/collectives/ring.h forwardLag): two on one host or a LAN, more on long links
so that the sends queued ahead of a forward fill the link over a round trip. The round trip is
the longest any rank of the group measured on its TCP links at connect (TCP_INFO min_rtt), agreed
through the ranks' records, so both ends of every link order their transfers alike.

Here: the lag's closed form; the round trip each TCP link reports; and allreduce results against
closed forms when the group runs with a long round trip (RINGDIST_TEST_ROUND_TRIP_US, test builds
only), also when only one rank reports it (the group must agree, or the two ends of a link would
order the same stream differently and the results go wrong or the op hangs).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist

from harness.closed_forms import expected, require_test_build, values
from harness.spawned import RINGDIST_ONLY

pytestmark = [RINGDIST_ONLY]

FILL_BITS_PER_S = 10e9  # kRingFillBitsPerSecond (csrc/common/options.h)


@pytest.mark.quick
@pytest.mark.parametrize("rtt_us", [0, 1, 40, 200, 1000, 10_000, 100_000, 2_000_000])
@pytest.mark.parametrize("segment", [1, 4096, 32 << 10, 256 << 10, 4 << 20])
def test_forward_lag_fills_the_round_trip(rtt_us, segment):
    in_flight = FILL_BITS_PER_S / 8 * rtt_us / 1e6
    assert require_test_build().ring_forward_lag(rtt_us, segment) == max(2, math.ceil(in_flight / segment))


@pytest.mark.quick
def test_one_host_and_lan_keep_the_cache_order():
    # Round trips of one host and of a LAN (up to 0.4 ms) keep 256 KiB segments two apart.
    for rtt_us in (0, 20, 100, 400):
        assert require_test_build().ring_forward_lag(rtt_us, 256 << 10) == 2


def _link_round_trips(rank, ws):
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return [int(link["round_trip_us"]) for peer, link in enumerate(backend.links) if peer != rank]


@pytest.mark.quick
def test_tcp_links_report_their_round_trip(world_factory):
    for trips in world_factory(3, env={"RINGDIST_TRANSPORT": "tcp"}).run(_link_round_trips):
        assert len(trips) == 2
        # Loopback: measured, and far below a millisecond.
        assert all(0 < t < 100_000 for t in trips), trips


DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]
# Elements: 1, odd, not divisible by any N, a few segments, many segments (4 KiB segments).
COUNTS = [1, 3, 1001, 4099, 65_537, 300_007]


def _allreduces(rank, ws, report_us, ops):
    """Allreduce every dtype x count x op in a group made with this rank reporting a round trip
    of report_us[rank]; returns the mismatches."""
    os.environ["RINGDIST_TEST_ROUND_TRIP_US"] = str(report_us[rank])
    group = dist.new_group(backend="ringdist")
    wrong = []
    for dtype in DTYPES:
        for count in COUNTS:
            for op in ops:
                if op == "avg" and not dtype.is_floating_point:
                    continue
                t = values(rank, count, dtype)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), group=group)
                want = expected(ws, count, op)
                tol = 0.05 if dtype == torch.bfloat16 and op == "avg" else 0
                if not torch.allclose(t.to(torch.float64), want, rtol=tol, atol=0):
                    wrong.append((str(dtype), count, op))
    dist.destroy_process_group(group)
    return wrong


# Small segments so every count but the smallest runs many pipelined segments; no one-round
# path, so the ring runs from one element on.
RING_ENV = {"RINGDIST_TRANSPORT": "tcp", "RINGDIST_SEGMENT_BYTES": "4096",
            "RINGDIST_SMALL_ALLREDUCE_BYTES": "0", "RINGDIST_PAIR_ALLREDUCE_BYTES": "0"}


@pytest.mark.parametrize("ws", [2, 3, 4])
@pytest.mark.parametrize("reporting", ["all", "one"])
def test_allreduce_sized_for_a_long_round_trip(world_factory, ws, reporting):
    require_test_build()
    # 100 ms: every chunk's segments lie within one lag, so the ring runs step by step.
    report = [100_000] * ws if reporting == "all" else [0] * (ws - 1) + [100_000]
    ops = ["sum", "avg"] if reporting == "all" else ["sum"]
    for wrong in world_factory(ws, env=RING_ENV).run(_allreduces, report, ops, timeout=180):
        assert wrong == []


@pytest.mark.parametrize("rtt_us", [20, 300])
def test_allreduce_with_a_lag_inside_a_chunk(world_factory, rtt_us):
    # 20 us and 0.3 ms at 4 KiB segments: lags of 7 and 92 segments, shorter than the chunks
    # of the largest count (98 to 196 segments), so steps interleave with that lag.
    require_test_build()
    for wrong in world_factory(3, env=RING_ENV).run(_allreduces, [rtt_us] * 3, ["sum"],
                                                      timeout=180):
        assert wrong == []
