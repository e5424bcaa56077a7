#!/usr/bin/env python3
"""Open MPI, ringdist and torch's floor in the same processes, batch by batch (A B C A B C ...).

    mpirun --allow-run-as-root -np 2 python benchmarks/same_process.py --op allgather \\
        --bytes 256K 1M 4M --labels mpi ringdist ringdist:RINGDIST_SINGLE_COPY=1 fake

Separate launches (compare.py, copy_bound.py) also differ in where the kernel placed each
run's buffers and processes; here every label shares the processes, and the op's tensors per
size, so what differs is only the library. Labels: `mpi` (mpi4py on MPI_COMM_WORLD), `fake`
(torch's dispatch floor: the op of one element on a `fake` group, which moves no data), `ringdist` (the
default group) and `ringdist:VAR=VALUE,...` (a ringdist group created with those variables
set, e.g. single copy forced on or off). Per size and label: the median over --rounds of a
batch's per-call time (slowest rank). Each label's result is checked after its first call,
outside the timed batches (sums, gathers and broadcasts of rank-valued floats are exact).
"""
import argparse
import datetime
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

from bench_common import batch_row, machine_info, time_batches, write_json
from op_loop import make_op
from sweep import parse_bytes


def init_torch(comm):
    """ringdist's default group for the MPI ranks (rendezvous on rank 0's port)."""
    import torch_ringdist  # noqa: F401  registers "ringdist"
    from torch.distributed.elastic.utils.distributed import get_free_port
    port = comm.bcast(get_free_port() if comm.rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(comm.rank),
                      WORLD_SIZE=str(comm.size))
    dist.init_process_group("ringdist", timeout=datetime.timedelta(seconds=120))


def make_group(label):
    """The torch group a label runs on (None: the default group), created on every rank."""
    name, _, settings = label.partition(":")
    if name == "fake":
        warnings.simplefilter("ignore")  # torch's per-call deprecation chatter on fake
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers "fake"
        return dist.new_group(backend="fake")
    if not settings:
        return None
    saved = dict(os.environ)
    os.environ.update(kv.split("=", 1) for kv in settings.split(","))
    try:
        return dist.new_group(backend="ringdist")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def backend_of(group):
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu"))


def expected(op, nbytes, world):
    """What every rank's result tensor holds after one call of make_op's op."""
    count = max(1, nbytes // 4)
    if op == "allgather":
        return torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(count)
    if op == "broadcast":
        return torch.full((count,), 1.0)
    return torch.full((count,), float(world * (world + 1) // 2))  # allreduce, reduce_scatter


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="allreduce", choices=["allreduce", "broadcast", "allgather", "reduce_scatter"])
    p.add_argument("--bytes", nargs="+", type=parse_bytes, default=[parse_bytes("1M")],
                   help="bytes per rank's input (K/M suffixes)")
    p.add_argument("--labels", nargs="+", default=["mpi", "ringdist", "fake"])
    p.add_argument("--rounds", type=int, default=30, help="batches per label and size")
    p.add_argument("--batch-us", type=float, default=5000,
                   help="a batch lasts about this long (at least 10 calls: its first call finds "
                        "the caches holding the previous label's buffers)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    book = comm.Dup()
    torch.set_num_threads(1)
    init_torch(comm)
    groups = {label: make_group(label) for label in args.labels if label != "mpi"}
    copies = {label: backend_of(group).same_host_copy for label, group in groups.items()
              if label.startswith("ringdist")}
    if rank == 0:
        for label, copy in copies.items():
            print(f"{label}: {copy['why']}", flush=True)
    results = []
    for nbytes in args.bytes:
        calls, wrong = {}, {}
        for label in args.labels:
            mpi = (comm, MPI) if label == "mpi" else None
            # The floor is torch's per-call cost: fake copies locally what it "gathers", so it
            # gets one element whatever the size.
            size = 4 if label == "fake" else nbytes
            call, result = make_op(args.op, size, world, rank, mpi=mpi, group=groups.get(label))
            call()  # fake moves no data: nothing to check
            exact = label == "fake" or torch.equal(result, expected(args.op, nbytes, world))
            wrong[label] = book.allreduce(0 if exact else 1)
            calls[label] = call
        # One batch size for all labels, from the slowest label's warm-up call.
        slowest = 0.0
        for call in calls.values():
            for _ in range(3):
                start = time.perf_counter()
                call()
                slowest = max(slowest, time.perf_counter() - start)
        batch = book.allreduce(max(10, min(500, int(args.batch_us * 1e-6 / max(slowest, 1e-7)))), op=MPI.MIN)
        times = time_batches(calls, args.rounds, batch, book.Barrier,
                             lambda seconds: book.allreduce(seconds, op=MPI.MAX))
        results.append(batch_row(args.op, nbytes, world, batch, times, wrong, rank == 0))
    if rank == 0 and args.json:
        write_json(args.json, {"machine": machine_info(), "op": args.op, "world_size": world,
                               "labels": args.labels, "same_host_copy": copies,
                               "rounds": args.rounds, "command": sys.argv,
                               "results": results})
    dist.destroy_process_group()
    # Rank 0's process holds the store: it leaves only once every rank's teardown is done.
    book.Barrier()
    return 1 if any(any(r["wrong"].values()) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
