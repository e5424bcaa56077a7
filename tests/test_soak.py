"""The short version of benchmarks/soak.py: a random mix of every collective and
point-to-point op at N=4 with CRC on, every result against its closed form, on one host and
on 4 emulated hosts (TCP), no descriptor leak and bounded memory."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOAK = os.path.join(REPO, "benchmarks", "soak.py")
OPS = 400


@pytest.mark.parametrize("hosts", ["", "a,b,c,d"], ids=["one_host", "four_hosts"])
def test_soak(hosts, tmp_path):
    out_json = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k != "RINGDIST_HOST_ID"}
    if hosts:
        env["RINGDIST_HOST_ID"] = hosts
    # A number of ops, not a time: on a loaded machine a time would run fewer (a speed, not a check).
    run = subprocess.run([sys.executable, SOAK, "--nproc", "4", "--ops", str(OPS), "--seed", "1",
                          "--json", str(out_json)], capture_output=True, text=True, timeout=600,
                         env=env, cwd=REPO)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    report = json.loads(out_json.read_text())
    assert report["mismatches"] == 0 and report["ops"] == OPS, report
    assert set(report["by_op"]) == {"all_reduce", "reduce", "broadcast", "all_gather",
                                    "reduce_scatter", "all_to_all", "gather_scatter", "ring_p2p",
                                    "barrier"}, report["by_op"]
    for rank, growth in report["growth"].items():
        assert growth["fds"] == 0, (rank, growth)
        # With large buffers on their own mappings (soak.py) RSS stays within ~0.2 MiB;
        # one leaked buffer of the largest size is 8 MiB.
        assert growth["rss_mib"] < 8, (rank, growth)
