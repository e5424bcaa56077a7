#!/usr/bin/env python3
"""One collective in a tight loop, for profiling and quick A/B runs (not the reported
figures: those come from compare.py, alternating with the peers).

    torchrun --nproc-per-node 2 benchmarks/op_loop.py --op broadcast --bytes 64K --seconds 5
    perf record -F 20000 -g -a -- torchrun ... benchmarks/op_loop.py ...   # where time goes
    mpirun --allow-run-as-root -np 2 python benchmarks/op_loop.py --backend mpi --op allgather ...

Each rank calls the op synchronously back to back in batches of --batch calls and prints,
on rank 0, the median time per call over the batches (each batch's time is the slowest
rank's, exchanged on a gloo side group outside the timed region).
"""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

from sweep import init_backend, parse_bytes


def make_op(name, nbytes, world, rank, mpi=None, group=None):
    """(call, result): the op as a no-argument call on tensors made once (torch's default group
    or `group`; Open MPI's communicator with mpi=(comm, MPI)), and the tensor it writes its
    result into."""
    count = max(1, nbytes // 4)
    x = torch.full((count,), float(rank + 1))
    inp = torch.full((count * world,), float(rank + 1)) if name == "reduce_scatter" else None
    out = torch.empty(count * world) if name == "allgather" else x
    if mpi is not None:
        return make_mpi_op(name, x, out, inp, mpi), out
    if name == "allreduce":
        return (lambda: dist.all_reduce(x, group=group)), out
    if name == "broadcast":
        return (lambda: dist.broadcast(x, src=0, group=group)), out
    if name == "allgather":
        return (lambda: dist.all_gather_into_tensor(out, x, group=group)), out
    if name == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(x, inp, group=group)), out
    raise SystemExit(f"unknown op {name}")


def make_mpi_op(name, x, out, inp, mpi):
    """The same call on Open MPI (mpi4py), on the same tensors' memory (numpy views made once)."""
    comm, MPI = mpi
    buf = x.numpy()
    if name == "allreduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    if name == "broadcast":
        return lambda: comm.Bcast(buf, root=0)
    if name == "allgather":
        gathered = out.numpy()
        return lambda: comm.Allgather(buf, gathered)
    scattered = inp.numpy()
    return lambda: comm.Reduce_scatter_block(scattered, buf, op=MPI.SUM)


class MpiBook:
    """The bookkeeping main() does on a gloo side group, on a duplicate communicator."""

    def __init__(self, comm, MPI):
        self.comm, self.MPI = comm.Dup(), MPI

    def barrier(self):
        self.comm.Barrier()

    def max(self, value):
        return self.comm.allreduce(value, op=self.MPI.MAX)


class TorchBook:
    """Barrier and slowest-rank time on a gloo side group, outside the timed region."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo")

    def barrier(self):
        dist.barrier(group=self.group)

    def max(self, value):
        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="ringdist",
                   help="ringdist, gloo, fake (torch's dispatch floor: no data moves), or mpi "
                        "(Open MPI through mpi4py; launch with mpirun instead of torchrun)")
    p.add_argument("--op", default="allreduce",
                   choices=["allreduce", "broadcast", "allgather", "reduce_scatter"])
    p.add_argument("--bytes", type=parse_bytes, default=parse_bytes("8"), help="bytes per rank's input (K/M suffixes)")
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--stats", action="store_true", help="print torch_ringdist.stats() per rank")
    args = p.parse_args()
    torch.set_num_threads(1)
    mpi = None
    if args.backend == "mpi":
        from mpi4py import MPI
        mpi = (MPI.COMM_WORLD, MPI)
        rank, world = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
        book = MpiBook(*mpi)
    else:
        init_backend(args.backend, datetime.timedelta(seconds=60))
        rank, world = dist.get_rank(), dist.get_world_size()
        book = TorchBook()
    op, _ = make_op(args.op, args.bytes, world, rank, mpi)
    for _ in range(args.batch):
        op()
    per_call = []
    end = time.monotonic() + args.seconds
    while True:
        book.barrier()
        start = time.perf_counter()
        for _ in range(args.batch):
            op()
        per_call.append(book.max((time.perf_counter() - start) / args.batch))
        if book.max(1.0 if time.monotonic() > end else 0.0) > 0:
            break
    if rank == 0:
        print(f"{args.backend} {args.op} {args.bytes} B N={world}: {statistics.median(per_call) * 1e6:.2f} us "
              f"per call (median of {len(per_call)} batches of {args.batch}; pid {os.getpid()})")
    if args.stats and args.backend == "ringdist":
        import torch_ringdist
        print(f"rank {rank} stats: {torch_ringdist.stats()}")
    if mpi is None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
