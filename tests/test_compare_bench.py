"""benchmarks/compare.py end to end on tiny sizes: ringdist, gloo and torch's dispatch floor
(the fake backend) alternate, with a CPU-bound process beside each rank (--load); with Open MPI
installed (benchmarks/setup_mpi.sh) the mpi peer runs too. Checks the merged JSON, not speed."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_mpi():
    if shutil.which("mpirun") is None:
        return False
    return subprocess.run([sys.executable, "-c", "import mpi4py.MPI"],
                          capture_output=True).returncode == 0


def test_compare_with_floor_load_and_mpi(tmp_path):
    out = tmp_path / "cmp.json"
    peers = ["--peer", "mpi"] if _has_mpi() else ["--backends", "ringdist", "gloo", "floor=fake"]
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "compare.py"), *peers, "--rounds",
           "1", "--max-bytes", "1K", "--time-budget", "0.02", "--iters", "3", "--load",
           "--timeout", "120", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    labels = {"ringdist", "gloo", "floor"} | ({"mpi"} if "mpi" in peers else set())
    assert set(data["results"]) == labels and data["load"] is True
    for label, res in data["results"].items():
        rows = res["rows"]
        assert [r["bytes"] for r in rows] == [8, 32, 128, 512, 1024], label
        assert all(r["time_us"] > 0 and r["wrong"] == 0 for r in rows), (label, rows)
        # fast ops are timed in batches of back-to-back calls
        assert res["checked"] == (label != "floor"), label
    assert "floor" in proc.stdout
