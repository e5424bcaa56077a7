"""What the failure, handshake and lifecycle tests share (test_failures.py, test_handshake.py,
test_lifecycle.py).

Two kinds of worlds are used there:

* the shared harness (``ft_world``), for scenarios that keep every process alive: each
  failing collective runs on a fresh ``dist.new_group`` with a short timeout, so only
  that subgroup is aborted and the world stays usable. These worlds carry a private env
  key so the session cache never hands them to other test files;
* worlds spawned by the test (``Spawned``), whose ranks run harness/spawned_rank.py with
  a scenario function of the test's own file, for scenarios that kill a rank,
  re-initialise the default group, or hold a rank back during init. Their ranks initialise with small timeouts (10 s; 20 s where a rank is
  held back).

Every wait is bounded; hung ranks get their stacks dumped (SIGUSR1) and are killed.
Measured times are attached to the test report (``report``: ``record_property``) and
printed (``pytest -s`` or ``-rP`` shows them).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import socket
import sys
import time

import pytest
import torch.distributed as dist

from harness.procs import Launched, tail, world_envs
from harness.world import default_backend

RINGDIST_ONLY = pytest.mark.skipif(default_backend() != "ringdist",
                                   reason="ringdist failure behaviour (spawns ringdist worlds itself)")

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawned_rank.py")
# Private key for the shared harness: these worlds get aborted subgroups and DETAIL mode.
FT_ENV = {"RINGDIST_TEST_WORLD": "failures"}
# Transports (RINGDIST_TRANSPORT): "tcp" forces the TCP mesh; "auto" is what users get
# (shared memory between ranks on one host, in builds that have it). Builds without the
# variable ignore it, and both ids then run the TCP mesh.
TRANSPORTS = ["tcp", "auto"]
transports = pytest.mark.parametrize("transport", TRANSPORTS)


def sec(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def report(record_property, name, value):
    record_property(name, value)
    print(f"[measured] {name} = {value}")


def ft_world(world_factory, ws, env=None, transport=None):
    """A harness world of ``ws`` ranks private to these tests."""
    env = dict(FT_ENV, **(env or {}))
    if transport is not None:
        env["RINGDIST_TRANSPORT"] = transport
    return world_factory(ws, env=env)


# ============================================================ self-spawned worlds
class Spawned:
    """``ws`` processes running ``scenario(rank, ws, store, dist, torch)`` (a function of a
    test file, spawned_rank.py), around a TCPStore hosted here."""

    def __init__(self, scenario, ws: int, workdir, env: dict | None = None):
        self.ws = ws
        self.workdir = str(workdir)
        self.outdir = os.path.join(self.workdir, "results")
        os.makedirs(self.outdir, exist_ok=True)
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=sec(60),
                                   wait_for_workers=False)
        self.logs = [os.path.join(self.workdir, f"rank{r}.log") for r in range(ws)]
        command = [sys.executable, "-u", RANK_SCRIPT, scenario.__module__, scenario.__name__,
                   self.outdir]
        self.ranks = Launched([command] * ws,
                              world_envs(ws, self.store.port, env), cwd=self.workdir, logs=self.logs)
        self.procs = self.ranks.procs

    @property
    def pids(self):
        return self.ranks.pids

    def alive(self, r) -> bool:
        return self.ranks.alive(r)

    def logs_text(self, ranks=None) -> str:
        return "\n".join(f"--- rank {r} log ---\n{tail(self.logs[r], 4000)}"
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
        self.ranks.signal_stacks(live)
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
        self.ranks.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


# ============================================================ /proc views
def proc_sockets(pid):
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
