"""A ringdist rank for tests/test_shm.py and tests/test_crc.py (harness/procs.py's launch()),
launched with RANK/WORLD_SIZE/MASTER_* set (SCENARIO_INIT_TIMEOUT: seconds init may take, 60).

Modes (argv[1]):
  run      a few allreduces, prints the transports and "DONE"
  crash    loops large allreduces; rank 1 SIGKILLs itself in the middle;
           survivors print "ERROR <seconds> <message>"
  many     20 allreduces of mixed sizes with a check, for oversubscribed worlds
  until_error  allreduces until one raises; prints "ERROR <message>"
"""
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("ringdist", timeout=timedelta(
        seconds=float(os.environ.get("SCENARIO_INIT_TIMEOUT", "60"))))
    pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    print("TRANSPORTS", ",".join(pg.transports), flush=True)
    print("SHM_DURING", len([n for n in os.listdir("/dev/shm") if n.startswith("ringdist")]),
          flush=True)
    if mode == "run":
        for n in [1, 1000, 1 << 20]:
            t = torch.full((n,), float(rank + 1))
            dist.all_reduce(t)
            assert torch.all(t == world * (world + 1) / 2), t[:4]
    elif mode == "many":
        for i in range(20):
            n = [3, 4097, 1 << 18][i % 3]
            t = torch.full((n,), float(rank + i))
            dist.all_reduce(t)
            expected = sum(r + i for r in range(world))
            assert torch.all(t == expected), (i, t[:4], expected)
    elif mode == "until_error":
        # Large and small allreduces until one fails (the caller injects a fault).
        for i in range(200):
            t = torch.full(((1 << 16) if i % 2 else 3,), float(rank))
            try:
                dist.all_reduce(t)
            except Exception as exc:  # noqa: BLE001 - the error is the result
                print("ERROR", str(exc).replace("\n", " "), flush=True)
                os._exit(0)
        print("NO ERROR", flush=True)
        os._exit(1)
    elif mode == "crash":
        t = torch.ones(8 << 20)  # 32 MiB: the kill lands mid-transfer
        dist.all_reduce(t)
        if rank == 1:
            threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        start = time.monotonic()
        try:
            for _ in range(1000):
                dist.all_reduce(t)
        except Exception as exc:  # noqa: BLE001 - the error is the result
            print("ERROR %.3f %s" % (time.monotonic() - start, str(exc).replace("\n", " ")),
                  flush=True)
            os._exit(0)
        print("NO ERROR", flush=True)
        os._exit(1)
    dist.destroy_process_group()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
