#!/usr/bin/env python3
"""Time per token of examples/tp_inference.py's model, every variant in the same processes,
round by round (A B C ... A B C ...):

    torchrun --nproc-per-node 2 benchmarks/tp_inference_bench.py --json out.json

Variants: `dtensor-ringdist`, `dtensor-gloo` (torch's tensor-parallel API on a ringdist or gloo
DeviceMesh), `dtensor-fake` (the same on torch's `fake` backend, whose collectives do nothing:
DTensor's own bound L), `direct` (the direct operators), `deepspeed` (DeepSpeed's
`inference_all_reduce_` for the allreduces; only when DeepSpeed is installed), `no-comm` (the
same shards, collectives skipped: the direct path's bound L), `sync-only` (each collective a
one-element direct allreduce: L plus the ranks waiting for each other, next to no data) and
`spin-barrier` (each collective a spin on counters in shared memory, no backend: the least any
collective can cost in this model). Per variant: the median over
--rounds of ms per generated token (rank 0), and whether its tokens equal the one-process run.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

from bench_common import machine_info, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "tp_inference", os.path.join(HERE, "..", "examples", "tp_inference.py"))
tp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    tp.add_model_args(p)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    import torch_ringdist  # noqa: F401
    try:
        tp.init_deepspeed("ringdist")
        have_deepspeed = True
    except ImportError:
        dist.init_process_group("ringdist")
        have_deepspeed = False
    warnings.simplefilter("ignore")
    from torch.testing._internal.distributed import fake_pg  # noqa: F401  registers "fake"
    from torch.distributed.device_mesh import DeviceMesh
    rank, size = dist.get_rank(), dist.get_world_size()

    reference, prompt = None, None
    models = {}
    for name in ["dtensor-ringdist", "dtensor-gloo", "dtensor-fake", "direct",
                 "deepspeed", "no-comm", "sync-only", "spin-barrier"]:
        if name == "deepspeed" and not have_deepspeed:
            continue
        model, prompt = tp.build(args)
        if reference is None:
            reference = tp.generate(model, prompt, args.tokens)
        if name.startswith("dtensor"):
            backend = name.split("-")[1]
            group = None if backend == "ringdist" else dist.new_group(backend=backend)
            mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
            tp.dtensor_qkv_order(model, size)
            models[name] = tp.shard_with_dtensor(model, mesh)
        else:
            models[name] = tp.shard_directly(model, rank, size, name)
    same = {name: tp.generate(m, prompt, args.tokens) == reference for name, m in models.items()}
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            dist.barrier()
            start = time.perf_counter()
            tp.generate(model, prompt, args.tokens)
            times[name].append((time.perf_counter() - start) / args.tokens * 1e3)
    if rank == 0:
        median = {name: statistics.median(t) for name, t in times.items()}
        for name in models:
            print(f"{name:<18} {median[name]:8.3f} ms/token  tokens "
                  f"{'equal' if same[name] else 'differ'}", flush=True)
        if args.json:
            write_json(args.json, {"machine": machine_info(), "world_size": size,
                                   "args": vars(args), "ms_per_token": median, "rounds_ms": times,
                                   "tokens_equal": same, "command": sys.argv})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
