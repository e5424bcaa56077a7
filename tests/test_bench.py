"""`python -m torch_ringdist.bench`: runs both backends, checks every result, reports
consistent figures."""
import json
import subprocess
import sys


def _bench(*args, timeout=240):
    return subprocess.run([sys.executable, "-P", "-m", "torch_ringdist.bench", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bench_table_and_json(tmp_path):
    path = tmp_path / "bench.json"
    out = _bench("--nproc", "2", "--rounds", "1", "--sizes", "4K", "256K", "--json", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(path.read_text())
    assert [r["bytes"] for r in report["rows"]] == [4096, 262144]
    for row in report["rows"]:
        assert row["wrong"] == {"ringdist": 0, "gloo": 0}
        assert row["ringdist_us"] > 0 and row["gloo_us"] > 0
        assert abs(row["speedup"] - row["gloo_us"] / row["ringdist_us"]) < 1e-9
        # busbw of N=2 is bytes / time
        assert abs(row["ringdist_busbw_GBps"] - row["bytes"] / row["ringdist_us"] / 1e3) < 1e-6
    assert "256K" in out.stdout and "speedup" in out.stdout
    # The route ringdist took, as the group reports it (one host: the board, then the pair
    # path or single copy by the host's probe).
    assert [r["ringdist_route"] for r in report["rows"]][0] == "board"
    assert report["rows"][1]["ringdist_route"] in ("pair", "single copy"), report["rows"]


def test_bench_refuses_one_rank():
    out = _bench("--nproc", "1", timeout=60)
    assert out.returncode == 2 and "--nproc must be >= 2" in out.stderr
