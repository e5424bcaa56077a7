"""The hand-shake by which a scenario on emulated WAN hosts lets its test change the links at a
point of the scenario's choosing (the test's `Wan.run(during=...)` watches the folder)."""
import os
import sys
import time

import torch.distributed as dist


def await_link_change(signals: str, rank: int, limit_s: float = 60) -> None:
    """Every rank passes a barrier, rank 0 creates `ready` in the folder `signals`, and every
    rank waits until the test created `go` there (after changing the links)."""
    dist.barrier()
    if rank == 0:
        open(os.path.join(signals, "ready"), "w").close()
    deadline = time.monotonic() + limit_s
    while not os.path.exists(os.path.join(signals, "go")):
        if time.monotonic() > deadline:
            sys.exit(f"the links were not changed within {limit_s:g} s")
        time.sleep(0.02)
