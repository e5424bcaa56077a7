"""The README's multi-host recipe, run as written in two emulated hosts.

benchmarks/netns_hosts.sh gives each host its own network namespace (joined by a bridge),
hostname and /dev/shm, so ranks of different hosts can only meet over TCP. The only change
to the README's commands is host 0's address (10.77.0.1 in the namespaces)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from harness.procs import torchrun_output

pytestmark = [pytest.mark.netns, pytest.mark.slow]

pytest.importorskip("sklearn")
if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "unshare")):
    pytest.skip("needs root with ip, tc and unshare (network namespaces)", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(REPO, "benchmarks", "netns_hosts.sh")
EXAMPLE = os.path.join(REPO, "examples", "train_ddp.py")
FINAL = re.compile(r"^final: loss=(\S+) accuracy=(\S+)$", re.M)
README_HOST0, EMULATED_HOST0 = "10.0.0.1", "10.77.0.1"


def readme_commands():
    text = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"<!-- multi-host recipe.*?-->\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md lost its multi-host recipe block"
    cmds = [line for line in block.group(1).splitlines() if line and not line.startswith("#")]
    assert len(cmds) == 2 and all(README_HOST0 in c for c in cmds), cmds
    return [c.replace(README_HOST0, EMULATED_HOST0) for c in cmds]


def test_readme_multihost_recipe():
    env = dict(os.environ)
    # torchrun of the Python running the tests (a virtual environment's, in CI's CUDA stage).
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    run = subprocess.run(["bash", NETNS, "commands", "--hosts", "2", "--rate", "none", "--no-verify",
                          "--timeout", "240", "--", *readme_commands()],
                         capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "world_size=4" in out, out[-4000:]
    found = FINAL.findall(out)
    assert len(found) == 1, out[-4000:]
    loss, acc = map(float, found[0])

    # The example splits the same global batches over any number of ranks: one gloo
    # process trains the same model, up to float summation order.
    ref = torchrun_output(EXAMPLE, "--backend", "gloo", "--no-progress", nproc=1, timeout=180,
                          cwd=REPO)
    ref_loss, ref_acc = map(float, FINAL.findall(ref)[0])
    assert loss == pytest.approx(ref_loss, rel=1e-4), (loss, ref_loss)
    assert abs(acc - ref_acc) <= 1 / 360 + 1e-9 and acc > 0.9, (acc, ref_acc)
