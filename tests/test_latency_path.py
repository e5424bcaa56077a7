"""The latency path: a synchronous op (async_op=False) that finds the group's worker idle runs
on the calling thread. Order, deadlines and abort must behave as on the worker."""
import datetime
import os
import threading
import time

import pytest

from harness.spawned import Spawned
from harness.spawned_rank import init_group

pytestmark = pytest.mark.quick


def latency_path(rank, ws, store, dist, torch):
    """Synchronous ops take the latency path (run on the calling thread) when the worker is
    idle. Checked here, at 2 ranks:
    - order: a seeded random mix of sync and async allreduce/broadcast on shared tensors of
      8 B to 4 MiB equals the mix applied in issue order (a float64 simulation of every
      rank), and some ops ran inline while others queued behind async work;
    - 4 MiB isends/irecvs crossing, 40 rounds: posts queue behind transfers in flight;
    - callers pinned to one CPU wait without spinning (shared_core_waits), on two CPUs spin;
      a group made while each rank was pinned to its own core spins too;
    - deadline: an inline allreduce whose peer never comes fails after the group's timeout;
    - abort: an inline allreduce whose peer never comes fails soon after another thread
      aborts the group, and the abort returns."""
    import random

    import torch_ringdist

    init_group(rank, ws, store, dist)
    rng = random.Random(7)
    sizes = [1, 256, 16384, 1 << 19]  # float64 elements: 8 B .. 4 MiB
    state = [[float((r + 1) * (i + 2)) for i in range(len(sizes))] for r in range(ws)]
    tensors = [torch.full((n,), state[rank][i], dtype=torch.float64) for i, n in enumerate(sizes)]
    torch_ringdist.reset_stats()
    pending = []
    for _ in range(60):
        i = rng.randrange(len(sizes))
        sync = rng.random() < 0.6
        if rng.random() < 0.5:
            work = dist.all_reduce(tensors[i], async_op=not sync)
            total = sum(state[r][i] for r in range(ws))
            for r in range(ws):
                state[r][i] = total
        else:
            root = rng.randrange(ws)
            work = dist.broadcast(tensors[i], src=root, async_op=not sync)
            for r in range(ws):
                state[r][i] = state[root][i]
        if work is not None:
            pending.append(work)
    for work in pending:
        work.wait()
    order_ok = all(bool(torch.all(t == state[rank][i])) for i, t in enumerate(tensors))
    stats = torch_ringdist.stats()
    calls = sum(stats[k]["calls"] for k in ("allreduce", "broadcast"))
    inline = sum(stats[k]["inline_calls"] for k in ("allreduce", "broadcast"))
    # 8 B sync allreduce, back to back: every one takes the latency path
    torch_ringdist.reset_stats()
    small_ok = True
    for k in range(100):
        small = torch.full((2,), float(rank + k))
        dist.all_reduce(small)
        small_ok &= bool(torch.all(small == sum(r + k for r in range(ws))))
    back_to_back = torch_ringdist.stats()["allreduce"]["inline_calls"]
    # Ping-pong: each rank adds one and sends it back; sends and receives post inline.
    torch_ringdist.reset_stats()
    ball = torch.zeros(2)
    for _ in range(50):
        if rank == 0:
            dist.send(ball + 1, dst=1)
            dist.recv(ball, src=1)
        else:
            dist.recv(ball, src=0)
            dist.send(ball + 1, dst=0)
    p2p = torch_ringdist.stats()["send/recv"]
    # Posts that find the worker still moving large transfers an earlier post left queue
    # behind them (a lost wake-up here once hung both ranks in irecv).
    crossed_ok = True
    for k in range(40):
        a, b = torch.full((1 << 20,), rank + k + 0.5), torch.full((1 << 20,), rank + k + 0.25)
        ra, rb = torch.empty_like(a), torch.empty_like(b)
        sends = [dist.isend(a, dst=1 - rank, tag=11), dist.isend(b, dst=1 - rank, tag=12)]
        recvs = [dist.irecv(rb, src=1 - rank, tag=12), dist.irecv(ra, src=1 - rank, tag=11)]
        for w in recvs + sends:
            w.wait()
        peer = 1 - rank + k
        crossed_ok &= bool(torch.all(ra == peer + 0.5) and torch.all(rb == peer + 0.25))
    # A synchronous op issued by a completion callback (on the worker, or inline) runs there.
    # Each rank in turn calls first while the other waits 0.1 s, so the early rank's op is
    # still running when its callback is attached: that callback runs on the worker. (With
    # both ranks at once, a starved caller thread could attach it after the op completed.)
    callback_ok = True
    for early in range(ws):
        big, inner, ran_on = torch.ones(1 << 20), torch.ones(2), []

        def callback(fut):
            ran_on.append(threading.get_ident())
            dist.all_reduce(inner)
            return fut.value()

        if rank != early:
            time.sleep(0.1)
        dist.all_reduce(big, async_op=True).get_future().then(callback).wait()
        callback_ok &= bool(torch.all(big == ws)) and bool(torch.all(inner == ws))
        if rank == early:
            callback_ok &= ran_on != [threading.get_ident()]

    # Ranks the scheduler put on one CPU: a rank does not spin for a peer that last ran or
    # waited on its own CPU. Both callers pinned to one CPU, then each to its own.
    cores = sorted(os.sched_getaffinity(0))
    shared_core_waits = None
    if len(cores) >= 2:
        shared_core_waits = {}
        for name, cpus in (("one_cpu", [cores[0]] * 2), ("two_cpus", cores[:2])):
            os.sched_setaffinity(0, {cpus[rank]})  # this thread only: the group spins as before
            dist.barrier()  # both published their CPU
            torch_ringdist.reset_stats()
            pinned = torch.ones(2)
            for _ in range(200):
                dist.all_reduce(pinned)
            shared_core_waits[name] = torch_ringdist.stats()["allreduce"]["shared_core_waits"]
        # A group made while each rank is pinned to a core of its own (taskset, numactl, a
        # batch scheduler's binding) has a core per rank although each process sees one: it
        # spins too, so with both callers then on one CPU it skips the spin as above.
        os.sched_setaffinity(0, {cores[rank]})  # its worker thread inherits this
        own_core_group = dist.new_group()
        dist.barrier(group=own_core_group)
        os.sched_setaffinity(0, {cores[0]})
        dist.barrier(group=own_core_group)
        torch_ringdist.reset_stats(own_core_group)
        for _ in range(200):
            dist.all_reduce(pinned, group=own_core_group)
        shared_core_waits["own_core_group"] = \
            torch_ringdist.stats(own_core_group)["allreduce"]["shared_core_waits"]
        os.sched_setaffinity(0, cores)

    # The Work's future, asked for before the op completed and after (a host op makes it
    # only when asked): the same value, callbacks run, done() agrees.
    future_ok = True
    for early_ask in (True, False):
        big = torch.full((1 << 20,), float(rank + 1))
        work = dist.all_reduce(big, async_op=True)
        fut = work.get_future() if early_ask else None
        work.wait()
        if fut is None:
            fut = work.get_future()
        chained = fut.then(lambda f: f.value()[0].sum().item())
        future_ok &= fut.done() and bool(torch.all(fut.wait()[0] == 3.0))
        future_ok &= chained.wait() == 3.0 * (1 << 20) and work.get_future().done()
    # A future asked for before the op ended is done once wait() returned (as gloo's): the
    # future completes before the waiter wakes.
    not_done = 0
    for _ in range(300):
        work = dist.all_reduce(torch.ones(2), async_op=True)
        fut = work.get_future()
        work.wait()
        not_done += not fut.done()
    future_ok &= not_done == 0

    out = {"order_ok": order_ok, "shared_core_waits": shared_core_waits, "calls": calls,
           "inline": inline, "back_to_back": back_to_back,
           "small_ok": small_ok, "ping_pong": ball.tolist(), "p2p_calls": p2p["calls"],
           "p2p_inline": p2p["inline_calls"], "callback_ok": callback_ok,
           "crossed_ok": crossed_ok, "future_ok": future_ok}
    late = dist.new_group(timeout=datetime.timedelta(seconds=1))
    aborted = dist.new_group()
    # Failed ops' futures: asked for before the failure and after it.
    failing = {ask: dist.new_group(timeout=datetime.timedelta(seconds=1)) for ask in ("early", "late")}
    if rank == 1:  # never joins the ops below; waits until rank 0 is done with them
        store.wait(["latency_path/done"], datetime.timedelta(seconds=60))
        return out
    for name, group in (("deadline", late), ("abort", aborted)):
        timer = None
        if name == "abort":
            timer = threading.Timer(0.5, group.abort)
            timer.start()
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2), group=group)
            out[name] = {"error": None}
        except Exception as e:  # noqa: BLE001 (reported)
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300],
                         "seconds": time.monotonic() - start}
        if timer is not None:
            timer.join(10)
            out[name]["abort_returned"] = not timer.is_alive()
    for ask, group in failing.items():
        work = dist.all_reduce(torch.ones(2), group=group, async_op=True)
        fut = work.get_future() if ask == "early" else None
        time.sleep(1.5)  # past the group's timeout: the op failed meanwhile
        fut = fut if fut is not None else work.get_future()
        try:
            fut.wait()
            out[f"future_error_{ask}"] = None
        except Exception as e:  # noqa: BLE001 (reported)
            out[f"future_error_{ask}"] = f"{type(e).__name__}: {e}"[:300]
    store.set("latency_path/done", "1")
    return out


def test_latency_path_order_deadline_and_abort(tmp_path):
    with Spawned(latency_path, 2, tmp_path) as w:
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
