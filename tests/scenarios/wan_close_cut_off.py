"""One rank of a group of one rank per emulated WAN host (tests/test_wan_emulator.py):
rank = WAN_HOST, store on host 0 (port argv[1]), signals in the folder argv[2]. After a few
correct 1 MiB allreduces every rank passes a barrier, rank 0 creates `ready`, and every rank
waits for `go` (the test then cuts the last host off: its links drop every packet, no reset
reaches anyone). Then every rank destroys the group, the orderly way, with no operation between;
prints one JSON line: how long destroy_process_group took and whether it raised."""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ringdist  # noqa: F401  (registers the backend)
from wan_signals import await_link_change

COUNT = 1 << 18  # 1 MiB of float32

rank, world = int(os.environ["WAN_HOST"]), int(os.environ["WAN_HOSTS"])
os.environ.update(MASTER_ADDR=os.environ["WAN_ADDRS"].split(",")[0], MASTER_PORT=sys.argv[1])
dist.init_process_group("ringdist", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
wrong = 0
for _ in range(4):
    t = torch.full((COUNT,), float(rank + 1))
    dist.all_reduce(t)
    wrong += int((t != world * (world + 1) / 2).sum())
await_link_change(sys.argv[2], rank)
start = time.monotonic()
try:
    dist.destroy_process_group()
    error = None
except Exception as exc:  # noqa: BLE001 - the error is the result
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"rank": rank, "wrong": wrong, "error": error,
                  "seconds": round(time.monotonic() - start, 2)}), flush=True)
os._exit(0)  # the store's client on the cut-off host would wait on its socket at exit
