"""One rank of a world a test spawns itself (harness/spawned.py's ``Spawned``), not the
shared World harness.

    python spawned_rank.py MODULE SCENARIO RESULT_DIR

MODULE is the test file that defines SCENARIO, a function ``(rank, ws, store, dist, torch)``
returning a JSON-able dict; the test asserts on that dict. Environment: RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (a TCPStore hosted by the test process), plus scenario-specific
variables. The rank writes its result as JSON to RESULT_DIR/rank<R>.json (atomically) and
exits 0; on an unexpected exception it writes {"crash": traceback} and exits 1. Every
blocking call has a deadline; on SIGUSR1 the rank dumps its Python stacks to stderr (the
test does that before killing a hung rank).

Scenarios share ``init_group``, ``resources`` and ``error_record`` from here.
"""
from __future__ import annotations

import datetime
import faulthandler
import importlib
import json
import os
import signal
import sys
import threading
import traceback

STORE_TIMEOUT = datetime.timedelta(seconds=60)


def _die_with_parent() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def resources() -> dict:
    """Threads (native and Python), open fds and /dev/shm entries of this process."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    try:
        shm = sorted(os.listdir("/dev/shm"))
    except OSError:
        shm = []
    with open("/proc/self/maps") as f:
        shm_maps = sorted({line.split()[-1] for line in f if "/dev/shm/" in line})
    return {
        "native_threads": len(os.listdir("/proc/self/task")),
        "py_threads": threading.active_count(),
        "fds": len(fds),
        "fd_targets": sorted(fds),
        "shm": shm,
        "shm_maps": shm_maps,
    }


def error_record(e: BaseException) -> dict:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e)}


def init_group(rank, ws, store, dist):
    dist.init_process_group("ringdist", rank=rank, world_size=ws, store=store,
                            timeout=datetime.timedelta(seconds=30))


def main() -> int:
    module, scenario, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return 1
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path = os.path.join(outdir, f"rank{rank}.json")
    try:
        import torch
        import torch.distributed as dist
        import torch_ringdist  # noqa: F401  (registers the backend)

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ws,
                              False, timeout=STORE_TIMEOUT)
        run = getattr(importlib.import_module(module), scenario)
        result = run(rank, ws, store, dist, torch)
        result["pid"] = os.getpid()
        status = 0
    except BaseException:  # noqa: BLE001
        result = {"crash": traceback.format_exc(), "pid": os.getpid()}
        status = 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a wedged backend thread must not turn into a hang here.
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
