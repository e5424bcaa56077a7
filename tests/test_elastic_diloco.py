"""DiLoCo with on_failure="shrink" survives a SIGKILLed rank (examples/elastic_diloco.py): the
survivors notice at the round's exchange, shrink, redo it, and train on without rolling back."""
import os
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

from spawned import report

pytest.importorskip("sklearn")
if not hasattr(dist, "shrink_group"):
    pytest.skip("this torch has no dist.shrink_group", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "elastic_diloco.py")
FINAL = re.compile(r"^final: loss=(\S+) accuracy=(\S+) world_size=(\d+) rounds=(\d+) "
                   r"recoveries=(\d+) replica_spread=(\S+)$", re.M)
RECOVERY = re.compile(r"^recovery 1: lost ranks \[(\d+)\]; the round's exchange failed (\d+) ms "
                      r"after the kill; back to training (\d+) ms after the failure$", re.M)


def run(*args):
    out = subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(EXAMPLE))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out.stdout + out.stderr


def test_diloco_survives_a_lost_rank(record_property):
    """4 ranks, original rank 3 SIGKILLed at step 35 (mid-period: rounds after steps 10, 20,
    ...): the round after step 40 fails, the 3 survivors redo it and run every one of the 20
    rounds exactly once, end with one model, and land in the band of an uninterrupted 3-rank
    run (the survivors trained as 4 for the first 35 steps)."""
    out = run("--nproc", "4", "--kill", "3@35")
    loss, acc, world, rounds, recoveries, spread = FINAL.findall(out)[0]
    assert (world, rounds, recoveries) == ("3", "20", "1"), out[-3000:]
    assert float(spread) == 0.0, out[-3000:]
    lost, failed_ms, back_ms = RECOVERY.findall(out)[0]
    assert lost == "3", out[-3000:]
    report(record_property, "recovery_ms", {"failed_after_kill": int(failed_ms),
                                            "back_to_training": int(back_ms)})
    assert int(back_ms) < 5000, back_ms  # target 0.5 s; CI machines are loaded
    three = FINAL.findall(run("--nproc", "3"))[0]
    assert three[2:5] == ("3", "20", "0")
    assert float(acc) > 0.9 and float(loss) <= 1.1 * float(three[0]), (loss, three)
