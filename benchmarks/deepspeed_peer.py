#!/usr/bin/env python3
"""DeepSpeed's shared-memory CPU allreduce against ringdist in the same processes, batch by
batch (A B C D A B C D ...), float32 SUM in place on one host.

    torchrun --nproc-per-node 2 benchmarks/deepspeed_peer.py --bytes 8 1K 64K 1M 4M --json out.json

Labels, operators and the functions users call on them in pairs: `deepspeed`
(`torch.ops.deepspeed.inference_all_reduce_`; DeepSpeed is a benchmark-only requirement:
`DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8`, its op is compiled on first
use) and `deepspeed-comm` (`deepspeed.comm.inference_all_reduce`, its Python entry point);
`direct-op` (`torch.ops.ringdist.all_reduce_.default` with the group's name) and `direct`
(`torch_ringdist.direct_all_reduce`, its Python entry point); `direct-op-single-copy-0` / `-1`
(only when asked for: the op on a group created with RINGDIST_SINGLE_COPY=0 or 1, the host's
copy choice forced to the rings or to single copy); `ringdist` (`dist.all_reduce` on the ringdist
group) and `fake` (torch's dispatch floor: `dist.all_reduce` of one element on a `fake` group).
Per size and label: the median over --rounds of a batch's per-call time (slowest rank). Every
label's result is checked once (rank-valued inputs sum exactly) outside the timed batches; the
timed calls reduce zeros, so the values stay put.
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

from bench_common import batch_row, machine_info, time_batches, write_json
from sweep import parse_bytes

LABELS = ["deepspeed", "deepspeed-comm", "direct-op", "direct", "ringdist", "fake"]
# Not run by default: the direct op on groups whose host copy choice is forced (rings, single copy).
EXTRA_LABELS = ["direct-op-single-copy-0", "direct-op-single-copy-1"]


def setup(labels):
    """The default ringdist group (through DeepSpeed when it runs), and what each label calls
    on a tensor."""
    import torch_ringdist  # noqa: F401  registers "ringdist"
    if "deepspeed" in labels or "deepspeed-comm" in labels:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
        from tp_inference import init_deepspeed  # also unlinks DeepSpeed's /dev/shm buffer
        try:
            deepspeed = init_deepspeed("ringdist")
        except ImportError:
            raise SystemExit("deepspeed_peer: DeepSpeed is not installed (a benchmark-only "
                             "requirement: DS_BUILD_OPS=0 pip install --no-build-isolation "
                             "deepspeed==0.19.8); or leave out the labels `deepspeed` and `deepspeed-comm`")
    else:
        dist.init_process_group("ringdist")
    fake = None
    if "fake" in labels:
        warnings.simplefilter("ignore")
        from torch.testing._internal.distributed import fake_pg  # noqa: F401  registers "fake"
        fake = dist.new_group(backend="fake")
    name = dist.distributed_c10d._get_default_group().group_name
    direct_op = torch.ops.ringdist.all_reduce_.default
    copy_names = {}
    for mode in ("0", "1"):
        if f"direct-op-single-copy-{mode}" in labels:  # the host's copy choice, forced
            os.environ["RINGDIST_SINGLE_COPY"] = mode  # read when the group connects
            copy_names[mode] = dist.new_group(backend="ringdist").group_name
            del os.environ["RINGDIST_SINGLE_COPY"]
    return {
        "deepspeed": lambda x: torch.ops.deepspeed.inference_all_reduce_(x),
        "deepspeed-comm": lambda x: deepspeed.comm.inference_all_reduce(x),
        "direct-op": lambda x: direct_op(x, "sum", name),
        "direct-op-single-copy-0": lambda x: direct_op(x, "sum", copy_names["0"]),
        "direct-op-single-copy-1": lambda x: direct_op(x, "sum", copy_names["1"]),
        "direct": lambda x: torch_ringdist.direct_all_reduce(x),
        "ringdist": lambda x: dist.all_reduce(x),
        "fake": lambda x: dist.all_reduce(x, group=fake),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", nargs="+", type=parse_bytes,
                   default=[parse_bytes(b) for b in ("8", "1K", "16K", "64K", "256K", "1M", "4M", "16M")])
    p.add_argument("--labels", nargs="+", default=LABELS, choices=LABELS + EXTRA_LABELS)
    p.add_argument("--rounds", type=int, default=20, help="batches per label and size")
    p.add_argument("--batch-us", type=float, default=5000, help="a batch lasts about this long")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    ops = setup(args.labels)
    rank, world = dist.get_rank(), dist.get_world_size()
    book = dist.new_group(backend="gloo")  # barriers and timings, outside the timed batches

    def slowest(value):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=book)
        return t.item()

    results = []
    for nbytes in args.bytes:
        count = max(1, nbytes // 4)
        calls, wrong = {}, {}
        for label in args.labels:
            size = 1 if label == "fake" else count  # the floor: torch's per-call cost
            check = torch.full((size,), float(rank + 1))
            ops[label](check)
            exact = label == "fake" or torch.equal(check, torch.full((size,), world * (world + 1) / 2))
            wrong[label] = bool(slowest(0.0 if exact else 1.0))
            x = torch.zeros(size)
            calls[label] = (lambda op, x: lambda: op(x))(ops[label], x)
        # Batch size from the slowest label's typical call (a median: one stray slow call must
        # not shrink every batch to a handful of calls).
        typical = 0.0
        for call in calls.values():
            warm = []
            for _ in range(7):
                start = time.perf_counter()
                call()
                warm.append(time.perf_counter() - start)
            typical = max(typical, statistics.median(warm))
        batch = max(10, min(2000, int(args.batch_us * 1e-6 / max(slowest(typical), 1e-7))))
        times = time_batches(calls, args.rounds, batch, lambda: dist.barrier(group=book), slowest)
        results.append(batch_row("allreduce", nbytes, world, batch, times, wrong, rank == 0))
    if rank == 0 and args.json:
        write_json(args.json, {"machine": machine_info(), "world_size": world, "labels": args.labels,
                               "rounds": args.rounds, "command": sys.argv, "results": results})
    dist.destroy_process_group()
    return 1 if any(any(r["wrong"].values()) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
