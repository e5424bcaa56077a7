"""One rank of a group of one rank per emulated WAN host (tests/test_cross_host_routes.py):
rank = WAN_HOST, store on host 0 (port argv[1]). It runs 2 * kRateAgreeEvery allreduces of
1 MiB, checking each against its closed form, and prints one JSON line: the link rate and round
trip the group agreed after each round of samples and the route 1 MiB then takes.

With a folder as argv[2], the links change before the call that agrees on the first round's
samples (the kRateAgreeEvery-th sampled call agrees first, then is timed itself, for the next
round): every rank passes a barrier, rank 0 creates `ready` there, and every rank waits for
`go` (the test creates it once it has changed the links)."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import torch_ringdist  # noqa: F401  (registers the backend)
from wan_signals import await_link_change

AGREE_EVERY = 32  # kRateAgreeEvery
COUNT = 1 << 18   # 1 MiB of float32

rank, world = int(os.environ["WAN_HOST"]), int(os.environ["WAN_HOSTS"])
os.environ.update(MASTER_ADDR=os.environ["WAN_ADDRS"].split(",")[0], MASTER_PORT=sys.argv[1])
dist.init_process_group("ringdist", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
signals = sys.argv[2] if len(sys.argv) > 2 else None
agreed, round_trips, routes, wrong = [], [], [], 0
for call in range(2 * AGREE_EVERY + 1):
    if call % AGREE_EVERY == 0:  # before the call that agrees
        route = backend.allreduce_route(COUNT * 4)
        agreed.append(float(route["link_bits_per_s"]))
        round_trips.append(int(route["round_trip_us"]))
        routes.append(route["route"])
    if call == AGREE_EVERY - 1 and signals:
        await_link_change(signals, rank)
    t = torch.full((COUNT,), float(rank + 1))
    dist.all_reduce(t)
    wrong += int((t != world * (world + 1) / 2).sum())
print(json.dumps({"rank": rank, "agreed": agreed, "round_trips_us": round_trips, "routes": routes,
                  "wrong": wrong}), flush=True)
dist.destroy_process_group()
