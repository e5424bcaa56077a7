"""Failure behaviour of ringdist with real processes (issue 5, scenarios 1-4): a rank
SIGKILLed mid-allreduce, a rank that skips a collective, ``work.wait`` timeouts, ranks
that disagree about a collective, point-to-point misuse, TORCH_DISTRIBUTED_DEBUG=DETAIL.

Group lifecycle is in test_lifecycle.py, the handshake against foreign clients in
test_handshake.py; harness/spawned.py describes the worlds all three use.
"""
from __future__ import annotations

import datetime
import gc
import os
import re
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness.procs import tail
from harness.spawned import RINGDIST_ONLY, TRANSPORTS, Spawned, ft_world, report, sec, transports
from harness.spawned_rank import error_record, init_group, resources

pytestmark = RINGDIST_ONLY

TIMED_OUT = re.compile(r"Timed out|timeout", re.I)


def _later_op_problems(who, error, elapsed, succeeded, slow) -> list[str]:
    """README: operations on an aborted group raise at once (within 2 s here)."""
    if error is None:
        return [f"{who}: {succeeded}"]
    if elapsed > 2:
        return [f"{who}: {slow.format(elapsed)}"]
    return []


def _looped_op(rank, ws, dist, torch, t):
    """The op kill_mid_allreduce loops (FT_OP): allreduce, or broadcast from rank 1, allgather
    and reduce_scatter, which on one host read peers' memory (single copy)."""
    op = os.environ.get("FT_OP", "allreduce")
    codec = os.environ.get("FT_CODEC")  # compressed allreduces (AVG keeps ones at one)
    if codec:
        import torch_ringdist
        return lambda: torch_ringdist.all_reduce(t, codec=codec, op=dist.ReduceOp.AVG, async_op=True)
    if op == "broadcast":
        return lambda: dist.broadcast(t, src=1, async_op=True)
    if op == "allgather":
        out = torch.empty(t.numel() * ws, dtype=t.dtype)
        return lambda: dist.all_gather_into_tensor(out, t, async_op=True)
    if op == "reduce_scatter":
        block = t.numel() // ws
        out = torch.empty(block, dtype=t.dtype)
        return lambda: dist.reduce_scatter_tensor(out, t[:block * ws], op=dist.ReduceOp.MAX,
                                                  async_op=True)
    return lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)


