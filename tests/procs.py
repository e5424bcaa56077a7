"""Launching a world of plain processes (one per rank) for tests that need per-rank
environments or expect ranks to die, which the cached World harness does not do."""
import os
import socket
import subprocess
import sys

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "shm_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, mode, env=None, rank_env=None, timeout=120):
    """Starts `world` ranks of scripts/shm_worker.py in `mode`; `env` applies to every rank,
    rank_env[r] to rank r only. Returns [(returncode, stdout, stderr)] by rank; never hangs."""
    port = free_port()
    procs = []
    for rank in range(world):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                    **(env or {}), **((rank_env or [{}] * world)[rank]))
        procs.append(subprocess.Popen([sys.executable, "-P", WORKER, mode], env=penv,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


def field(out, key):
    """The value of the first stdout line "KEY value", or None."""
    for line in out.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1:]
    return None
