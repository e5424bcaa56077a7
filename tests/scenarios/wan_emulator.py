"""One rank of a two-rank ringdist allreduce between two emulated WAN hosts
(tests/test_wan_emulator.py): rank = WAN_HOST, store on host 0, the round trip argv[2] seconds.
Exits 0 when the link reports the round trip it was given (the kernel's min_rtt, which sizes
the ring's data in flight) and the float64 sum of the ring (the two-rank one-round path is
turned off) equals the reference computed here from both ranks' inputs (two addends: exact in
any order)."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import torch_ringdist  # noqa: F401  (registers the backend)

COUNT = 65536 + 3  # several segments, and not a multiple of the world size


def data(rank):
    return torch.randn(COUNT, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + rank))


rank = int(os.environ["WAN_HOST"])
os.environ.update(MASTER_ADDR=os.environ["WAN_ADDRS"].split(",")[0], MASTER_PORT=sys.argv[1],
                  RINGDIST_PAIR_ALLREDUCE_BYTES="0")
dist.init_process_group("ringdist", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
rtt_us = int(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
             .links[1 - rank]["round_trip_us"])
rtt_ok = 0.97 <= rtt_us / (float(sys.argv[2]) * 1e6) <= 1.2  # the line adds a little
print(f"rank {rank}: the link measured a round trip of {rtt_us} us", flush=True)
t = data(rank).clone()
dist.all_reduce(t)
ok = torch.equal(t, data(0) + data(1)) and rtt_ok
print(f"rank {rank}: allreduce {'matches' if ok else 'DIFFERS FROM'} the float64 reference", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
