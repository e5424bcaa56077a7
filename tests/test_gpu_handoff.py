"""benchmarks/gpu_handoff.py on a GPU (skipped without one): every mode measures, and both
stream ping-pongs end with both counters at the iteration count (the hand-offs really ran)."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                      "gpu_handoff.py")


def test_every_mode_measures_and_the_pingpongs_complete(tmp_path):
    out = tmp_path / "handoff.json"
    r = subprocess.run([sys.executable, SCRIPT, "--iters", "300", "--batch", "100",
                        "--timeout", "120", "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = json.loads(out.read_text())["results"]
    for mode in ("sync-both", "host-pingpong", "stream-pingpong-host", "stream-pingpong-device"):
        assert ranks["rank0_us"][mode] > 0 and ranks["rank1_us"][mode] > 0, (mode, ranks)
    for mode in ("stream-pingpong-host", "stream-pingpong-device"):
        assert ranks["rank0_us"][mode + "/final_counters"] == [300, 300], ranks
