"""The latency path: a synchronous op (async_op=False) that finds the group's worker idle runs
on the calling thread. Order, deadlines and abort must behave as on the worker."""
import os

import pytest

from harness.spawned import Spawned

pytestmark = pytest.mark.quick


def test_latency_path_order_deadline_and_abort(tmp_path):
    with Spawned("latency_path", 2, tmp_path) as w:
        got = w.results(120)
    for rank in (0, 1):
        r = got[rank]
        # The random sync/async mix equals the issue-order simulation on every rank ...
        assert r["order_ok"], r
        # ... with some ops on the latency path and some queued behind async work.
        assert 0 < r["inline"] < r["calls"] == 60, r
        # Back to back, all but the first (the worker may still be finishing the async work
        # before) take it.
        assert r["back_to_back"] >= 99 and r["small_ok"], r
        # 50 round trips: the ball ends at 100 (rank 0) / 99 (rank 1); the posts ran inline.
        assert r["ping_pong"] == [100.0 - rank] * 2, r
        assert r["p2p_calls"] == 100 and r["p2p_inline"] >= 90, r
        assert r["callback_ok"] and r["crossed_ok"] and r["future_ok"], r
    # Both callers pinned to one CPU: the rank waiting on each op sleeps without spinning for
    # its peer, which needs that CPU; pinned to two CPUs, no wait skips the spin.
    pinned = [got[rank]["shared_core_waits"] for rank in (0, 1)]
    if len(os.sched_getaffinity(0)) >= 2:
        assert pinned[0]["one_cpu"] + pinned[1]["one_cpu"] >= 100, pinned
        assert pinned[0]["two_cpus"] == pinned[1]["two_cpus"] == 0, pinned
        # A group created while each rank was pinned to its own core spins as well (it once
        # counted the pinned process's one CPU and never spun, so no wait skipped a spin).
        assert pinned[0]["own_core_group"] + pinned[1]["own_core_group"] >= 100, pinned
    r = got[0]
    # Deadline: the inline op's peer never comes; it fails after the group's 1 s timeout.
    assert "Timed out after 1000 ms" in r["deadline"]["error"], r
    assert 0.9 < r["deadline"]["seconds"] < 10, r
    # Abort from another thread ends the inline op's wait and returns.
    assert "aborted" in r["abort"]["error"] and "rank 0" in r["abort"]["error"], r
    assert 0.4 < r["abort"]["seconds"] < 5 and r["abort"]["abort_returned"], r
    # A failed op's future holds the error, whether asked for before the failure or after.
    for ask in ("early", "late"):
        assert "Timed out after 1000 ms" in (r[f"future_error_{ask}"] or ""), r
