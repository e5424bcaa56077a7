"""Shared-memory transport: selection, cleanliness of /dev/shm, dead peers, oversubscription."""
import os

import pytest
from harness.procs import field, launch


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


def test_oversubscribed_world_makes_progress():
    # 6 ranks on a 2-core machine: waiting must sleep, not spin.
    results = launch(6, "many", timeout=240)
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank} failed:\n{err}"
        assert "DONE" in out
