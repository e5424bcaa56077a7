#!/usr/bin/env python3
"""sweep.py's size sweep on Open MPI (mpi4py), the HPC reference on one host.

    mpirun -n 2 --allow-run-as-root python benchmarks/mpi_sweep.py --collective allreduce \
        --json mpi.json

Same sizes, buffers, closed-form checks, timing and JSON as sweep.py (it reuses them);
only the calls differ: MPI_Allreduce (in place), MPI_Allgather, MPI_Bcast and
MPI_Reduce_scatter_block on the tensors' memory. Bookkeeping (barriers, the slowest
rank's time) runs on a duplicate communicator, as sweep.py keeps it on a separate group.
float32 only (MPI has no bfloat16). Setup: benchmarks/setup_mpi.sh.
"""
import argparse
import os
import sys

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sweep  # noqa: E402


class MpiCollective(sweep.Collective):
    def __init__(self, name, count, dtype, comm):
        super().__init__(name, count, dtype, comm.rank, comm.size, None, "tensor",
                         torch.device("cpu"))
        self.comm = comm
        # numpy views share the tensors' memory: results land where wrong() looks.
        if name in ("allreduce", "broadcast"):
            self.buf_np = self.buf.numpy()
        else:
            self.inp_np, self.out_np = self.inp.numpy(), self.out.numpy()

    def run(self):
        c = self.comm
        if self.name == "allreduce":
            c.Allreduce(MPI.IN_PLACE, self.buf_np, op=MPI.SUM)
        elif self.name == "broadcast":
            c.Bcast(self.buf_np, root=0)
        elif self.name == "allgather":
            c.Allgather(self.inp_np, self.out_np)
        else:
            c.Reduce_scatter_block(self.inp_np, self.out_np, op=MPI.SUM)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sweep.add_common_args(p)
    args = p.parse_args()
    if args.dtype != "float32":
        sys.exit("mpi_sweep.py: MPI has no bfloat16; use --dtype float32")
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    book = comm.Dup()
    dtype = sweep.DTYPES[args.dtype]
    sweep.run_sweep(args, comm.rank, comm.size,
                    make=lambda count: MpiCollective(args.collective, count, dtype, comm),
                    slowest=lambda x: book.allreduce(x, op=MPI.MAX),
                    total=lambda k: book.allreduce(int(k), op=MPI.SUM),
                    backend="mpi",
                    extra={"mpi_library": MPI.Get_library_version().strip().splitlines()[0],
                           "mpi4py": __import__("mpi4py").__version__, "checked": True})
    book.Barrier()


if __name__ == "__main__":
    main()