def kill_mid_allreduce(rank, ws, store, dist, torch):
    """Loop 64 MiB allreduces (or FT_OP) until the test SIGKILLs one rank; survivors report
    the error."""
    before = resources()
    t_init = time.monotonic()
    dist.init_process_group("ringdist", rank=rank, world_size=ws, store=store,
                            timeout=datetime.timedelta(seconds=10))
    init_s = time.monotonic() - t_init
    numel = int(os.environ.get("FT_NUMEL", 16 << 20))  # 64 MiB of float32
    t = torch.ones(numel, dtype=torch.float32)
    issue = _looped_op(rank, ws, dist, torch, t)
    issue().wait()  # warm-up: connections and buffers in place
    after_init = resources()
    store.add("ft/looping", 1)
    iters, op_times = 0, []
    result = {"init_s": init_s, "resources_before_init": before, "resources_after_init": after_init}
    stop_at = time.monotonic() + float(os.environ.get("FT_LOOP_MAX_S", 60))
    while True:
        t0 = time.monotonic()
        try:
            issue().wait()
        except Exception as e:  # noqa: BLE001  (what we are here for)
            result["error_wall_time"] = time.time()
            result["error_wait_s"] = time.monotonic() - t0
            result["error"] = error_record(e)
            break
        op_times.append(time.monotonic() - t0)
        iters += 1
        if time.monotonic() > stop_at:
            result["error"] = None
            break
    result["iters"] = iters
    result["median_op_s"] = sorted(op_times)[len(op_times) // 2] if op_times else None
    # Later operations on the aborted group fail at once with the same error.
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        result["later_error"] = None
    except Exception as e:  # noqa: BLE001
        result["later_error"] = error_record(e)
    result["later_error_s"] = time.monotonic() - t0
    del t
    t0 = time.monotonic()
    dist.destroy_process_group()
    result["destroy_s"] = time.monotonic() - t0
    gc.collect()
    time.sleep(0.3)  # let any exiting thread finish leaving
    result["resources_after_destroy"] = resources()
    return result


# ================================================== 1. SIGKILL in a large allreduce
# "hosts": 4 ranks on 2 emulated hosts, so the allreduce runs two-level and some survivors
# only ever talk to the victim through ranks that are themselves failing. "hosts-int8": the
# same world looping compressed (int8) allreduces, whose two phases talk to every peer.
# "auto-broadcast"/"auto-allgather"/"auto-reduce_scatter": one host looping 16 MiB broadcasts
# from the victim (its peers are reading its memory), allgathers or reduce-scatters (every rank
# reads every other's);
# "auto-pair": two ranks, whose allreduce copies straight between their buffers.
# "direct": 4 emulated hosts of one rank each, the allreduce as a direct exchange (every rank
# sends to and receives from every peer at once), "direct-broadcast" the same world looping
# broadcasts from the victim as scatter and allgather; "halving-doubling": 5 such hosts, the
# allreduce by recursive halving-doubling. Its victim, rank 1, holds the folded pair (0, 1):
# rank 0 waits on it alone, the others meet it in their rounds.
@pytest.mark.parametrize("transport", TRANSPORTS + ["hosts", "hosts-int8", "auto-broadcast",
                                                    "auto-allgather", "auto-reduce_scatter",
                                                    "auto-pair", "direct", "direct-broadcast",
                                                    "halving-doubling"])
def test_sigkill_mid_allreduce_fails_survivors_fast(tmp_path, record_property, transport):
    ws, victim = ((4, 1) if transport.startswith(("hosts", "direct")) else
                  (5, 1) if transport == "halving-doubling" else
                  (2, 1) if transport.endswith("-pair") else (3, 1))
    env = ({"RINGDIST_HOST_ID": "h0,h1,h0,h1"} if transport.startswith("hosts")
           else {"RINGDIST_HOST_ID": ",".join(f"h{r}" for r in range(ws)),
                 "RINGDIST_ROUTE": transport.split("-broadcast")[0]}
           if transport.startswith(("direct", "halving"))
           else {"RINGDIST_TRANSPORT": transport.split("-")[0]})
    if transport.endswith("-int8"):
        env["FT_CODEC"] = "int8"
    if transport.endswith(("-broadcast", "-allgather", "-reduce_scatter")):
        env.update(FT_OP=transport.split("-")[1], FT_NUMEL=str(4 << 20))
    with Spawned(kill_mid_allreduce, ws, tmp_path, env=env) as w:
        w.wait_until("every rank looping over 64 MiB allreduces",
                     lambda: w.store.add("ft/looping", 0) >= ws, timeout=90)
        time.sleep(0.4)  # well inside an allreduce (each takes ~0.1-1 s here)
        assert all(w.alive(r) for r in range(ws)), w.logs_text()
        t_kill = time.time()
        os.kill(w.pids[victim], signal.SIGKILL)
        res = w.results(timeout=60, expect_dead={victim})

    problems = []
    for r, out in sorted(res.items()):
        report(record_property, f"rank{r}_iterations_before_kill", out["iters"])
        report(record_property, f"rank{r}_median_allreduce_s", out["median_op_s"])
        err = out["error"]
        if err is None:
            problems.append(f"rank {r}: no error at all within the 60 s loop after rank {victim} died")
            continue
        latency = out["error_wall_time"] - t_kill
        report(record_property, f"rank{r}_kill_to_error_s", round(latency, 3))
        report(record_property, f"rank{r}_error", err["message"][:400])
        if latency >= 10:
            problems.append(f"rank {r}: error {latency:.2f}s after the kill (want < 10 s)")
        if not re.search(rf"\brank {victim}\b", err["message"]):
            problems.append(f"rank {r}: message does not name the dead rank {victim}: {err['message']!r}")
        if "DistBackendError" not in err["mro"]:
            problems.append(f"rank {r}: raised {err['type']} (want torch.distributed.DistBackendError)")
        # README: later operations on the aborted group raise the same error, at once.
        report(record_property, f"rank{r}_later_op_error_s", round(out["later_error_s"], 3))
        problems += _later_op_problems(f"rank {r}", out["later_error"], out["later_error_s"],
                                       "an allreduce after the failure succeeded",
                                       "allreduce after the failure took {:.2f}s to raise")
        report(record_property, f"rank{r}_destroy_s", round(out["destroy_s"], 3))
        if out["destroy_s"] > 5:
            problems.append(f"rank {r}: destroy_process_group took {out['destroy_s']:.2f}s after the abort")

        # Leaks: compare with the process before init (torch imported, store client open).
        before, after = out["resources_before_init"], out["resources_after_destroy"]
        report(record_property, f"rank{r}_threads_before_init/after_init/after_destroy",
                (before["native_threads"], out["resources_after_init"]["native_threads"],
                 after["native_threads"]))
        report(record_property, f"rank{r}_fds_before_init/after_init/after_destroy",
                (before["fds"], out["resources_after_init"]["fds"], after["fds"]))
        if after["native_threads"] > before["native_threads"]:
            problems.append(f"rank {r}: {after['native_threads'] - before['native_threads']} native "
                            f"thread(s) left after destroy_process_group")
        if after["py_threads"] > before["py_threads"]:
            problems.append(f"rank {r}: Python threads {before['py_threads']} -> {after['py_threads']}")
        new_sockets = (sum(t.startswith("socket:") for t in after["fd_targets"])
                       - sum(t.startswith("socket:") for t in before["fd_targets"]))
        if new_sockets > 0 or after["fds"] > before["fds"] + 2:
            problems.append(f"rank {r}: fds {before['fds']} before init -> {after['fds']} after destroy "
                            f"({new_sockets} more sockets)")
    assert not problems, "\n".join(problems)


def single_copy_abort(rank, ws, store, dist, torch):
    """2 ranks: rank 0 broadcasts 1 MiB, writing half of it straight into rank 1's buffer
    while rank 1 reads the other half. Rank 0's writes wait 300 ms with their write flag set
    (RINGDIST_TEST_SINGLE_COPY_WRITE_DELAY_MS, set by the test), and another thread of rank 1
    aborts its group 100 ms into the broadcast. Both ranks must fail; rank 1's broadcast must
    return only after rank 0's write in flight ended, so no byte lands in the buffer rank 1
    lent after it returned (filled with a pattern at once, checked 500 ms later). The abort
    waits until the flight recorder shows the broadcast started, not a fixed delay."""
    init_group(rank, ws, store, dist)
    t = torch.full((1 << 18,), float(rank))
    group = dist.new_group(timeout=datetime.timedelta(seconds=20))
    # Which way this group copies (single copy forced by the suite; "why" if not taken).
    out = {"error": None,
           "copy": dict(group._get_backend(torch.device("cpu")).same_host_copy)}

    def abort_once_started():
        # The broadcast as the flight recorder shows it: started, then 100 ms in (a loaded
        # machine may hold the caller back longer than a fixed delay would allow).
        import torch_ringdist
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e["profiling_name"].endswith("broadcast") and e["state"] == "started"
                for e in torch_ringdist.trace(group)["entries"]):
            time.sleep(0.005)
        time.sleep(0.1)
        group.abort()

    timer = threading.Thread(target=abort_once_started) if rank == 1 else None
    start = time.monotonic()
    try:
        if timer is not None:
            timer.start()
        dist.broadcast(t, src=0, group=group)
    except Exception as e:  # noqa: BLE001 (reported)
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["seconds"] = time.monotonic() - start
    if rank == 1:
        t.fill_(-1.0)
        time.sleep(0.5)
        out["stray_elements"] = int((t != -1.0).sum())
        timer.join(10)
    return out


