"""A dead rank ends every command users run, fast and loudly: each command below is started as a
user would start it, one of its ranks is SIGKILLed mid-run (or made to raise in its script's
code, through scenarios/dead_rank_fail_on_signal/sitecustomize.py), and the command must exit
non-zero, with the dead rank's error in its output, within DEADLINE_S of the death. The delay
measured is printed (`pytest -s`; RINGDIST_AUDIT_VERBOSE=1 adds when the other processes left)
and asserted.

The commands: the bench, benchmarks/compare.py (its sweeps under torchrun), the C++ example under
torchrun and under mpirun (SIGKILL only: it has no Python to raise in), and the Python examples
under torchrun or Lightning. The doctor (`python -m torch_ringdist`) starts no ranks, so it has
none to lose. The elastic examples (examples/elastic_*.py) go on after a lost rank by design
(tests/test_shrink.py, tests/test_elastic_diloco.py).
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import pytest

from harness.procs import Launched, cmdline, descendants, free_port, tail, torchrun_cmd

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FAIL_ON_SIGNAL = os.path.join(HERE, "scenarios", "dead_rank_fail_on_signal")
EXAMPLES = os.path.join(REPO, "examples")
# From the death to the command's exit. Not 1 s: the figures are dominated by process exits
# (a launcher, a Python interpreter that imported torch), which a busy 2-core machine slows many
# times. Measured at load 5-9 (docs/failures-and-security.md): 0.35-2.3 s, the ranks gone after
# 0.02-0.5 s, torchrun's own exit about 1 s of it; at load 16-19, before the failed rank skipped
# Python's last garbage collections, 7-9 s after a raise, and 17-27 s before the atexit abort.
DEADLINE_S = 10.0
# What each way of dying leaves in the output: the signal, or the rank's own exception.
# A launcher names the signal; a rank that lost a peer names that rank (the victim is rank 1).
SHOWN = {"kill": re.compile(r"SIGKILL|[Ss]ignal 9|exit(ed with)? ?code:? ?-9|rank 1 [^\n]*(died|is dead)"),
         "raise": re.compile(r"INJECTED FAILURE: this rank raised")}

# name: (command line, made when run (torchrun's takes a free port) from a scratch folder and the
# C++ example's program; output after which the ranks are at work (SETTLE_S later where the
# command prints nothing while it works))
COMMANDS = {
    "bench": (lambda **_: [sys.executable, "-m", "torch_ringdist.bench", "--sizes", "16M",
                           "--rounds", "50"], None),
    "compare": (lambda scratch, **_: [sys.executable, os.path.join(REPO, "benchmarks", "compare.py"),
                                      "--rounds", "50", "--max-bytes", "64K",
                                      "--out", os.path.join(scratch, "compare.json")], None),
    "cpp_torchrun": (lambda program, **_: torchrun_cmd(2, program, "--steps", "100000000",
                                                       options=("--no-python",)), r"step +0 "),
    "cpp_mpirun": (lambda program, **_: [MPIRUN, "--allow-run-as-root", "-n", "2", program,
                                         "--steps", "100000000"], r"step +0 "),
    "train_ddp": (lambda **_: torchrun_cmd(2, os.path.join(EXAMPLES, "train_ddp.py"),
                                           "--no-progress", "--epochs", "100000"), r"epoch 1:"),
    "fsdp2_train": (lambda **_: torchrun_cmd(2, os.path.join(EXAMPLES, "fsdp2_train.py"),
                                             "--steps", "100000"), r"step 2 loss"),
    "tp_inference": (lambda **_: torchrun_cmd(2, os.path.join(EXAMPLES, "tp_inference.py"),
                                              "--repeat", "100000", "--tokens", "64"), None),
    "lightning_train": (lambda **_: [sys.executable, os.path.join(EXAMPLES, "lightning_train.py"),
                                     "--devices", "2", "--epochs", "100000"], r"Starting with 2"),
}
# The ranks' first operations after the line (or, without one, after the victim started).
SETTLE_S = {"bench": 6.0, "compare": 6.0, "tp_inference": 6.0, "lightning_train": 3.0}
MPIRUN = shutil.which("mpirun")


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    except OSError:
        return {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _catches_sigusr2(pid):
    """Has the process installed a SIGUSR2 handler (the scenario's, once Python started)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1)


def _victim(top, catching=False):
    """The process of rank 1 below `top` (torchrun's workers, Lightning's children and mpirun's
    ranks say so in their environment), else the last rank torch.multiprocessing spawned; with `catching`, only
    once it catches SIGUSR2."""
    spawned, rank1 = [], None
    for pid in descendants(top):
        env = _environ(pid)
        if "1" in (env.get("RANK", env.get("LOCAL_RANK")), env.get("OMPI_COMM_WORLD_RANK")):
            rank1 = pid
            break
        command = cmdline(pid)
        if "spawn_main" in command and "resource_tracker" not in command:
            spawned.append(pid)
    rank1 = rank1 or (max(spawned) if spawned else None)
    return rank1 if rank1 and (not catching or _catches_sigusr2(rank1)) else None


def _raised_at(path):
    """When the signalled rank raised (time.monotonic), or None if none has yet."""
    try:
        with open(path) as f:
            return float(f.read())
    except FileNotFoundError:
        return None


def _make_die(name, how, top, deadline, raised_file):
    """Kills rank 1 (`kill`), or makes it raise, sending SIGUSR2 to the rank 1 of the moment
    until one raises (a command may start fresh ranks, as the bench does per round, and a rank
    raises only at work); (the moment it died, the other processes then)."""
    ranks = []
    while True:
        # The handler runs once the main thread is back in Python: perhaps after the next send.
        if how == "raise" and _raised_at(raised_file) is not None:
            return _raised_at(raised_file), ranks
        assert top.poll() is None, f"{name} ended before a rank could die"
        assert time.monotonic() < deadline, f"{name}: rank 1 did not die in time"
        victim = _victim(top.pid, catching=how == "raise")
        if victim is None:  # between rounds, or not yet catching the signal
            time.sleep(0.01)
            continue
        ranks = descendants(top.pid)
        sent = time.monotonic()
        try:
            os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGUSR2)
        except ProcessLookupError:
            continue
        if how == "kill":
            return sent, ranks
        while time.monotonic() < sent + 0.5 and _raised_at(raised_file) is None:
            time.sleep(0.005)


