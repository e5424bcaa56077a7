"""One rank of a group of one rank per emulated WAN host (tests/test_wan_emulator.py):
rank = WAN_HOST, store on host 0 (port argv[1]), signals in the folder argv[2]. After a few
correct 1 MiB allreduces every rank passes a barrier, rank 0 creates `ready`, and every rank
waits for `go` (the test then cuts the last host off: its links drop every packet, no reset
reaches anyone). Then one more allreduce with a process-group timeout of TIMEOUT_S; prints one
JSON line: whether it failed, how, and after how long."""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ringdist  # noqa: F401  (registers the backend)
from wan_signals import await_link_change

TIMEOUT_S = 8
COUNT = 1 << 18  # 1 MiB of float32

rank, world = int(os.environ["WAN_HOST"]), int(os.environ["WAN_HOSTS"])
os.environ.update(MASTER_ADDR=os.environ["WAN_ADDRS"].split(",")[0], MASTER_PORT=sys.argv[1])
signals = sys.argv[2]
dist.init_process_group("ringdist", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=TIMEOUT_S))
wrong = 0
for _ in range(4):
    t = torch.full((COUNT,), float(rank + 1))
    dist.all_reduce(t)
    wrong += int((t != world * (world + 1) / 2).sum())
await_link_change(signals, rank)
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(COUNT))
    error = None
except Exception as exc:  # noqa: BLE001 - the error is the result
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"rank": rank, "wrong": wrong, "error": error,
                  "seconds": round(time.monotonic() - start, 2)}), flush=True)
os._exit(0)  # the group is broken: skip destroy_process_group, which would wait for peers