def test_single_copy_abort_mid_write(tmp_path):
    """A reader aborted while the root's write into its buffer is in flight (single-copy
    broadcast): both ranks fail, naming the cause, and the reader's broadcast returns only
    once the write ended, so nothing lands in its buffer afterwards (without the wait in
    ShmChannel::close, the 300 ms-delayed write lands after the return)."""
    env = {"RINGDIST_TEST_SINGLE_COPY_WRITE_DELAY_MS": "300"}
    with Spawned(single_copy_abort, 2, tmp_path, env=env) as w:
        got = w.results(120)
    root, reader = got[0], got[1]
    assert reader["copy"]["single_copy"], reader  # else the write under test never happens
    assert reader["error"] and "aborted" in reader["error"], reader
    assert 0.25 < reader["seconds"] < 5, reader  # the abort at 0.1 s waited for the write
    assert root["error"] and re.search(r"\brank 1\b", root["error"]), root
    assert reader["stray_elements"] == 0, reader


# ============================== harness worlds: per-test subgroups with short timeouts
def _err(e: BaseException) -> dict:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e)}


def _check_default_group(ws):
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(ws))), f"default group broken: {x.tolist()}"



# ---------------------------------------------------------- 2. a rank skips a collective
SKIP_TIMEOUT_S = 3


