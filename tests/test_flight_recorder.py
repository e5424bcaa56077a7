"""The flight recorder: torch_ringdist.trace() live, and the per-rank dump at the first failure
read by torch's own analyser, which must name the rank and the operation of a planted desync."""
import os
import subprocess
import sys

import pytest

from harness.spawned import Spawned
from harness.spawned_rank import init_group

pytestmark = pytest.mark.quick


def trace_desync(rank, ws, store, dist, torch):
    """3 ranks record a few ops (checked live with torch_ringdist.trace()), then rank 1 calls
    all_reduce with 7 elements where the others pass 8; with RINGDIST_TRACE_DUMP set every
    rank dumps its trace."""
    import time

    import torch_ringdist

    init_group(rank, ws, store, dist)
    wall_before = time.time_ns()
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    out = torch.empty(ws * 5)
    dist.all_gather_into_tensor(out, torch.ones(5))
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(2), src=0)
    dist.barrier()
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    wall_after = time.time_ns()
    keys = ("profiling_name", "collective_seq_id", "p2p_seq_id", "input_sizes", "output_sizes",
            "state", "is_p2p", "time_created_ns", "time_discovered_started_ns",
            "time_discovered_completed_ns")
    result = {"live": [{k: e[k] for k in keys} for e in torch_ringdist.trace()["entries"]],
              "wall": (wall_before, wall_after)}
    try:
        dist.all_reduce(torch.ones(7 if rank == 1 else 8))
        result["error"] = None
    except Exception as e:  # noqa: BLE001 (reported)
        result["error"] = str(e).splitlines()[0][:300]
    return result


def test_trace_and_desync_dump(tmp_path):
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    env = {"RINGDIST_TRACE_DUMP": trace_dir / "rank_", "RINGDIST_TRACE_BUFFER": 6}
    with Spawned(trace_desync, 3, tmp_path, env=env) as w:
        ranks = w.results(120)

    # Live: the last 6 of 7 records (RINGDIST_TRACE_BUFFER=6), in issue order, all completed.
    live = ranks[0]["live"]
    names = [e["profiling_name"] for e in live]
    assert names == ["gloo:all_reduce", "gloo:_all_gather_base", "gloo:send 0->1", "gloo:barrier",
                     "gloo:all_reduce", "gloo:all_reduce"], names
    assert [e["collective_seq_id"] for e in live if not e["is_p2p"]] == [2, 3, 4, 5, 6], live
    assert all(e["state"] == "completed" for e in live), live
    # Times are wall-clock ns, in order, within the span the ops ran in (taken from the worker's
    # steady-clock readings; 50 ms for the two clocks drifting apart).
    for r in ranks.values():
        before, after = r["wall"]
        for e in r["live"]:
            times = [before - 50_000_000, e["time_created_ns"], e["time_discovered_started_ns"],
                     e["time_discovered_completed_ns"], after + 50_000_000]
            assert times == sorted(times), e
    gather = live[1]
    assert gather["input_sizes"] == [[5]] and gather["output_sizes"] == [[15]], gather
    assert ranks[1]["live"][2]["profiling_name"] == "gloo:recv 1<-0", ranks[1]["live"]
    assert [e["profiling_name"] for e in ranks[2]["live"]] == [  # no send/recv on rank 2
        "gloo:all_reduce", "gloo:all_reduce", "gloo:_all_gather_base", "gloo:barrier",
        "gloo:all_reduce", "gloo:all_reduce"], ranks[2]["live"]

    # The desync failed on every rank, and each wrote its trace.
    assert all(r["error"] for r in ranks.values()), ranks
    assert sorted(os.listdir(trace_dir)) == ["rank_0", "rank_1", "rank_2"], os.listdir(trace_dir)
    analysis = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                               str(trace_dir), "-p", "rank_"], capture_output=True, text=True,
                              timeout=120)
    report = analysis.stdout + analysis.stderr
    assert "Collective sequence number: 7 has errors" in report, report
    assert "Culprit rank 1" in report and "SIZE_OR_SYNTAX_MISMATCH" in report, report
    assert "'[[8]]' does not match found input sizes: '[[7]]'" in report, report


ABORT_SCRIPT = """
import os, pickle, sys, torch, torch.distributed as dist
import torch_ringdist
prefix = sys.argv[1]
os.environ["RINGDIST_TRACE_DUMP"] = prefix
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
dist.init_process_group("ringdist", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(3))
dist.broadcast(torch.ones(4), src=0)
dist.distributed_c10d._abort_process_group()
print(pickle.load(open(prefix + "0", "rb"))["entries"][-1]["profiling_name"])
"""


def test_abort_writes_the_trace(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    run = subprocess.run([sys.executable, "-P", "-c", ABORT_SCRIPT, str(tmp_path / "rank_")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "gloo:broadcast", run.stdout + run.stderr


PROFILE_SCRIPT = """
import torch, torch.distributed as dist
import torch_ringdist
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
dist.init_process_group("ringdist", store=store, rank=0, world_size=1)
x = torch.ones(4)
dist.all_reduce(x)  # outside the profiler: recorded nowhere
with torch.profiler.profile() as prof:
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
print(sorted(e.name for e in prof.events() if not e.name.startswith("c10d::")))
"""


def test_ops_show_in_torch_profiler():
    # The Work's profiling range is made only while an observer is installed (it costs every op
    # an allocation otherwise); under torch.profiler each op shows by name.
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    run = subprocess.run([sys.executable, "-P", "-c", PROFILE_SCRIPT], capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "['allreduce', 'broadcast']", run.stdout
