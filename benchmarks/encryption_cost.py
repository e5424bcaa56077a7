#!/usr/bin/env python3
"""What sealing TCP records costs: allreduce on a ringdist group with encryption (the default)
and on one with RINGDIST_TCP_ENCRYPT=0, in the same processes, alternating batches, medians;
and the CPU time (this process's, all threads) per call, which a busy machine does not distort.

    RINGDIST_TRANSPORT=tcp torchrun --nproc-per-node 2 benchmarks/encryption_cost.py \\
        --sizes 8 1M 16M 64M --rounds 5 --json out.json           # loopback: no link limit
    bash benchmarks/netns_hosts.sh run --rate 10gbit -- benchmarks/encryption_cost.py ...

Launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR/PORT); the
timing group is gloo. On the link of the WAN emulator, use wan_allreduce.py --backends
ringdist ringdist:plain instead (it sets up the hosts itself).
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

import torch_ringdist  # noqa: F401
from bench_common import batch_row, machine_info, time_batches, write_json
from sweep import parse_bytes

LABELS = {"sealed": {}, "plain": {"RINGDIST_TCP_ENCRYPT": "0"}}


def group_with(env, timeout):
    os.environ.update(env)  # read when the group is made
    try:
        return dist.new_group(backend="ringdist", timeout=timeout)
    finally:
        for key in env:
            os.environ.pop(key)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["8", "64K", "1M", "16M", "64M"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    timeout = datetime.timedelta(seconds=600)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {label: group_with(env, timeout) for label, env in LABELS.items()}

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    for nbytes in map(parse_bytes, args.sizes):
        count = max(1, nbytes // 4)
        wrong = {}
        for label, group in groups.items():  # correctness, and a warm-up
            t = torch.full((count,), float(rank + 1))
            dist.all_reduce(t, group=group)
            wrong[label] = int((t != world * (world + 1) / 2).sum())
        zeros = torch.zeros(count)
        cpu = {label: 0.0 for label in groups}

        def timed(label, group):
            def call():
                start = time.process_time()
                dist.all_reduce(zeros, group=group)
                cpu[label] += time.process_time() - start
            return call

        calls = {label: timed(label, group) for label, group in groups.items()}
        batch = 20 if nbytes < (64 << 10) else 5 if nbytes < (4 << 20) else 2
        times = time_batches(calls, args.rounds, batch, dist.barrier, slowest)
        row = batch_row("allreduce", nbytes, world, batch, times, wrong, rank == 0)
        row["sealed_over_plain"] = row["us"]["sealed"] / row["us"]["plain"]
        row["cpu_us_per_call"] = {label: 1e6 * c / (args.rounds * batch) for label, c in cpu.items()}
        if rank == 0:
            print(f"    sealed / plain = {row['sealed_over_plain']:.3f}; rank 0's CPU per call: "
                  + "  ".join(f"{label} {us:.1f} us" for label, us in row["cpu_us_per_call"].items()),
                  flush=True)
        rows.append(row)
    if rank == 0 and args.json:
        write_json(args.json, {"benchmark": "encryption_cost", "world": world,
                               "transport": os.environ.get("RINGDIST_TRANSPORT", "auto"),
                               "machine": machine_info(), "rounds": args.rounds, "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
