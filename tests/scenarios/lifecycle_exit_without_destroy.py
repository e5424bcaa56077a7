"""Ranks launched by torch.multiprocessing.spawn that never call destroy_process_group;
rank 0 hosts the store and exits first (tests/test_lifecycle.py). Usage:
lifecycle_exit_without_destroy.py WORLD_SIZE PORT. Prints "done" from the parent; everything
else on stdout/stderr is noise."""
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, ws, port):
    import torch_ringdist  # noqa: F401  (registers the backend)

    dist.init_process_group("ringdist", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ws)
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True)  # left in flight: never waited for
    if rank != 0:
        time.sleep(0.3)


if __name__ == "__main__":
    ws, port = int(sys.argv[1]), int(sys.argv[2])
    mp.spawn(run, args=(ws, port), nprocs=ws)
    print("done")