def _skip_collective(rank, ws, skipper):
    sub = dist.new_group(list(range(ws)), timeout=sec(SKIP_TIMEOUT_S))
    warm = torch.ones(8)
    dist.all_reduce(warm, group=sub)  # the subgroup works before the skip
    out = {"error": None}
    if rank != skipper:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1000), group=sub)
        except Exception as e:  # noqa: BLE001
            out["error"] = _err(e)
        out["elapsed"] = time.monotonic() - t0
    dist.barrier()  # default group: the skipper waits here until the others failed
    if rank == skipper:
        # Its next operation on the aborted group must fail at once, not after a timeout.
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(8), group=sub)
            out["later_error"] = None
        except Exception as e:  # noqa: BLE001
            out["later_error"] = _err(e)
        out["later_elapsed"] = time.monotonic() - t0
    t0 = time.monotonic()
    dist.destroy_process_group(sub)
    out["destroy_s"] = time.monotonic() - t0
    _check_default_group(ws)
    return out


@transports
def test_skipped_collective_times_out(world_factory, record_property, transport):
    ws, skipper = 3, 2
    res = ft_world(world_factory, ws, transport=transport).run(_skip_collective, skipper, timeout=90)
    problems = []
    for r, out in enumerate(res):
        if r == skipper:
            report(record_property, f"skipper_rank{r}_next_op_error_s", round(out["later_elapsed"], 3))
            problems += _later_op_problems(f"rank {r} (skipper)", out["later_error"],
                                           out["later_elapsed"],
                                           "its next op on the aborted group succeeded",
                                           "next op took {:.2f}s to fail")
            continue
        err = out["error"]
        report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        if err is None:
            problems.append(f"rank {r}: the collective succeeded although rank {skipper} skipped it")
            continue
        report(record_property, f"rank{r}_error", err["message"][:400])
        if not TIMED_OUT.search(err["message"]):
            problems.append(f"rank {r}: message lacks 'Timed out': {err['message']!r}")
        if not re.search(rf"\brank(\(s\))? {skipper}\b", err["message"]):
            problems.append(f"rank {r}: message does not name the missing rank {skipper}: "
                            f"{err['message']!r}")
        if out["elapsed"] > SKIP_TIMEOUT_S + 5:
            problems.append(f"rank {r}: raised after {out['elapsed']:.2f}s (group timeout "
                            f"{SKIP_TIMEOUT_S}s + 5 s slack)")
        if "DistBackendError" not in err["mro"]:
            problems.append(f"rank {r}: raised {err['type']}, want DistBackendError")
    for r, out in enumerate(res):
        report(record_property, f"rank{r}_destroy_subgroup_s", round(out["destroy_s"], 3))
    assert not problems, "\n".join(problems)


WAIT_TIMEOUT_S = 1


def _wait_with_timeout(rank, ws):
    sub = dist.new_group(list(range(ws)), timeout=sec(6))
    out = {}
    x = torch.full((1000,), float(rank))
    if rank == 0:
        work = dist.all_reduce(x, group=sub, async_op=True)
        t0 = time.monotonic()
        try:
            work.wait(timeout=sec(WAIT_TIMEOUT_S))
            out["error"] = None
        except Exception as e:  # noqa: BLE001
            out["error"] = _err(e)
        out["elapsed"] = time.monotonic() - t0
        dist.barrier()  # default group: now let the others join the allreduce
        # Not a promise of the README, recorded for the report: does the op still complete?
        try:
            work.wait()
            out["second_wait"] = "ok" if torch.equal(x, torch.full((1000,), float(sum(range(ws))))) \
                else f"wrong result {x[:3].tolist()}"
        except Exception as e:  # noqa: BLE001
            out["second_wait"] = "raised: " + str(e)[:300]
    else:
        dist.barrier()
        try:
            dist.all_reduce(x, group=sub)
        except Exception as e:  # noqa: BLE001
            out["late_rank_error"] = str(e)[:300]
    try:
        dist.barrier(group=sub)
    except Exception:  # noqa: BLE001  (an aborted subgroup is fine here)
        pass
    dist.destroy_process_group(sub)
    _check_default_group(ws)
    return out


