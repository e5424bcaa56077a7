"""Failure behaviour of ringdist with real processes (issue 5, scenarios 1-9).

Two kinds of worlds are used:

* the shared harness (``world_factory``), for scenarios that keep every process alive:
  each failing collective runs on a fresh ``dist.new_group`` with a short timeout, so
  only that subgroup is aborted and the world stays usable. These worlds carry a
  private env key so the session cache never hands them to other test files;
* worlds spawned here (``Spawned``: tests/failure_scripts/ranks.py), for scenarios that
  kill a rank, re-initialise the default group, or hold a rank back during init.
  Their ranks initialise with small timeouts (10 s; 20 s where a rank is held back).

Every wait is bounded; hung ranks get their stacks dumped (SIGUSR1) and are killed.
Measured times are attached to the test report (``record_property``) and printed
(``pytest -s`` or ``-rP`` shows them).
"""
from __future__ import annotations

import datetime
import json
import hashlib
import hmac
import os
import pickle
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from world import default_backend

pytestmark = pytest.mark.skipif(default_backend() != "ringdist",
                                reason="ringdist failure behaviour (spawns ringdist worlds itself)")

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS_SCRIPT = os.path.join(HERE, "failure_scripts", "ranks.py")
TRAIN_KILL_SCRIPT = os.path.join(HERE, "failure_scripts", "train_kill.py")
# Private key for the shared harness: these worlds get aborted subgroups and DETAIL mode.
FT_ENV = {"RINGDIST_TEST_WORLD": "failures"}
TIMED_OUT = re.compile(r"Timed out|timeout", re.I)
# Transports (RINGDIST_TRANSPORT): "tcp" forces the TCP mesh; "auto" is what users get
# (shared memory between ranks on one host, in builds that have it). Builds without the
# variable ignore it, and both ids then run the TCP mesh.
TRANSPORTS = ["tcp", "auto"]
transports = pytest.mark.parametrize("transport", TRANSPORTS)


def _sec(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def _report(record_property, name, value):
    record_property(name, value)
    print(f"[measured] {name} = {value}")


def _tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", "replace")
    except OSError as e:
        return f"<{e}>"


# ============================================================ self-spawned worlds
class Spawned:
    """``ws`` processes running failure_scripts/ranks.py SCENARIO, around a TCPStore hosted here."""

    def __init__(self, scenario: str, ws: int, workdir, env: dict | None = None):
        self.ws = ws
        self.workdir = str(workdir)
        self.outdir = os.path.join(self.workdir, "results")
        os.makedirs(self.outdir, exist_ok=True)
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=_sec(60),
                                   wait_for_workers=False)
        self.logs = [os.path.join(self.workdir, f"rank{r}.log") for r in range(ws)]
        base = dict(os.environ)
        base.update({
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port),
            "WORLD_SIZE": str(ws),
            # Same import path as this process (so the same torch_ringdist is used).
            "PYTHONPATH": os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)]
                                          + [base.get("PYTHONPATH", "")]),
        })
        base.update({k: str(v) for k, v in (env or {}).items()})
        self.procs: list[subprocess.Popen] = []
        try:
            for r in range(ws):
                with open(self.logs[r], "wb") as log:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-u", RANKS_SCRIPT, scenario, self.outdir],
                        env=dict(base, RANK=str(r), LOCAL_RANK=str(r)), cwd=self.workdir,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                        start_new_session=True))
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def alive(self, r) -> bool:
        return self.procs[r].poll() is None

    def logs_text(self, ranks=None) -> str:
        return "\n".join(f"--- rank {r} log ---\n{_tail(self.logs[r])}"
                         for r in (range(self.ws) if ranks is None else ranks))

    def wait_until(self, what: str, cond, timeout: float, allow_dead=()):
        """Polls ``cond()`` until true; fails (after killing the world) on deadline or death."""
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            for r, p in enumerate(self.procs):
                if r not in allow_dead and p.poll() is not None:
                    res = self._result(r)
                    detail = res["crash"] if isinstance(res, dict) and "crash" in res else res
                    self.kill()
                    pytest.fail(f"rank {r} exited (code {p.returncode}) while waiting for {what}:"
                                f"\n{detail}\n{self.logs_text()}")
            if time.monotonic() > deadline:
                self.hang_fail(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    def hang_fail(self, msg: str):
        live = [r for r in range(self.ws) if self.alive(r)]
        for r in live:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(0.5)
        self.kill()
        pytest.fail(f"{msg}; rank(s) {live} still running, killed (stacks in their logs)\n"
                    + self.logs_text())

    def _result(self, r):
        path = os.path.join(self.outdir, f"rank{r}.json")
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def results(self, timeout: float, expect_dead=()) -> dict:
        """Waits (bounded) for every rank not in expect_dead to exit; returns their results."""
        deadline = time.monotonic() + timeout
        waiting = [r for r in range(self.ws) if r not in expect_dead]
        while any(self.alive(r) for r in waiting):
            if time.monotonic() > deadline:
                self.hang_fail(f"rank(s) {[r for r in waiting if self.alive(r)]} did not finish "
                               f"within {timeout}s")
            time.sleep(0.05)
        out = {}
        for r in waiting:
            res = self._result(r)
            assert res is not None, (f"rank {r} exited with code {self.procs[r].returncode} "
                                     f"without a result\n{self.logs_text([r])}")
            assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}\n{self.logs_text([r])}"
            out[r] = res
        return out

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


