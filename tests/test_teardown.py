"""Teardown is silent in every launch style: torchrun, torch.multiprocessing.spawn, a plain env://
launch where rank 0's process hosts the store, and Open MPI's mpirun, in Python; the C++ example
(examples/cpp) under a plain env:// launch and under mpirun. Each style runs
RINGDIST_TEARDOWN_RUNS times (3 in the suite; the release check runs 20) and no run may print a
stack trace or a store error. A rank whose peer already failed exits within 1 s; a rank that
leaves while its peer waits in an operation with it fails that operation at once."""
import os
import re
import shutil
import sys

import pytest

from harness.procs import Launched, free_port, torchrun_cmd, world_envs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "scenarios", "teardown.py")
MPIRUN = shutil.which("mpirun")
# One host, root allowed (containers run as root), more ranks than cores allowed.
MPIRUN_ARGS = ["--allow-run-as-root", "--oversubscribe", "-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
# The C++ example's run: a few steps (a teardown test, not a training).
CPP_ARGS = ["--steps", "5"]
RUNS = int(os.environ.get("RINGDIST_TEARDOWN_RUNS", "3"))
# Three ranks: with two, the last rank out is always rank 0's only peer, which hides a race.
RANKS = 3
# What noise looks like: a Python or C++ stack trace, or TCPStore complaining of a lost server.
NOISE = re.compile(r"Traceback|frame #\d|recvValue failed|Connection was likely closed|"
                   r"terminate called")
STYLES = ["torchrun", "spawn", "plain", "mpirun", "cpp-plain", "cpp-mpirun"]

pytestmark = pytest.mark.slow


def _launch(style, program=None):
    """One run in that launch style: [(returncode, output)] by process. `program`: the C++
    example for the cpp- styles."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if style == "torchrun":
        cmds, envs = [torchrun_cmd(RANKS, SCRIPT, "env")], [env]
    elif style == "spawn":
        cmds = [[sys.executable, SCRIPT, "spawn"]]
        envs = [dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))]
    elif style == "plain":  # a process per rank, rank 0 hosts the store
        cmds, envs = [[sys.executable, SCRIPT, "env"]] * RANKS, world_envs(RANKS, free_port())
    elif style == "mpirun":  # Open MPI's variables give the ranks; rank 0 hosts the store
        cmds = [[MPIRUN, *MPIRUN_ARGS, "-n", str(RANKS), sys.executable, SCRIPT, "mpi"]]
        envs = [{k: v for k, v in world_envs(RANKS, free_port())[0].items()
                 if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}]
    elif style == "cpp-plain":  # the C++ example's third launch line (docs/cpp.md)
        cmds, envs = [[program, *CPP_ARGS]] * RANKS, world_envs(RANKS, free_port())
    else:  # cpp-mpirun: torch_ringdist::init() reads Open MPI's variables
        cmds = [[MPIRUN, *MPIRUN_ARGS, "-n", str(RANKS), program, *CPP_ARGS]]
        envs = [dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))]
    with Launched(cmds, envs, merge_stderr=True) as run:
        results = run.communicate(120)
    assert not run.timed_out, f"{style} run timed out:\n" + "\n".join(out for _, out, _ in results)
    return [(code, out) for code, out, _ in results]


@pytest.mark.parametrize("style", STYLES)
def test_teardown_is_silent(style, request):
    if "mpirun" in style and MPIRUN is None:
        pytest.skip("mpirun is not installed (benchmarks/setup_mpi.sh)")
    program = request.getfixturevalue("cpp_example") if style.startswith("cpp") else None
    noisy = []
    for run in range(RUNS):
        outputs = _launch(style, program)
        for code, out in outputs:
            assert code == 0, f"{style} run {run}: exit code {code}\n{out[-3000:]}"
        if any(NOISE.search(out) for _, out in outputs):
            noisy.append(f"--- run {run} ---\n" + "\n".join(out[-3000:] for _, out in outputs))
    print(f"\n{style}: {len(noisy)} noisy runs of {RUNS}")
    assert not noisy, f"{len(noisy)} of {RUNS} {style} runs were noisy:\n" + "\n".join(noisy[:2])


def test_rank_exits_within_a_second_of_its_peer_failing():
    (code0, out0), (code1, _) = [(c, o) for c, o, _ in _run_failed()]
    assert code1 == 3 and code0 == 0, out0[-3000:]
    seconds = float(re.search(r"EXIT_AFTER_FAILURE (\S+)", out0).group(1))
    assert seconds < 1.0, f"rank 0 took {seconds:.2f} s to exit after its peer failed"


@pytest.mark.parametrize("link", ["shm", "tcp"])
def test_leaving_rank_fails_the_op_its_peer_waits_in(link):
    # shm: the peer's header is on the board; tcp (two emulated hosts): it is on the link.
    env = {"RINGDIST_HOST_ID": "h0,h1"} if link == "tcp" else {}
    with Launched([[sys.executable, SCRIPT, "left"]] * 2,
                  [dict(e, **env) for e in world_envs(2, free_port())], merge_stderr=True) as run:
        results = run.communicate(120)
    (code0, out0, _), (code1, out1, _) = results
    assert not run.timed_out and code0 == 0 and code1 == 3, f"{out0[-3000:]}\n{out1[-3000:]}"
    left = float(re.search(r"LEFT (\S+)", out1).group(1))
    failed = float(re.search(r"FAILED (\S+)", out0).group(1))
    exited = float(re.search(r"EXITED (\S+)", out1).group(1))
    print(f"\n{link}: allreduce failed {failed - left:.3f} s, rank 1 exited {exited - left:.3f} s "
          f"after rank 1 left")
    # Before, rank 1 waited for rank 0's goodbye until the teardown deadline (10 s).
    assert failed - left < 2.0 and exited - left < 2.0, (
        f"rank 0's allreduce failed {failed - left:.2f} s and rank 1 exited {exited - left:.2f} s "
        f"after rank 1 left\n{out0[-3000:]}\n{out1[-3000:]}")
    assert "rank 1" in out0[out0.index("FAILED"):], out0[-3000:]  # the error names who left
    assert "leaving while rank 0 waits in its allreduce" in out1, out1[-3000:]


def _run_failed():
    with Launched([[sys.executable, SCRIPT, "failed"]] * 2, world_envs(2, free_port()),
                  merge_stderr=True) as run:
        results = run.communicate(120)
    assert not run.timed_out, "\n".join(out for _, out, _ in results)
    return results