def test_work_wait_timeout_raises(world_factory, record_property):
    res = ft_world(world_factory, 3, transport="auto").run(_wait_with_timeout, timeout=90)
    out = res[0]
    report(record_property, "wait_timeout_elapsed_s", round(out["elapsed"], 3))
    report(record_property, "op_after_wait_timeout", out.get("second_wait"))
    assert out["error"] is not None, "work.wait(timeout=1s) returned although the op cannot complete"
    report(record_property, "wait_timeout_error", out["error"]["message"][:300])
    assert TIMED_OUT.search(out["error"]["message"]), out["error"]
    assert 0.8 * WAIT_TIMEOUT_S <= out["elapsed"] < WAIT_TIMEOUT_S + 2, out


# ---------------------------------------------- 3. ranks disagree about a collective
MISMATCH_WS = 4
COUNT, BAD_COUNT = 4, 5
LINK_COUNT = 8192  # 32 KiB: past the board (kBoardDataBytes), through the links
# "large": the others' calls are big enough to read peers' memory on one host (single
# copy), the odd rank's is not, so the two sides even exchange headers with different peers.
LARGE_COUNT = 65536
SENTINEL = -7.0


def _mismatch(rank, ws, op, kind, bad_rank):
    sub = dist.new_group(list(range(ws)), timeout=sec(10))
    dist.barrier(group=sub)  # connections up, everybody here
    bad = rank == bad_rank
    count = {"count": BAD_COUNT if bad else COUNT, "dtype": COUNT,
             "large": COUNT if bad else LARGE_COUNT}[kind]
    dtype = torch.float64 if bad and kind == "dtype" else torch.float32
    out = {"error": None}
    t0 = time.monotonic()
    try:
        if op == "allreduce":
            t = torch.full((count,), float(rank + 1), dtype=dtype)
            before = t.clone()
            try:
                dist.all_reduce(t, group=sub)
            finally:
                out["output_unchanged"] = bool(torch.equal(t, before))
        elif op == "all_gather":
            outs = [torch.full((count,), SENTINEL, dtype=dtype) for _ in range(ws)]
            try:
                dist.all_gather(outs, torch.full((count,), float(rank + 1), dtype=dtype), group=sub)
            finally:
                out["slots_unchanged"] = [bool((o == SENTINEL).all()) for o in outs]
        elif op == "broadcast":
            value = 100.0 if rank == 0 else SENTINEL
            t = torch.full((count,), value, dtype=dtype)
            try:
                dist.broadcast(t, src=0, group=sub)
            finally:
                out["output_unchanged"] = bool((t == value).all())
    except Exception as e:  # noqa: BLE001
        out["error"] = _err(e)
    out["elapsed"] = time.monotonic() - t0
    # README: later operations on the group raise (the group is aborted).
    try:
        dist.barrier(group=sub)
        out["later_error"] = None
    except Exception as e:  # noqa: BLE001
        out["later_error"] = str(e)
    t0 = time.monotonic()
    dist.destroy_process_group(sub)
    out["destroy_s"] = time.monotonic() - t0
    _check_default_group(ws)  # the process and its default group are fine
    return out


def _p2p_misuse(rank, ws, scenario):
    sub = dist.new_group(list(range(ws)), timeout=sec(10))
    dist.barrier(group=sub)
    out = {"error": None}
    t0 = time.monotonic()
    try:
        if scenario == "recv_any_size":
            if rank == 0:
                dist.recv(torch.empty(COUNT), group=sub, tag=3)  # from any source
            else:
                dist.send(torch.ones(BAD_COUNT), dst=0, group=sub, tag=3)
        else:  # recv_before_collective: the matching send comes after the collective
            # Large enough to go through the links: the smallest allreduces on one host go
            # through the board, where this order works (test_recv_before_small_collective).
            x = torch.ones(LINK_COUNT)
            if rank == 0:
                work = dist.irecv(torch.empty(COUNT), src=1, group=sub)
                dist.all_reduce(x, group=sub)
                work.wait()
            else:
                dist.all_reduce(x, group=sub)
                dist.send(torch.ones(COUNT), dst=0, group=sub)
        # Rank 1's own calls may complete (its bytes were sent, rank 0's had arrived); the
        # next one on the group must fail once rank 0 aborted it.
        dist.barrier(group=sub)
    except Exception as e:  # noqa: BLE001
        out["error"] = _err(e)
    out["elapsed"] = time.monotonic() - t0
    dist.destroy_process_group(sub)
    _check_default_group(ws)
    return out