# ================================================== 1. SIGKILL in a large allreduce
# "hosts": 4 ranks on 2 emulated hosts, so the allreduce runs two-level and some survivors
# only ever talk to the victim through ranks that are themselves failing. "hosts-int8": the
# same world looping compressed (int8) allreduces, whose two phases talk to every peer.
@pytest.mark.parametrize("transport", TRANSPORTS + ["hosts", "hosts-int8"])
def test_sigkill_mid_allreduce_fails_survivors_fast(tmp_path, record_property, transport):
    ws, victim = (4, 1) if transport.startswith("hosts") else (3, 1)
    env = ({"RINGDIST_HOST_ID": "h0,h1,h0,h1"} if transport.startswith("hosts")
           else {"RINGDIST_TRANSPORT": transport})
    if transport.endswith("-int8"):
        env["FT_CODEC"] = "int8"
    with Spawned("kill_mid_allreduce", ws, tmp_path, env=env) as w:
        w.wait_until("every rank looping over 64 MiB allreduces",
                     lambda: w.store.add("ft/looping", 0) >= ws, timeout=90)
        time.sleep(0.4)  # well inside an allreduce (each takes ~0.1-1 s here)
        assert all(w.alive(r) for r in range(ws)), w.logs_text()
        t_kill = time.time()
        os.kill(w.pids[victim], signal.SIGKILL)
        res = w.results(timeout=60, expect_dead={victim})

    problems = []
    for r, out in sorted(res.items()):
        _report(record_property, f"rank{r}_iterations_before_kill", out["iters"])
        _report(record_property, f"rank{r}_median_allreduce_s", out["median_op_s"])
        err = out["error"]
        if err is None:
            problems.append(f"rank {r}: no error at all within the 60 s loop after rank {victim} died")
            continue
        latency = out["error_wall_time"] - t_kill
        _report(record_property, f"rank{r}_kill_to_error_s", round(latency, 3))
        _report(record_property, f"rank{r}_error", err["message"][:400])
        if latency >= 10:
            problems.append(f"rank {r}: error {latency:.2f}s after the kill (want < 10 s)")
        if not re.search(rf"\brank {victim}\b", err["message"]):
            problems.append(f"rank {r}: message does not name the dead rank {victim}: {err['message']!r}")
        if "DistBackendError" not in err["mro"]:
            problems.append(f"rank {r}: raised {err['type']} (want torch.distributed.DistBackendError)")
        # README: later operations on the aborted group raise the same error, at once.
        later = out["later_error"]
        _report(record_property, f"rank{r}_later_op_error_s", round(out["later_error_s"], 3))
        if later is None:
            problems.append(f"rank {r}: an allreduce after the failure succeeded")
        elif out["later_error_s"] > 2:
            problems.append(f"rank {r}: allreduce after the failure took {out['later_error_s']:.2f}s to raise")
        _report(record_property, f"rank{r}_destroy_s", round(out["destroy_s"], 3))
        if out["destroy_s"] > 5:
            problems.append(f"rank {r}: destroy_process_group took {out['destroy_s']:.2f}s after the abort")

        # Leaks: compare with the process before init (torch imported, store client open).
        before, after = out["resources_before_init"], out["resources_after_destroy"]
        _report(record_property, f"rank{r}_threads_before_init/after_init/after_destroy",
                (before["native_threads"], out["resources_after_init"]["native_threads"],
                 after["native_threads"]))
        _report(record_property, f"rank{r}_fds_before_init/after_init/after_destroy",
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


# ============================== harness worlds: per-test subgroups with short timeouts
def _ft_world(world_factory, ws, env=None, transport=None):
    env = dict(FT_ENV, **(env or {}))
    if transport is not None:
        env["RINGDIST_TRANSPORT"] = transport
    return world_factory(ws, env=env)


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
    sub = dist.new_group(list(range(ws)), timeout=_sec(SKIP_TIMEOUT_S))
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
    res = _ft_world(world_factory, ws, transport=transport).run(_skip_collective, skipper, timeout=90)
    problems = []
    for r, out in enumerate(res):
        if r == skipper:
            le = out["later_error"]
            _report(record_property, f"skipper_rank{r}_next_op_error_s", round(out["later_elapsed"], 3))
            if le is None:
                problems.append(f"rank {r} (skipper): its next op on the aborted group succeeded")
            elif out["later_elapsed"] > 2:
                problems.append(f"rank {r} (skipper): next op took {out['later_elapsed']:.2f}s to fail")
            continue
        err = out["error"]
        _report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        if err is None:
            problems.append(f"rank {r}: the collective succeeded although rank {skipper} skipped it")
            continue
        _report(record_property, f"rank{r}_error", err["message"][:400])
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
        _report(record_property, f"rank{r}_destroy_subgroup_s", round(out["destroy_s"], 3))
    assert not problems, "\n".join(problems)


WAIT_TIMEOUT_S = 1


def _wait_with_timeout(rank, ws):
    sub = dist.new_group(list(range(ws)), timeout=_sec(6))
    out = {}
    x = torch.full((1000,), float(rank))
    if rank == 0:
        work = dist.all_reduce(x, group=sub, async_op=True)
        t0 = time.monotonic()
        try:
            work.wait(timeout=_sec(WAIT_TIMEOUT_S))
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
    res = _ft_world(world_factory, 3, transport="auto").run(_wait_with_timeout, timeout=90)
    out = res[0]
    _report(record_property, "wait_timeout_elapsed_s", round(out["elapsed"], 3))
    _report(record_property, "op_after_wait_timeout", out.get("second_wait"))
    assert out["error"] is not None, "work.wait(timeout=1s) returned although the op cannot complete"
    _report(record_property, "wait_timeout_error", out["error"]["message"][:300])
    assert TIMED_OUT.search(out["error"]["message"]), out["error"]
    assert 0.8 * WAIT_TIMEOUT_S <= out["elapsed"] < WAIT_TIMEOUT_S + 2, out


# ---------------------------------------------- 3. ranks disagree about a collective
MISMATCH_WS = 4
COUNT, BAD_COUNT = 4, 5
SENTINEL = -7.0


def _mismatch(rank, ws, op, kind, bad_rank):
    sub = dist.new_group(list(range(ws)), timeout=_sec(10))
    dist.barrier(group=sub)  # connections up, everybody here
    bad = rank == bad_rank
    count = BAD_COUNT if bad and kind == "count" else COUNT
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
    sub = dist.new_group(list(range(ws)), timeout=_sec(10))
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
            x = torch.ones(COUNT)
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


P2P_MISUSE = {
    "recv_any_size": r"recv.*rank 0.*expects 16 bytes.*rank 1 sent 20 bytes",
    "recv_before_collective": r"rank 0.*rank 1.*collective.*different orders",
}


@pytest.mark.parametrize("scenario", sorted(P2P_MISUSE))
@transports
def test_p2p_misuse_fails_both_ranks(world_factory, transport, scenario):
    """A receive from any source meeting a message of another size, or a receive posted before a
    collective whose matching send comes after it: both ranks fail within seconds, rank 0 says why."""
    res = _ft_world(world_factory, 2, transport=transport).run(_p2p_misuse, scenario, timeout=60)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None, f"rank {r}: no error"
        assert out["elapsed"] < 5, f"rank {r}: took {out['elapsed']:.2f}s to fail"
        assert "DistBackendError" in err["mro"], err
    msg = res[0]["error"]["message"]
    assert re.search(P2P_MISUSE[scenario], msg), msg


def _ring_neighbours(r, ws):
    return {(r - 1) % ws, (r + 1) % ws}


@pytest.mark.parametrize("bad_rank", [0, 2], ids=["bad-rank0", "bad-rank2"])
@pytest.mark.parametrize("kind", ["count", "dtype"])
@pytest.mark.parametrize("op", ["allreduce", "all_gather", "broadcast"])
@transports
def test_mismatched_collective(world_factory, record_property, transport, op, kind, bad_rank):
    ws = MISMATCH_WS
    res = _ft_world(world_factory, ws, transport=transport).run(_mismatch, op, kind, bad_rank, timeout=90)
    mine = f"count={COUNT}" if kind == "count" else "dtype=float32"
    theirs = f"count={BAD_COUNT}" if kind == "count" else "dtype=float64"
    problems = []
    for r, out in enumerate(res):
        err = out["error"]
        _report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        if err is None:
            problems.append(f"rank {r}: {op} succeeded although rank {bad_rank} called it with a "
                            f"different {kind}")
        else:
            msg = err["message"]
            _report(record_property, f"rank{r}_error", msg[:500])
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
        _report(record_property, f"rank{r}_destroy_subgroup_s", round(out["destroy_s"], 3))
    assert not problems, "\n".join(problems)


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
    sub = dist.new_group(list(range(ws)), timeout=_sec(10))
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
    w = _ft_world(world_factory, 2, DETAIL_ENV)
    res = w.run(_detail_collectives, timeout=60)
    for r, out in enumerate(res):
        _report(record_property, f"rank{r}_backend_type", out["backend_type"])
        assert out["backend_name"] == "ringdist"
        assert not out["errors"], f"rank {r}: {out['errors']}"
    # torch wraps the backend for its fingerprint checks under DETAIL.
    assert all(out["backend_type"] == "_ProcessGroupWrapper" for out in res), res
    # README: DETAIL also turns on ringdist's own debug output.
    assert any("[ringdist]" in _tail(path, 200000) for path in w.logs), "no ringdist debug output"


def test_detail_debug_mode_reports_shape_mismatch(world_factory, record_property):
    res = _ft_world(world_factory, 2, DETAIL_ENV).run(_detail_shape_mismatch, timeout=60)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None, f"rank {r}: mismatched all_reduce succeeded under DETAIL"
        _report(record_property, f"rank{r}_time_to_error_s", round(out["elapsed"], 3))
        _report(record_property, f"rank{r}_error", err["message"][:500])
        msg = err["message"]
        assert re.search(r"mismatch", msg, re.I), msg
        assert f"[{BAD_COUNT}]" in msg and f"[{COUNT}]" in msg, msg
        assert out["elapsed"] < 8, out


# ---------------------------------------- 5. 1000 async ops over two groups, reverse waits
N_ASYNC = 1000


def _many_async(rank, ws, n):
    groups = [dist.new_group(list(range(ws)), timeout=_sec(30)) for _ in range(2)]
    pending = []
    for i in range(n):
        g = groups[i % 2]
        kind = (i // 2) % 3
        if kind == 0:
            t = torch.full((5,), float(rank + i))
            w = dist.all_reduce(t, group=g, async_op=True)
            expect = [torch.full((5,), float(ws * i + sum(range(ws))))]
            got = [t]
        elif kind == 1:
            src = i % ws
            t = torch.full((3,), float(i) if rank == src else -1.0, dtype=torch.float64)
            w = dist.broadcast(t, src=src, group=g, async_op=True)
            expect = [torch.full((3,), float(i), dtype=torch.float64)]
            got = [t]
        else:
            got = [torch.empty(2, dtype=torch.int64) for _ in range(ws)]
            w = dist.all_gather(got, torch.full((2,), i * 10 + rank, dtype=torch.int64),
                                group=g, async_op=True)
            expect = [torch.full((2,), i * 10 + r, dtype=torch.int64) for r in range(ws)]
        pending.append((i, w, got, expect))
    t0 = time.monotonic()
    bad = []
    for i, w, got, expect in reversed(pending):
        w.wait()
        if not all(torch.equal(a, b) for a, b in zip(got, expect)):
            bad.append(i)
    waited = time.monotonic() - t0
    for g in groups:
        dist.destroy_process_group(g)
    return {"bad": bad[:20], "n_bad": len(bad), "wait_s": waited}


@transports
def test_many_async_ops_two_groups_reverse_wait(world_factory, record_property, transport):
    res = _ft_world(world_factory, 3, transport=transport).run(_many_async, N_ASYNC, timeout=120)
    for r, out in enumerate(res):
        _report(record_property, f"rank{r}_reverse_wait_s", round(out["wait_s"], 3))
        assert out["n_bad"] == 0, f"rank {r}: {out['n_bad']} wrong results, e.g. ops {out['bad']}"


# ================================================== 6. 50 init/destroy cycles
N_CYCLES = 50


def _foreign_shm(name: str) -> bool:
    # torch's shared-memory tensors of other processes on this shared machine.
    m = re.match(r"torch_(\d+)_", name)
    return bool(m) and m.group(1) not in _OUR_PIDS


_OUR_PIDS: set[str] = set()


@transports
def test_init_destroy_cycles_do_not_leak(tmp_path, record_property, transport):
    ws = 2
    stores = tmp_path / "stores"
    stores.mkdir()
    with Spawned("cycles", ws, tmp_path, env={"FT_CYCLES": N_CYCLES, "FT_STORE_DIR": str(stores),
                                              "RINGDIST_TRANSPORT": transport}) as w:
        _OUR_PIDS.update(str(p) for p in w.pids)
        res = w.results(timeout=240)
    problems = []
    for r, out in sorted(res.items()):
        c1, c5, cn = (out["per_cycle"][k] for k in ("1", "5", str(N_CYCLES)))
        times = out["cycle_s"]
        _report(record_property, f"rank{r}_cycle_s_median/max",
                (round(sorted(times)[len(times) // 2], 3), round(max(times), 3)))
        for key in ("native_threads", "py_threads", "fds"):
            _report(record_property, f"rank{r}_{key}_cycle1/5/{N_CYCLES}", (c1[key], c5[key], cn[key]))
            if cn[key] > c5[key]:
                problems.append(f"rank {r}: {key} grew from {c5[key]} (cycle 5) to {cn[key]} "
                                f"(cycle {N_CYCLES})")
        new_fds = sorted(set(cn["fd_targets"]) - set(c5["fd_targets"]))
        if new_fds and cn["fds"] > c5["fds"]:
            problems.append(f"rank {r}: new fds {new_fds[:10]}")
        new_shm = [s for s in set(cn["shm"]) - set(c5["shm"]) if not _foreign_shm(s)]
        if new_shm or len(cn["shm_maps"]) > len(c5["shm_maps"]):
            problems.append(f"rank {r}: /dev/shm grew: {sorted(new_shm)[:10]}, mapped "
                            f"{c5['shm_maps']} -> {cn['shm_maps']}")
        err = out["after_destroy_error"]
        _report(record_property, f"rank{r}_collective_after_destroy", err)
        if err is None:
            problems.append(f"rank {r}: a collective after destroy_process_group succeeded")
        elif not ({"ValueError", "RuntimeError"} & set(err["mro"])
                  and "Default process group has not been initialized" in err["message"]):
            problems.append(f"rank {r}: collective after destroy raised {err} (want torch's "
                            "'Default process group has not been initialized')")
    assert not problems, "\n".join(problems)


# ======================================== 7. torchrun restart resumes from a checkpoint
TORCHRUN_TIMEOUT_S = 90  # a healthy run (two attempts) takes ~17-40 s on 2 loaded cores
KILL_STEP = 30  # steps per epoch with 2 ranks and the default global batch 64: 22
# On the restarted attempt rank 0 starts this much later than rank 1 (a slower node), so
# rank 1 reaches the group's rendezvous first: the order that matters when the store
# outlives the first attempt (torchrun's static rendezvous keeps the agent's TCPStore).
RESTART_DELAY_RANK0_S = 3
# The example passes no timeout to init_process_group (torch's default: 30 min); the
# wrapper lowers that default so a stuck rendezvous fails the job instead of hanging it.
PG_TIMEOUT_S = 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def _kill_tree(proc):
    """torchrun's workers live in their own sessions: kill every descendant, then torchrun."""
    for pid in _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(10)


def _worker_states(proc):
    """Python-less view of hung workers: what each one is blocked in (for the failure text)."""
    lines = []
    for pid in _descendants(proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "train_kill" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0")
                           if "=" in kv)
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
            socks = [(local, remote, st) for _, local, remote, st in _proc_sockets(pid)]
            lines.append(f"pid {pid} RANK={env.get('RANK')} attempt="
                         f"{env.get('TORCHELASTIC_RESTART_COUNT')} wchan={wchan} "
                         f"threads={len(os.listdir(f'/proc/{pid}/task'))} tcp={socks}")
        except OSError:
            continue
    return "\n".join(lines)


def test_torchrun_restart_resumes_from_checkpoint(tmp_path, record_property):
    pytest.importorskip("sklearn")
    ckpt, mark = tmp_path / "ckpt.pt", tmp_path / "killed.txt"
    # RINGDIST_DEBUG: the log then shows each attempt's listening addresses.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RINGDIST_DEBUG="1",
               FT_KILL_RANK="1",
               FT_KILL_STEP=str(KILL_STEP), FT_KILL_MARK=str(mark),
               FT_RESTART_DELAY_RANK0=str(RESTART_DELAY_RANK0_S), FT_PG_TIMEOUT_S=str(PG_TIMEOUT_S))
    for attempt in range(3):
        log_path = tmp_path / f"torchrun{attempt}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--max-restarts", "1", "--monitor-interval", "0.5",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               TRAIN_KILL_SCRIPT, "--backend", "ringdist", "--no-progress", "--epochs", "3",
               "--checkpoint", str(ckpt)]
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stacks = _worker_states(proc)
            _kill_tree(proc)
            pytest.fail(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S}s (killed); rank 1 "
                        f"killed: {mark.exists()}, resumed lines: "
                        f"{re.findall(r'resumed from .*', _tail(log_path, 100000))}\n"
                        f"workers at kill time:\n{stacks}\n{_tail(log_path, 6000)}")
        elapsed = time.monotonic() - t0
        out = _tail(log_path, 1 << 20)
        if proc.returncode != 0 and "address already in use" in out.lower() and not mark.exists():
            continue
        break
    _report(record_property, "torchrun_total_s", round(elapsed, 1))
    assert mark.exists(), f"rank 1 was never killed\n{out[-6000:]}"
    listening = re.findall(r"\[ringdist\] rank \d+ listening on \S+", out)
    assert proc.returncode == 0, (f"exit code {proc.returncode}; ringdist listeners in order of "
                                  f"start (both attempts): {listening}\n{out[-6000:]}")
    resumed = re.findall(r"resumed from \S+ at epoch (\d+)", out)
    assert resumed == ["1"], f"expected one resume at epoch 1, got {resumed}\n{out[-6000:]}"
    final = re.findall(r"^final: loss=(\S+) accuracy=(\S+)$", out, re.M)
    assert len(final) == 1, out[-6000:]
    _report(record_property, "final_loss/accuracy", final[0])
    assert float(final[0][1]) > 0.8, out[-3000:]
    assert torch.load(str(ckpt), weights_only=True)["epoch"] == 3
    # How the surviving rank of the first attempt failed (ringdist error, or stopped by the agent).
    first_err = re.search(r"(ringdist \w+: rank 0[^\n]*)", out)
    _report(record_property, "survivor_error", first_err.group(1)[:300] if first_err else None)


# =========================================== 8/9. handshake: foreign clients, bind address
# The TCP handshake of csrc/transport/mesh.cc: the acceptor speaks first with a
# challenge; the dialer answers with a hello carrying an HMAC-SHA256 over the
# acceptor's nonce, keyed with the group secret from the store.
HELLO_MAGIC, PROTOCOL_VERSION = 0x52444832, 2
CHALLENGE = struct.Struct("<IIi16s")  # magic, version, acceptor rank, nonce
HELLO = struct.Struct("<IIii16s32s")  # magic, version, rank, size, nonce, mac


def _mac(secret, label, nonce, a, b, c):
    message = label.encode().ljust(8, b"\0") + nonce + struct.pack("<iii", a, b, c)
    return hmac.new(secret, message, hashlib.sha256).digest()


def _proc_sockets(pid):
    """(family, local, remote, state) of the TCP sockets the process holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    found = []
    for fam in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{fam}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[9] in inodes:
                found.append((fam, _addr(parts[1]), _addr(parts[2]), parts[3]))
    return found


def _addr(hexaddr):
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        host = socket.inet_ntop(socket.AF_INET6,
                                b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{host}:{int(port, 16)}"


def _store_key(store, suffix):
    keys = [k for k in store.list_keys() if k.endswith(suffix)]
    return keys[0] if len(keys) == 1 else None


def _probe(addr, payload, *, shut_wr=False, wait=3.0):
    """Connects to a rank's listener (127.0.0.1 only), reads its challenge, sends payload
    (bytes, or a function of the challenge's nonce); how did the rank react?"""
    host, port = addr.rsplit(":", 1)
    assert host == "127.0.0.1", addr
    t0 = time.monotonic()
    s = socket.create_connection((host, int(port)), timeout=wait)
    try:
        s.settimeout(wait)
        challenge = b""
        while len(challenge) < CHALLENGE.size:
            chunk = s.recv(CHALLENGE.size - len(challenge))
            if not chunk:
                return {"outcome": "closed before its challenge",
                        "after_s": round(time.monotonic() - t0, 3)}
            challenge += chunk
        magic, version, _, nonce = CHALLENGE.unpack(challenge)
        assert (magic, version) == (HELLO_MAGIC, PROTOCOL_VERSION), challenge.hex()
        if callable(payload):
            payload = payload(nonce)
        if payload:
            try:
                s.sendall(payload)
            except (ConnectionResetError, BrokenPipeError):
                # The rank judged the first bytes and dropped us mid-send.
                return {"outcome": "dropped", "after_s": round(time.monotonic() - t0, 3)}
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(wait)
        try:
            data = s.recv(64)
        except ConnectionResetError:
            data = b""
        except socket.timeout:
            return {"outcome": "still open", "after_s": round(time.monotonic() - t0, 3)}
        return {"outcome": "dropped" if not data else f"answered {data.hex()}",
                "after_s": round(time.monotonic() - t0, 3)}
    finally:
        s.close()


class _CreatesFileWhenUnpickled:
    """Unpickling this object creates a file: proof that untrusted bytes were unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hello(secret, rank, size, acceptor, magic=HELLO_MAGIC, version=PROTOCOL_VERSION):
    """A hello for the challenge's nonce: authentic if `secret` is the group's."""
    def build(nonce):
        return HELLO.pack(magic, version, rank, size, secrets.token_bytes(16),
                          _mac(secret, "hello", nonce, rank, size, acceptor))
    return build


@pytest.fixture(scope="module")
def handshake_run(tmp_path_factory):
    """A 3-rank world whose rank 2 is held back: ranks 0 and 1 sit in the accept loop while
    foreign clients connect. Returns what was observed; tests 8 and 9 assert on it."""
    ws = 3
    tmp = tmp_path_factory.mktemp("handshake")
    obs = {"probes": {}}
    # The TCP handshake is what is probed: force TCP links even between same-host ranks.
    with Spawned("held_init", ws, tmp, env={"FT_HOLD_FROM": 2, "FT_INIT_TIMEOUT": 20,
                                            "RINGDIST_TRANSPORT": "tcp"}) as w:
        store = w.store
        keys = w.wait_until("ranks 0 and 1 publishing their addresses",
                            lambda: all(_store_key(store, f"ringdist/addr/{r}") for r in (0, 1))
                            and [_store_key(store, f"ringdist/addr/{r}") for r in (0, 1)],
                            timeout=60)
        addrs = [store.get(k).decode() for k in keys]
        secret_key = _store_key(store, "ringdist/secret")
        assert secret_key, store.list_keys()
        token = store.get(secret_key)
        obs["published"] = addrs
        port0 = int(addrs[0].rsplit(":", 1)[1])
        # Rank 1 has dialled rank 0 (so rank 0 has accepted it first, in kernel order).
        w.wait_until("rank 1 connected to rank 0",
                     lambda: any(st == "01" and remote.endswith(f":{port0}")
                                 for _, _, remote, st in _proc_sockets(w.pids[1])), timeout=30)
        # 9: listening sockets of every worker process during init.
        obs["listening"] = {r: [(fam, local) for fam, local, _, st in _proc_sockets(w.pids[r])
                                if st == "0A"] for r in range(ws)}

        # 8: foreign clients on rank 0's listener (it still waits for rank 2).
        p = obs["probes"]
        p["garbage 40 bytes"] = _probe(addrs[0], secrets.token_bytes(HELLO.size))
        p["garbage 1 MiB"] = _probe(addrs[0], secrets.token_bytes(1 << 20))
        p["short hello then EOF"] = _probe(addrs[0], lambda n: _hello(token, 2, ws, 0)(n)[:10],
                                           shut_wr=True)
        p["wrong secret"] = _probe(addrs[0], _hello(secrets.token_bytes(32), 2, ws, 0))
        p["replayed mac for another nonce"] = _probe(
            addrs[0], lambda n: _hello(token, 2, ws, 0)(secrets.token_bytes(16)))
        p["wrong protocol version"] = _probe(addrs[0], _hello(token, 2, ws, 0, version=99))
        p["duplicate rank 1 (valid secret)"] = _probe(addrs[0], _hello(token, 1, ws, 0))
        p["absurd size 2^31-1"] = _probe(addrs[0], _hello(token, 2, 2**31 - 1, 0))
        p["absurd rank 2^31-1"] = _probe(addrs[0], _hello(token, 2**31 - 1, ws, 0))
        p["negative rank"] = _probe(addrs[0], _hello(token, -5, ws, 0))
        p["own rank 0"] = _probe(addrs[0], _hello(token, 0, ws, 0))
        # ... and on rank 1's listener: a lower rank never dials a higher one.
        p["rank 1: claims rank 0"] = _probe(addrs[1], _hello(token, 0, ws, 1))
        # 12: pickled payloads that would create a file if any rank unpickled them.
        marker = tmp / "unpickled-by-a-rank"
        evil = pickle.dumps(_CreatesFileWhenUnpickled(str(marker)))
        p["pickle payload as hello"] = _probe(addrs[0], evil.ljust(HELLO.size, b"\0"))
        p["rank 1: pickle payload"] = _probe(addrs[1], evil)
        obs["marker"] = marker
        obs["ranks_alive_after_probes"] = [w.alive(r) for r in range(ws)]

        # A silent client holds rank 0's accept loop (hello timeout) while rank 2 joins.
        host, port = addrs[0].rsplit(":", 1)
        silent = socket.create_connection((host, int(port)), timeout=10)
        t_go = time.monotonic()
        store.set("ft/go", "1")
        try:
            silent.settimeout(15)
            try:
                # The challenge (a fresh nonce) comes first and reveals nothing; what
                # matters is that nothing follows and the connection is then dropped.
                silent.recv(CHALLENGE.size, socket.MSG_WAITALL)
                data = silent.recv(64)
            except (ConnectionResetError, socket.timeout):
                data = b""
            obs["silent_client_dropped_after_s"] = round(time.monotonic() - t_go, 3)
            obs["silent_client_answered"] = data.hex() if data else None
        finally:
            silent.close()
        w.wait_until("all ranks initialised", lambda: store.add("ft/inited", 0) >= ws, timeout=60)
        obs["all_inited_after_go_s"] = round(time.monotonic() - t_go, 3)
        obs["listening_after_init"] = {r: [(fam, local) for fam, local, _, st in
                                           _proc_sockets(w.pids[r]) if st == "0A"]
                                       for r in range(ws)}
        # After init: what does a connect to rank 0's published address do now?
        try:
            obs["after_init_probe"] = _probe(addrs[0], _hello(token, 2, ws, 0), wait=2)
        except ConnectionRefusedError:
            obs["after_init_probe"] = {"outcome": "connection refused (listener closed)"}
        store.set("ft/go2", "1")
        obs["results"] = w.results(timeout=60)
        obs["logs"] = [_tail(path, 100000) for path in w.logs]
    return obs


def test_handshake_drops_foreign_clients(handshake_run, record_property):
    obs = handshake_run
    for name, r in obs["probes"].items():
        _report(record_property, f"probe[{name}]", r)
    _report(record_property, "silent_client_dropped_after_s", obs["silent_client_dropped_after_s"])
    _report(record_property, "all_ranks_inited_after_release_s", obs["all_inited_after_go_s"])
    _report(record_property, "init_s_per_rank", [obs["results"][r]["init_s"] for r in range(3)])
    _report(record_property, "after_init_probe", obs["after_init_probe"])
    problems = [f"{name}: {r}" for name, r in obs["probes"].items() if r["outcome"] != "dropped"]
    # 12: object collectives ran after the probes (ranks.py held_init) and nothing
    # a foreign client sent was ever unpickled.
    if obs["marker"].exists():
        problems.append("a rank unpickled bytes sent by a foreign client")
    if obs["silent_client_answered"]:
        problems.append(f"silent client got an answer: {obs['silent_client_answered']}")
    if not all(obs["ranks_alive_after_probes"]):
        problems.append(f"ranks alive after the probes: {obs['ranks_alive_after_probes']}")
    for r, res in sorted(obs["results"].items()):
        if res["errors"]:
            problems.append(f"rank {r}: collectives after the probes wrong: {res['errors']}")
    # Every dropped connection is logged by the rank that dropped it.
    n_rank0 = sum(1 for name in obs["probes"] if not name.startswith("rank 1:")) + 1  # + silent
    logged0 = obs["logs"][0].count("dropped an incoming connection")
    logged1 = obs["logs"][1].count("dropped an incoming connection")
    _report(record_property, "dropped_connections_logged_rank0/rank1", (logged0, logged1))
    if logged0 < n_rank0 or logged1 < 1:
        problems.append(f"logged drops: rank 0 {logged0} (want {n_rank0}), rank 1 {logged1} (want 1)")
    # After init the listener is closed: nothing foreign can reach the job any more.
    if "refused" not in obs["after_init_probe"]["outcome"] and \
            obs["after_init_probe"]["outcome"] != "dropped":
        problems.append(f"connect to rank 0's address after init: {obs['after_init_probe']}")
    assert not problems, "\n".join(problems)


def test_listener_binds_chosen_address_only(handshake_run, record_property):
    obs = handshake_run
    _report(record_property, "published_addresses", obs["published"])
    _report(record_property, "listening_during_init", obs["listening"])
    _report(record_property, "listening_after_init", obs["listening_after_init"])
    for r in (0, 1):  # rank 2 was held back, so it had no listener yet
        socks = obs["listening"][r]
        assert socks, f"rank {r}: no listening socket found during init"
        for fam, local in socks:
            host = local.rsplit(":", 1)[0]
            assert host not in ("0.0.0.0", "::", "::ffff:0.0.0.0"), \
                f"rank {r} listens on a wildcard address: {fam} {local}"
            assert host == "127.0.0.1", f"rank {r} listens on {fam} {local}, not on 127.0.0.1"
        assert (("tcp", obs["published"][r]) in socks), \
            f"rank {r} published {obs['published'][r]} but listens on {socks}"
        assert obs["published"][r].startswith("127.0.0.1:"), obs["published"][r]


N_SILENT = 3


def test_handshake_survives_silent_clients(tmp_path, record_property):
    """Foreign clients that connect during init and then say nothing (a port scanner, a
    stuck prober) must not keep the real ranks from connecting within the init timeout."""
    with Spawned("held_init", 2, tmp_path, env={"FT_HOLD_FROM": 1, "FT_INIT_TIMEOUT": 10,
                                                "RINGDIST_TRANSPORT": "tcp"}) as w:
        key = w.wait_until("rank 0 publishing its address",
                           lambda: _store_key(w.store, "ringdist/addr/0"), timeout=60)
        host, port = w.store.get(key).decode().rsplit(":", 1)
        assert host == "127.0.0.1", host
        silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(N_SILENT)]
        try:
            t_go = time.monotonic()
            w.store.set("ft/go", "1")  # rank 1 joins now, queued behind the silent clients
            w.wait_until(f"both ranks initialised with {N_SILENT} silent clients on rank 0's port",
                         lambda: w.store.add("ft/inited", 0) >= 2, timeout=40)
            _report(record_property, "init_done_after_release_s", round(time.monotonic() - t_go, 3))
        finally:
            for s in silent:
                s.close()
        w.store.set("ft/go2", "1")
        res = w.results(timeout=40)
    for r, out in sorted(res.items()):
        _report(record_property, f"rank{r}_init_s", round(out["init_s"], 3))
        assert not out["errors"], f"rank {r}: {out['errors']}"
