"""dist.shrink_group cases on ranks started here (this process hosts the store, so any rank
may die). Usage: shrink_cases.py CASE; prints one JSON line {rank: result} (killed ranks
absent). Every wait has a deadline."""
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _init(rank, size, port):
    import torch_ringdist  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=30))


def _sum_check():
    """An allreduce on the current default group, against its closed form."""
    n = dist.get_world_size()
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return bool(torch.all(t == n * (n + 1) / 2))


def death_during_shrink(rank, size, port):
    """Rank 3 dies; then rank 2 dies after agreeing but before connecting: the shrink of ranks
    0 and 1 must fail within RINGDIST_SHRINK_TIMEOUT, naming the problem."""
    import torch_ringdist

    _init(rank, size, port)
    _sum_check()
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        _sum_check()
        _sum_check()
        return {"error": None}
    except dist.DistBackendError:
        pass
    lost = torch_ringdist.lost_ranks(wait=0.5)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.shrink_group(lost)
        return {"lost": lost, "error": None}
    except Exception as e:  # noqa: BLE001 (reported to the test)
        return {"lost": lost, "error": f"{type(e).__name__}: {e}"[:600],
                "seconds": time.monotonic() - start}


def abort_healthy(rank, size, port):
    """All alive; ranks 0 and 1 drop rank 2 with SHRINK_ABORT. The survivors get a working
    group at once (no wait for rank 2 at teardown), subgroups made before are gone, and rank 2,
    still using the old group, gets an error instead of a hang."""
    _init(rank, size, port)
    sub = dist.new_group([0, 1])
    old_transports = dist.group.WORLD._get_backend(torch.device("cpu")).transports
    _sum_check()
    if rank == 2:
        start = time.monotonic()
        try:
            time.sleep(1.0)  # the others shrink meanwhile
            _sum_check()
            return {"error": None}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"[:300], "seconds": time.monotonic() - start}
    start = time.monotonic()
    dist.shrink_group([2], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    seconds = time.monotonic() - start
    new = dist.group.WORLD._get_backend(torch.device("cpu"))
    try:
        dist.all_reduce(torch.ones(1), group=sub)
        subgroup = "usable"
    except Exception as e:  # noqa: BLE001
        subgroup = type(e).__name__
    return {"seconds": seconds, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "sum_ok": _sum_check(), "backend": dist.get_backend(),
            "transports": new.transports, "old_transports": old_transports[:2],
            "subgroup": subgroup}


CASES = {"death_during_shrink": (death_during_shrink, 4), "abort_healthy": (abort_healthy, 3)}


def _run(rank, case, port, results):
    fn, size = CASES[case]
    try:
        out = fn(rank, size, port)
    except Exception as e:  # noqa: BLE001
        out = {"unexpected": f"{type(e).__name__}: {e}"[:600]}
    results.put((rank, out))
    results.close()
    results.join_thread()  # flushed before the hard exit
    os._exit(0)  # no teardown: the old groups are broken on purpose


if __name__ == "__main__":
    case = sys.argv[1]
    size = CASES[case][1]
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(r, case, store.port, results)) for r in range(size)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + 120
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.05)
    while not results.empty():
        rank, out = results.get()
        got[rank] = out
    for p in procs:
        if p.is_alive():
            p.kill()
    print(json.dumps(got), flush=True)