def _recv_before_small_collective(rank, ws):
    sub = dist.new_group(list(range(ws)), timeout=sec(10))
    x = torch.full((COUNT,), float(rank + 1))
    if rank == 0:
        got = torch.zeros(COUNT)
        work = dist.irecv(got, src=1, group=sub)
        dist.all_reduce(x, group=sub)
        work.wait()
    else:
        dist.all_reduce(x, group=sub)
        dist.send(torch.full((COUNT,), 7.0), dst=0, group=sub)
        got = torch.full((COUNT,), 7.0)
    dist.destroy_process_group(sub)
    return x.tolist(), got.tolist()


def test_recv_before_small_collective(world_factory):
    """On one host over shared memory the smallest allreduces do not use the links
    (Communicator::publish), so a receive posted before one whose send comes after it
    completes: the allreduce and the message both arrive."""
    res = ft_world(world_factory, 2, transport="auto").run(_recv_before_small_collective,
                                                           timeout=60)
    assert res == [([3.0] * COUNT, [7.0] * COUNT)] * 2, res


P2P_MISUSE = {
    "recv_any_size": r"recv.*rank 0.*expects 16 bytes.*rank 1 sent 20 bytes",
    "recv_before_collective": r"rank 0.*rank 1.*collective.*different orders",
}


@pytest.mark.parametrize("scenario", sorted(P2P_MISUSE))
@transports
def test_p2p_misuse_fails_both_ranks(world_factory, transport, scenario):
    """A receive from any source meeting a message of another size, or a receive posted before a
    collective whose matching send comes after it: both ranks fail within seconds, rank 0 says why."""
    res = ft_world(world_factory, 2, transport=transport).run(_p2p_misuse, scenario, timeout=60)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None, f"rank {r}: no error"
        assert out["elapsed"] < 5, f"rank {r}: took {out['elapsed']:.2f}s to fail"
        assert "DistBackendError" in err["mro"], err
    msg = res[0]["error"]["message"]
    assert re.search(P2P_MISUSE[scenario], msg), msg


def _ring_neighbours(r, ws):
    return {(r - 1) % ws, (r + 1) % ws}


@pytest.mark.quick
@pytest.mark.parametrize("bad_rank", [0, 2], ids=["bad-rank0", "bad-rank2"])
@pytest.mark.parametrize("kind", ["count", "dtype", "large"])
@pytest.mark.parametrize("op", ["allreduce", "all_gather", "broadcast"])
@transports
def test_mismatched_collective(world_factory, record_property, transport, op, kind, bad_rank):
    ws = MISMATCH_WS
    res = ft_world(world_factory, ws, transport=transport).run(_mismatch, op, kind, bad_rank, timeout=90)
    mine, theirs = {"count": (f"count={COUNT}", f"count={BAD_COUNT}"),
                    "dtype": ("dtype=float32", "dtype=float64"),
                    "large": (f"count={LARGE_COUNT}", f"count={COUNT}")}[kind]
    problems = []
    for r, out in enumerate(res):
        err = out["error"]
        report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        if err is None:
            problems.append(f"rank {r}: {op} succeeded although rank {bad_rank} called it with a "
                            f"different {kind}")
        else:
            msg = err["message"]
            report(record_property, f"rank{r}_error", msg[:500])
            if "DistBackendError" not in err["mro"]:
                problems.append(f"rank {r}: raised {err['type']}, want DistBackendError")
            if out["elapsed"] > 5:
                problems.append(f"rank {r}: took {out['elapsed']:.2f}s to fail (a mismatch must "
                                "not wait for the timeout)")
            # Every rank must show both calls and name both ranks: ranks that exchanged
            # headers with the odd rank see them directly, the others through the first
            # error the group published in the store.
            if not (mine in msg and theirs in msg):
                problems.append(f"rank {r}: message does not show both calls ({mine} and "
                                f"{theirs}): {msg!r}")
            names = set(int(x) for x in re.findall(r"\brank (\d+)", msg))
            if bad_rank not in names or not (names - {bad_rank}):
                problems.append(f"rank {r}: message does not name rank {bad_rank} and a rank "
                                f"that disagrees with it: {msg!r}")
        if out["later_error"] is None:
            problems.append(f"rank {r}: a barrier on the group after the failure succeeded")
        # No partial result in any output.
        if op == "all_gather":
            slots = out["slots_unchanged"]
            if r != bad_rank and r not in _ring_neighbours(bad_rank, ws):
                # Headers passed here: only its own block may legitimately have been copied.
                slots = [s for i, s in enumerate(slots) if i != r]
            if not all(slots):
                problems.append(f"rank {r}: all_gather wrote into its output (slots unchanged: "
                                f"{out['slots_unchanged']})")
        elif not out["output_unchanged"]:
            problems.append(f"rank {r}: {op} wrote a partial result into its output")
        report(record_property, f"rank{r}_destroy_subgroup_s", round(out["destroy_s"], 3))
    assert not problems, "\n".join(problems)


