#!/usr/bin/env python3
"""Sparse allreduce of embedding gradients: ringdist against gloo, alternating rounds.

    python benchmarks/sparse_allreduce.py --nproc 2 --json sparse.json

Each rank holds the sparse COO gradient of a (--rows x --dim) float32 embedding table in which
a batch touched --touched random rows (with repeats, as real batches have), and all-reduces it
(SUM). Reported: median time per allreduce of the slowest rank, per backend, over --rounds
alternating rounds; and, for scale, a dense allreduce of the whole table on ringdist.
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench_common import machine_info, write_json


def sparse_grad(rank, rows, dim, touched, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, rows, (1, touched), generator=g)
    return torch.sparse_coo_tensor(idx, torch.randn(touched, dim, generator=g), (rows, dim))


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(fn, iters):
    times = []
    for i in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn(i)
        times.append(slowest(time.perf_counter() - t0))
    return statistics.median(times) * 1e6


def rank_main(rank, nproc, backend, store_path, args, queue):
    import torch_ringdist  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)  # as under torchrun: no intra-op threads beside the ranks
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=nproc)
    result = {}
    for touched in args.touched:
        grads = [sparse_grad(rank, args.rows, args.dim, touched, i) for i in range(args.iters + 3)]
        for i in range(3):
            dist.all_reduce(grads[args.iters + i])  # warm-up
        result[f"sparse {touched} rows"] = timed(lambda i: dist.all_reduce(grads[i]), args.iters)
    if backend == "ringdist":
        dense = torch.randn(args.rows, args.dim)
        result["dense whole table"] = timed(lambda i: dist.all_reduce(dense), max(3, args.iters // 4))
    dist.destroy_process_group()
    if rank == 0:
        queue.put(result)


def run(backend, args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main,
                             args=(r, args.nproc, backend, os.path.join(tmp, "store"), args, queue))
                 for r in range(args.nproc)]
        for p in procs:
            p.start()
        result = queue.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--touched", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    rounds = {"ringdist": [], "gloo": []}
    for _ in range(args.rounds):
        for backend in rounds:
            rounds[backend].append(run(backend, args))
    table = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in rounds.items()}
    print(f"sparse allreduce, {args.nproc} ranks, table {args.rows} x {args.dim} float32, "
          f"median of {args.rounds} alternating rounds (slowest rank)")
    for case, ours in table["ringdist"].items():
        theirs = table["gloo"].get(case)
        vs = f"gloo {theirs:10.1f} us   x{theirs / ours:.2f}" if theirs else ""
        print(f"  {case:<22} ringdist {ours:10.1f} us   {vs}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "rounds": rounds,
                               "median_us": table})


if __name__ == "__main__":
    main()
