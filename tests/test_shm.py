"""Shared-memory transport: selection, cleanliness of /dev/shm, dead peers, oversubscription."""
import os
import signal
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from harness.closed_forms import require_test_build
from harness.procs import WORKER, Launched, field, free_port, launch, world_envs


def ringdist_shm_entries():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("ringdist"))


@pytest.mark.parametrize("transport,expected", [("auto", "shm"), ("shm", "shm"), ("tcp", "tcp")])
def test_transport_choice_and_no_leftovers(transport, expected):
    before = ringdist_shm_entries()
    results = launch(3, "run", env={"RINGDIST_TRANSPORT": transport})
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank} failed:\n{err}"
        kinds = field(out, "TRANSPORTS").split(",")
        assert kinds[rank] == "self"
        assert all(k == expected for i, k in enumerate(kinds) if i != rank), kinds
        # The segment is unlinked as soon as every local rank mapped it.
        assert field(out, "SHM_DURING") == str(len(before)), out
        assert "DONE" in out
    assert ringdist_shm_entries() == before


def test_mixed_policies_fall_back_to_tcp_for_that_rank():
    # Rank-level RINGDIST_TRANSPORT differs: a pair uses shm only if neither refuses it.
    results = launch(3, "run", rank_env=[{}, {}, {"RINGDIST_TRANSPORT": "tcp"}])
    for code, out, err in results:
        assert code == 0, err
    assert field(results[0][1], "TRANSPORTS").split(",") == ["self", "shm", "tcp"]
    assert field(results[2][1], "TRANSPORTS").split(",") == ["tcp", "tcp", "self"]


@pytest.mark.quick
def test_killed_peer_fails_survivors_fast_and_leaves_no_shm():
    before = ringdist_shm_entries()
    results = launch(3, "crash", timeout=90)
    assert results[1][0] == -9, "rank 1 should have been SIGKILLed"
    for rank in (0, 2):
        code, out, err = results[rank]
        assert code == 0, f"rank {rank}: {out}\n{err}"
        line = field(out, "ERROR")
        assert line is not None, out
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 10.0, line
        # Its neighbours name rank 1; the others name whoever failed first.
        assert "rank 1" in message or "first error" in message, message
    assert ringdist_shm_entries() == before


def test_creator_killed_before_unlinking_leaves_no_shm():
    """The host's segment is unlinked by the last rank to map it, not only by its creator: rank
    0 creates it and is SIGKILLed while rank 1 holds its name but has not opened it yet
    (RINGDIST_TEST_SHM_MAP_DELAY_MS); rank 1 then maps it, removes the name and fails its init
    (its peer is gone)."""
    require_test_build()
    before = set(ringdist_shm_entries())
    port = free_port()
    # The store outlives rank 0 (as torchrun's agent's does): the ranks are its clients.
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,  # noqa: F841
                          timeout=timedelta(seconds=60))
    envs = world_envs(2, port, {"SCENARIO_INIT_TIMEOUT": 10, "TORCHELASTIC_USE_AGENT_STORE": True},
                      [{}, {"RINGDIST_TEST_SHM_MAP_DELAY_MS": 3000}])
    with Launched([[sys.executable, "-P", WORKER, "run"]] * 2, envs) as ranks:
        deadline = time.monotonic() + 60
        while not set(ringdist_shm_entries()) - before and time.monotonic() < deadline:
            time.sleep(0.01)
        created = set(ringdist_shm_entries()) - before
        assert created, "rank 0 created no segment within 60 s"
        os.kill(ranks.pids[0], signal.SIGKILL)
        results = ranks.communicate(60)
    assert not ranks.timed_out, results
    assert results[1][0] != 0 and "DONE" not in results[1][1], results[1]
    assert not set(ringdist_shm_entries()) - before, (created, results[1][2][-2000:])


# Rank 0 starts connecting a group ahead (as DiLoCo's joins do, on a daemon thread) and exits
# once it created the host's segment, which its same-host peer has not mapped yet.
_EXITS_WHILE_CONNECTING = """
import os, sys, time
from datetime import timedelta
import torch.distributed as dist
from torch_ringdist._registration import connect_ahead
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
connect_ahead(store, int(os.environ["RANK"]), 2, timedelta(seconds=60))
if os.environ["RANK"] != "0":
    time.sleep(120)  # mapping after RINGDIST_TEST_SHM_MAP_DELAY_MS, unless killed first
before = set(sys.argv[1].split(","))
deadline = time.monotonic() + 60
while not {n for n in os.listdir("/dev/shm") if n.startswith("ringdist")} - before:
    assert time.monotonic() < deadline, "no segment created"
    time.sleep(0.01)
print("CREATED", flush=True)
"""


def test_creator_exiting_while_its_peer_maps_leaves_no_shm():
    """A rank that exits (normally) while a connect on another of its threads still waits for
    its same-host peer to map the segment it created removes the segment's name at exit: the
    peer, SIGKILLed before it maps the segment, never removes it."""
    require_test_build()
    before = set(ringdist_shm_entries())
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,  # noqa: F841
                          timeout=timedelta(seconds=60))
    envs = world_envs(2, port, None, [{}, {"RINGDIST_TEST_SHM_MAP_DELAY_MS": 60000}])
    cmd = [sys.executable, "-P", "-c", _EXITS_WHILE_CONNECTING, ",".join(sorted(before)) or "-"]
    with Launched([cmd] * 2, envs) as ranks:
        assert ranks.procs[0].wait(90) == 0, ranks.communicate(1)[0]
        os.kill(ranks.pids[1], signal.SIGKILL)  # still in its delay before mapping
        results = ranks.communicate(30)
    assert "CREATED" in results[0][1], results[0]
    assert not set(ringdist_shm_entries()) - before, results[0][2][-2000:]


def test_oversubscribed_world_makes_progress():
    # 6 ranks on a 2-core machine: waiting must sleep, not spin.
    results = launch(6, "many", timeout=240)
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank} failed:\n{err}"
        assert "DONE" in out