@transports
def test_mismatched_allreduce_two_ranks(world_factory, transport):
    """Two ranks take their own small-allreduce path (each reduces the other's data straight
    off the link): a count mismatch still fails both at once, outputs untouched."""
    res = ft_world(world_factory, 2, transport=transport).run(_mismatch, "allreduce", "count", 1,
                                                                timeout=90)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None and "DistBackendError" in err["mro"], (r, out)
        assert f"count={COUNT}" in err["message"] and f"count={BAD_COUNT}" in err["message"], (r, err)
        assert out["elapsed"] < 5 and out["output_unchanged"] and out["later_error"], (r, out)


# ------------------------------------------------------ 4. TORCH_DISTRIBUTED_DEBUG=DETAIL
DETAIL_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _detail_collectives(rank, ws):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    errors = []
    x = torch.full((10,), float(rank + 1))
    dist.all_reduce(x)
    if not torch.equal(x, torch.full((10,), float(ws * (ws + 1) // 2))):
        errors.append(f"all_reduce {x.tolist()}")
    b = torch.full((6,), 5.0 if rank == 1 else 0.0)
    dist.broadcast(b, src=1)
    if not bool((b == 5.0).all()):
        errors.append(f"broadcast {b.tolist()}")
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(ws)]
    dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64))
    if [int(o[0]) for o in outs] != list(range(ws)):
        errors.append(f"all_gather {[o.tolist() for o in outs]}")
    rs = torch.empty(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(i + rank)) for i in range(ws)])
    if not torch.equal(rs, torch.full((2,), float(ws * rank + sum(range(ws))))):
        errors.append(f"reduce_scatter {rs.tolist()}")
    dist.barrier()
    return {"backend_type": type(backend).__name__, "errors": errors,
            "backend_name": dist.get_backend()}


def _detail_shape_mismatch(rank, ws):
    sub = dist.new_group(list(range(ws)), timeout=sec(10))
    dist.barrier(group=sub)
    out = {"error": None}
    t = torch.ones(BAD_COUNT if rank == 0 else COUNT)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t, group=sub)
    except Exception as e:  # noqa: BLE001
        out["error"] = _err(e)
    out["elapsed"] = time.monotonic() - t0
    try:
        dist.destroy_process_group(sub)
    except Exception as e:  # noqa: BLE001
        out["destroy_error"] = str(e)
    _check_default_group(ws)
    return out


def test_detail_debug_mode_collectives(world_factory, record_property):
    w = ft_world(world_factory, 2, DETAIL_ENV)
    res = w.run(_detail_collectives, timeout=60)
    for r, out in enumerate(res):
        report(record_property, f"rank{r}_backend_type", out["backend_type"])
        assert out["backend_name"] == "ringdist"
        assert not out["errors"], f"rank {r}: {out['errors']}"
    # torch wraps the backend for its fingerprint checks under DETAIL.
    assert all(out["backend_type"] == "_ProcessGroupWrapper" for out in res), res
    # README: DETAIL also turns on ringdist's own debug output.
    assert any("[ringdist]" in tail(path, 200000) for path in w.logs), "no ringdist debug output"


def test_detail_debug_mode_reports_shape_mismatch(world_factory, record_property):
    res = ft_world(world_factory, 2, DETAIL_ENV).run(_detail_shape_mismatch, timeout=60)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None, f"rank {r}: mismatched all_reduce succeeded under DETAIL"
        report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        report(record_property, f"rank{r}_error", err["message"][:500])
        msg = err["message"]
        assert re.search(r"mismatch", msg, re.I), msg
        assert f"[{BAD_COUNT}]" in msg and f"[{COUNT}]" in msg, msg
        assert out["elapsed"] < 8, out
