"""examples/tp_inference.py under torchrun at N=2: tensor-parallel greedy generation through
torch's tensor-parallel API (DTensor over a DeviceMesh of ringdist) and through the direct
operators; the tokens equal a one-process run of the same model (rank 0 checks)."""
import os
import re

import pytest

from harness.procs import torchrun_output

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "tp_inference.py")


@pytest.mark.parametrize("mode", ["dtensor", "direct"])
def test_tensor_parallel_tokens_equal_one_process(mode):
    args = ["--tokens", "12", "--layers", "2", "--repeat", "1", "--mode", mode]
    out = torchrun_output(EXAMPLE, *args, nproc=2, timeout=240, cwd=REPO)
    assert "tokens equal the one-process run" in out, out[-3000:]
    tokens = re.search(rf"mode {mode}, ringdist, 2 ranks, float64: tokens: \[([0-9, ]+)\]", out)
    assert tokens and len(tokens.group(1).split(",")) == 12, out[-3000:]


@pytest.mark.slow
def test_timing_modes_run_the_same_shards():
    """--mode no-comm and --mode spin-barrier (the bounds the benchmark measures against) run
    the same shards with every collective skipped or replaced by a wait: the same (wrong)
    tokens, and neither hangs."""
    found = {}
    for mode in ("no-comm", "spin-barrier"):
        args = ["--tokens", "6", "--layers", "2", "--repeat", "1", "--mode", mode]
        out = torchrun_output(EXAMPLE, *args, nproc=2, timeout=240, cwd=REPO)
        tokens = re.search(rf"mode {mode}, ringdist, 2 ranks, float64: tokens: \[([0-9, ]+)\]", out)
        assert tokens, out[-3000:]
        found[mode] = tokens.group(1)
    assert found["no-comm"] == found["spin-barrier"], found
