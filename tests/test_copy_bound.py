"""benchmarks/copy_bound.py end to end on a small size: the C copy-bound program in both modes
(built with gcc, checking its own output bytes), ringdist and torch's floor, with Open MPI where
installed.
Checks the JSON's shape and that every time is positive, not speed."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_copy_bound_small(tmp_path):
    out = tmp_path / "bound.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "copy_bound.py"), "--bytes", "64K",
           "--rounds", "1", "--seconds", "0.2", "--timeout", "120", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["floor_us"] > 0
    [row] = data["rows"]
    assert row["bytes_per_rank"] == 64 * 1024
    assert row["copy_kernel_us"] > 0 and row["copy_shm_us"] > 0 and row["ringdist_us"] > 0
    # the bound is the cheaper of the two ways to move the peer's block
    assert row["copy_bound_us"] == min(row["copy_kernel_us"], row["copy_shm_us"])
    # ringdist's own cost is what is left after the copies and torch's floor
    assert row["ringdist_own_us"] == row["ringdist_us"] - row["copy_bound_us"] - data["floor_us"]
    assert (row["mpi_us"] is None) == ("no mpirun or mpi4py" in proc.stdout)


def test_copy_bound_reduce_mode(tmp_path):
    """The bare two-process allreduce (copy_bound.c reduce): it checks each rank's sum of the last
    call (1 + 2 in every element) and fails on a wrong one; a size that is not whole floats too."""
    exe = tmp_path / "copy_bound"
    subprocess.run(["gcc", "-O2", "-o", str(exe), os.path.join(REPO, "benchmarks", "copy_bound.c")],
                   check=True)
    for size in ("8", "4096", "100"):
        proc = subprocess.run([str(exe), "reduce", size, "2000"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"reduce allreduce {size} B N=2:" in proc.stdout and "us per call" in proc.stdout
