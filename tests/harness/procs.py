"""Child processes of the tests: one free_port() and one launcher for every caller.

``Launched`` starts processes (the ranks of a world, a torchrun, a fuzz target), each
with its own environment and in a session of its own, with their output in log files
or in pipes. No wait is without a deadline, and ``kill()`` SIGKILLs each process
together with everything it started (torchrun's workers sit in sessions of their
own), so a test never hangs and leaves nothing running. ``world_envs()`` gives the
environments of a torch.distributed world's ranks; ``launch()`` runs a world of
scenarios/shm.py ranks for tests that need per-rank environments or expect
ranks to die, which the cached World harness (world.py) does not do.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(TESTS, "scenarios", "shm.py")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range: the kernel hands
    ephemeral ports to every outgoing connection and bind(0) on the machine, so one of those
    could take the port before the test's store binds it; a port below the range is taken only
    by a process that asks for it by number."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    low = max(1024, ephemeral_low - 12000)
    for _ in range(100):
        port = random.randrange(low, ephemeral_low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {low}..{ephemeral_low - 1}")


def port_clash(returncode: int, output: str) -> bool:
    """Did a launcher fail because the free port was taken between probe and bind (retry)?"""
    return returncode != 0 and "address already in use" in output.lower()


def world_envs(world_size: int, master_port: int, env: dict | None = None,
               rank_envs: list | None = None) -> list[dict]:
    """The environment of each rank of a world whose store is at 127.0.0.1:master_port.

    This process's environment and import path (so children import the same
    torch_ringdist), the world's variables, then ``env`` for every rank and
    ``rank_envs[r]`` for rank r only; values may be any type (they are str()-ed).
    """
    base = dict(os.environ)
    base.update({
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world_size),
        "PYTHONPATH": os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)]
                                      + [base.get("PYTHONPATH", "")]),
    })
    base.update({k: str(v) for k, v in (env or {}).items()})
    envs = []
    for rank in range(world_size):
        e = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        e.update({k: str(v) for k, v in (rank_envs[rank] if rank_envs else {}).items()})
        envs.append(e)
    return envs


def torchrun_cmd(nproc: int, script: str, *args, options=()) -> list[str]:
    """A torchrun command line for ``script args`` on a fresh free port (``options``:
    further torchrun options)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            *options, "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            script, *map(str, args)]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def cmdline(pid) -> str:
    """The command line of process `pid`, words joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tail(path, nbytes: int = 6000) -> str:
    """The last ``nbytes`` of a log file, marked when truncated."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            data = f.read().decode("utf-8", "replace")
        return ("...[truncated]...\n" if size > nbytes else "") + data
    except OSError as e:
        return f"<log unreadable: {e}>"


class Launched:
    """Processes started together: ``cmds[i]`` with ``envs[i]``, each in its own session.

    Output: ``logs[i]`` (a file path: stdout and stderr together), or else text pipes
    that :meth:`communicate` reads (stderr apart unless ``merge_stderr``). As a context
    manager, leaving the block kills whatever still runs.
    """

    def __init__(self, cmds, envs, *, cwd=None, logs=None, merge_stderr=False):
        self.procs: list[subprocess.Popen] = []
        self.timed_out = False
        try:
            for i, (cmd, env) in enumerate(zip(cmds, envs)):
                common = dict(env=env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
                if logs is not None:
                    with open(logs[i], "wb") as log:
                        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                           **common))
                else:
                    self.procs.append(subprocess.Popen(
                        cmd, stdout=subprocess.PIPE, text=True,
                        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, **common))
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self, i: int) -> bool:
        return self.procs[i].poll() is None

    def wait(self, timeout: float) -> bool:
        """Waits until every process exited or the deadline passed; True if all exited."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def communicate(self, timeout: float) -> list[tuple]:
        """[(returncode, stdout, stderr)] by process (pipes only; stderr None if merged).

        Past the deadline (each process gets at least 1 s more to be read) everything
        is killed, ``timed_out`` is set and the output read so far is returned.
        """
        deadline = time.monotonic() + timeout
        results = []
        for p in self.procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.timed_out = True
                self.kill()
                try:
                    out, err = p.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    out, err = "", ""
            results.append((p.returncode, out, err))
        return results

    def signal_stacks(self, which=None) -> None:
        """Asks the live processes among ``which`` (all if None) to dump their Python stacks
        (SIGUSR1 with faulthandler registered) into their logs, and gives them 0.5 s."""
        for i in range(len(self.procs)) if which is None else which:
            if i < len(self.procs) and self.alive(i):
                try:
                    os.kill(self.procs[i].pid, signal.SIGUSR1)
                except OSError:
                    pass
        time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILLs every live process with all it started, then reaps them (bounded)."""
        for p in self.procs:
            if p.poll() is None:
                for pid in descendants(p.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def torchrun_output(script: str, *args, nproc: int = 2, timeout: float = 120, attempts: int = 3,
                    cwd=None, check: bool = True, env: dict | None = None) -> str:
    """Run ``script args`` under torchrun as a user would (with `env` added to the
    environment); its combined output. Fails the test on a timeout or (check) a non-zero exit;
    retries when the port was taken. Never hangs."""
    import pytest

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    out = ""
    for _ in range(attempts):
        cmd = torchrun_cmd(nproc, script, *args)
        with Launched([cmd], [env], cwd=cwd, merge_stderr=True) as run:
            [(returncode, out, _)] = run.communicate(timeout)
        if run.timed_out:
            pytest.fail(f"torchrun timed out after {timeout}s: {' '.join(cmd)}\n{out[-6000:]}")
        if port_clash(returncode, out):
            continue
        assert returncode == 0 or not check, f"exit code {returncode}: {' '.join(cmd)}\n{out[-6000:]}"
        return out
    pytest.fail(f"no free port after {attempts} attempts\n{out[-3000:]}")


def launch(world, mode, env=None, rank_env=None, timeout=120):
    """Runs `world` ranks of scenarios/shm.py in `mode`; `env` applies to every rank,
    rank_env[r] to rank r only. Returns [(returncode, stdout, stderr)] by rank; never hangs."""
    with Launched([[sys.executable, "-P", WORKER, mode]] * world,
                  world_envs(world, free_port(), env, rank_env)) as ranks:
        results = ranks.communicate(timeout)
    if ranks.timed_out:
        raise TimeoutError(f"scenarios/shm.py {mode}: the world of {world} did not finish within "
                           f"{timeout}s (killed)\n" + "\n".join(
                               f"--- rank {r} ---\n{out[-2000:]}\n{err[-2000:]}"
                               for r, (_, out, err) in enumerate(results)))
    return results


def field(out, key):
    """The value of the first stdout line "KEY value", or None."""
    for line in out.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1:]
    return None
