#!/usr/bin/env python3
"""Per-call time of collectives on a one-rank group, against torch's dispatch floor.

    python benchmarks/one_rank_latency.py --json one_rank.json

A group of one rank does no communication, so what a call costs is the backend's own
overhead plus torch's dispatch; the floor is the same call on torch's `fake` backend
(no work at all), measured in the same process. Medians of --rounds rounds of --calls.
Compare two builds by running this with each on PYTHONPATH, alternating.
"""
import argparse
import warnings
import statistics
import time

import torch
import torch.distributed as dist

from bench_common import write_json


def per_call_us(fn, calls):
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def ops(t, out):
    return {"all_reduce 8 B": lambda: dist.all_reduce(t),
            "broadcast 8 B": lambda: dist.broadcast(t, 0),
            "all_gather_into_tensor 8 B": lambda: dist.all_gather_into_tensor(out, t),
            "barrier": lambda: dist.barrier()}


def measure(backend, store, calls, rounds):
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    t, out = torch.ones(2), torch.empty(2)
    result = {name: statistics.median(per_call_us(fn, calls) for _ in range(rounds))
              for name, fn in ops(t, out).items()}
    dist.destroy_process_group()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    warnings.simplefilter("ignore")  # torch's per-call deprecation chatter on the fake backend
    import torch_ringdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ours = measure("ringdist", dist.HashStore(), args.calls, args.rounds)
    floor = measure("fake", FakeStore(), args.calls, args.rounds)
    for name in ours:
        print(f"{name:<28} ringdist {ours[name]:7.2f} us   torch floor (fake) {floor[name]:7.2f} us"
              f"   overhead {ours[name] - floor[name]:+7.2f} us")
    if args.json:
        write_json(args.json, {"ringdist": ours, "fake": floor, "torch": torch.__version__,
                               "package": torch_ringdist.__file__})


if __name__ == "__main__":
    main()
