"""The flight recorder: torch_ringdist.trace() live, and the per-rank dump at the first failure
read by torch's own analyser, which must name the rank and the operation of a planted desync."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "failure_scripts", "trace_desync.py")


def test_trace_and_desync_dump(tmp_path):
    run = subprocess.run([sys.executable, "-P", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=180)
    out = run.stdout + run.stderr
    ranks = {r["rank"]: r for r in map(json.loads, [ln for ln in run.stdout.splitlines()
                                                    if ln.startswith("{")])}
    assert sorted(ranks) == [0, 1, 2], out[-3000:]

    # Live: the last 6 of 7 records (RINGDIST_TRACE_BUFFER=6), in issue order, all completed.
    live = ranks[0]["live"]
    names = [e["profiling_name"] for e in live]
    assert names == ["gloo:all_reduce", "gloo:_all_gather_base", "gloo:send 0->1", "gloo:barrier",
                     "gloo:all_reduce", "gloo:all_reduce"], names
    assert [e["collective_seq_id"] for e in live if not e["is_p2p"]] == [2, 3, 4, 5, 6], live
    assert all(e["state"] == "completed" for e in live), live
    gather = live[1]
    assert gather["input_sizes"] == [[5]] and gather["output_sizes"] == [[15]], gather
    assert ranks[1]["live"][2]["profiling_name"] == "gloo:recv 1<-0", ranks[1]["live"]
    assert [e["profiling_name"] for e in ranks[2]["live"]] == [  # no send/recv on rank 2
        "gloo:all_reduce", "gloo:all_reduce", "gloo:_all_gather_base", "gloo:barrier",
        "gloo:all_reduce", "gloo:all_reduce"], ranks[2]["live"]

    # The desync failed on every rank, and each wrote its trace.
    assert all(r["error"] for r in ranks.values()), ranks
    assert sorted(os.listdir(tmp_path)) == ["rank_0", "rank_1", "rank_2"], os.listdir(tmp_path)
    analysis = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                               str(tmp_path), "-p", "rank_"], capture_output=True, text=True,
                              timeout=120)
    report = analysis.stdout + analysis.stderr
    assert "Collective sequence number: 7 has errors" in report, report
    assert "Culprit rank 1" in report and "SIZE_OR_SYNTAX_MISMATCH" in report, report
    assert "'[[8]]' does not match found input sizes: '[[7]]'" in report, report