def audit(name, how, program=None, timeout=180):
    """Runs COMMANDS[name] (`program`: the C++ example's), makes one rank die (`kill`: SIGKILL,
    `raise`: an exception) once the ranks work; (seconds from the death to the command's exit,
    exit code, output)."""
    with tempfile.TemporaryDirectory(prefix=f"dead_rank_{name}_") as scratch:
        return _audit(name, how, program, timeout, scratch)


def _audit(name, how, program, timeout, scratch):
    make_cmd, ready = COMMANDS[name]
    cmd = make_cmd(scratch=scratch, program=program)
    log = os.path.join(scratch, "output.log")
    raised_file = os.path.join(scratch, "raised")
    # MASTER_*: where mpirun's ranks meet (torchrun and Lightning set their own).
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               RINGDIST_TEST_RAISED_FILE=raised_file, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (FAIL_ON_SIGNAL, env.get("PYTHONPATH")) if p)
    with Launched([cmd], [env], cwd=REPO, logs=[log]) as run:
        top, deadline = run.procs[0], time.monotonic() + timeout
        victim, since = None, None
        while since is None or time.monotonic() - since < SETTLE_S.get(name, 0.0):
            assert top.poll() is None, f"{name} ended before a rank could die:\n{tail(log)}"
            assert time.monotonic() < deadline, f"{name}: no rank at work in {timeout} s:\n{tail(log)}"
            victim = victim or _victim(top.pid)
            if since is None and victim and (ready is None or re.search(ready, tail(log, 20000))):
                since = time.monotonic()
            time.sleep(0.05)
        died, ranks = _make_die(name, how, top, deadline, raised_file)
        gone = {}
        while top.poll() is None and time.monotonic() < died + 60:
            gone.update((pid, time.monotonic() - died) for pid in ranks
                        if pid not in gone and not _running(pid))
            time.sleep(0.005)
        seconds = time.monotonic() - died
        if os.environ.get("RINGDIST_AUDIT_VERBOSE"):
            print(f"{name} {how}: its processes gone after {sorted(gone.values())}, "
                  f"command after {seconds:.2f} s", flush=True)
        left = [pid for pid in descendants(top.pid)]
        code = top.poll()
    out = tail(log, 20000)
    assert not left, f"{name}: processes left after the command exited: {left}"
    return seconds, code, out


# The C++ example has no Python to raise in; SIGUSR2 would kill it as SIGKILL does.
CASES = [(name, how) for name in sorted(COMMANDS) for how in ("kill", "raise")
         if not (name.startswith("cpp") and how == "raise")]


@pytest.mark.slow
@pytest.mark.parametrize("name,how", CASES)
def test_dead_rank_ends_the_command(name, how, request):
    if name == "cpp_mpirun" and MPIRUN is None:
        pytest.skip("mpirun is not installed (benchmarks/setup_mpi.sh)")
    program = request.getfixturevalue("cpp_example") if name.startswith("cpp") else None
    seconds, code, out = audit(name, how, program)
    print(f"\n{name} {how}: exit code {code} {seconds:.2f} s after the death")
    assert code not in (0, None), f"{name} {how}: exit code {code} after {seconds:.1f} s\n{out[-4000:]}"
    assert SHOWN[how].search(out), f"{name} {how}: the dead rank's error is not shown\n{out[-4000:]}"
    assert seconds < DEADLINE_S, f"{name} {how}: {seconds:.2f} s from the death to the exit"


if __name__ == "__main__":  # the audit by hand: python tests/test_dead_rank.py [name ...]
    for name, how in CASES:
        if name in (sys.argv[1:] or COMMANDS):
            # The C++ example as tests/conftest.py's cpp_example builds it.
            program = os.path.join(REPO, "build", "teardown-example", "ringdist_train")
            seconds, code, out = audit(name, how, program)
            shown = bool(SHOWN[how].search(out))
            print(f"{name:16} {how:6} exit {code!s:5} {seconds:6.2f} s  error shown: {shown}",
                  flush=True)
