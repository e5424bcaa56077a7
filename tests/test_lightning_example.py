"""examples/lightning_train.py: PyTorch Lightning's DDPStrategy on ringdist, launched by
Lightning itself (it runs the script again per rank), against the same run on gloo."""
import os
import re
import subprocess
import sys

import pytest

from harness.procs import free_port

pytest.importorskip("sklearn")
pytest.importorskip("lightning")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "lightning_train.py")
FINAL = re.compile(r"^final: loss=(\S+) accuracy=(\S+)$", re.M)
STEPS = re.compile(r"\bsteps=(\d+) hook_steps=(\d+)")
# What a rank prints when teardown at exit goes wrong (the store's host gone first, a
# worker thread alive at finalization); Lightning's own warnings are not noise.
NOISE = ("Traceback", "recvValue", "Connection was likely closed", "terminate called",
         "Segmentation fault", "core dumped")


def lightning(*args, epochs=2):
    """Run the example on 2 ranks; returns (final loss string, steps, hook steps, output)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    run = subprocess.run([sys.executable, EXAMPLE, "--devices", "2", "--epochs", str(epochs), *args],
                         capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    # No destroy_process_group anywhere (Lightning leaves it to exit): still quiet.
    assert not [n for n in NOISE if n in out], out[-4000:]
    found = FINAL.findall(out)
    assert len(found) == 1, out[-4000:]
    steps, hook_steps = map(int, STEPS.search(out).groups())
    return found[0][0], steps, hook_steps, out


@pytest.fixture(scope="module")
def gloo_run():
    return lightning("--backend", "gloo")


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["none", "allreduce"])
def test_same_loss_as_gloo(hook, gloo_run):
    # The allreduce hook is DDP's own arithmetic: both are bitwise gloo's run.
    loss, steps, hook_steps, out = lightning("--hook", hook)
    assert loss == gloo_run[0] and steps == gloo_run[1] > 0, (loss, gloo_run[0], out[-2000:])
    assert hook_steps == steps


@pytest.mark.slow
def test_int8_hook_trains_and_resumes(gloo_run, tmp_path):
    options = ("--hook", "int8", "--hook-option", "error_feedback=true")
    loss, steps, hook_steps, out = lightning(*options)
    # The hook ran on every step (its own counter), and int8 with error feedback
    # ends close to the uncompressed run.
    assert hook_steps == steps == gloo_run[1], out[-2000:]
    assert abs(float(loss) - float(gloo_run[0])) < 0.05, (loss, gloo_run[0])

    # 1 epoch, checkpoint (every rank's residuals), resume for the 2nd: the same bits.
    ckpt = tmp_path / "run.ckpt"
    lightning(*options, "--checkpoint", str(ckpt), epochs=1)
    resumed, resumed_steps, resumed_hook_steps, out = lightning(*options, "--checkpoint", str(ckpt))
    assert "resumed_from=" in out
    assert (resumed, resumed_steps, resumed_hook_steps) == (loss, steps, hook_steps), out[-2000:]
