"""Ranks of the teardown test (tests/test_teardown.py). Modes:
  env      init from the environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT: under torchrun, or
           a plain launch where rank 0's process hosts the store), one allreduce, destroy
  mpi      the same under Open MPI's mpirun (its variables give the rank and world size)
  spawn    the parent of a torch.multiprocessing.spawn world doing the same (rank 0 hosts)
  failed   rank 1 exits at once after init; rank 0's allreduce fails, and rank 0 prints how
           long destroy_process_group and the rest of its exit took after that failure
  left     rank 1 leaves by sys.exit from an `except` (as torch.multiprocessing.spawn's wrapper
           does after a rank's exception: no uncaught exception, so the exit hook's orderly
           teardown runs) while rank 0 waits in an allreduce; each prints when it left, failed
           or finished exiting (time.monotonic, one clock for every process on the machine)
"""
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist


def one_allreduce():
    dist.init_process_group("ringdist")
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == dist.get_world_size()
    dist.destroy_process_group()


def spawned_rank(rank, world):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    one_allreduce()


def failed_peer():
    dist.init_process_group("ringdist")
    if dist.get_rank() == 1:
        os._exit(3)  # gone without a word
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except RuntimeError:
        failed_at = time.monotonic()
    else:
        raise AssertionError("the allreduce with a dead peer succeeded")
    dist.destroy_process_group()
    print(f"EXIT_AFTER_FAILURE {time.monotonic() - failed_at:.3f}", flush=True)


def left_peer():
    atexit.register(lambda: print(f"EXITED {time.monotonic():.3f}", flush=True))  # runs last
    dist.init_process_group("ringdist")
    if dist.get_rank() == 1:
        try:
            raise RuntimeError("injected")
        except RuntimeError:
            print(f"LEFT {time.monotonic():.3f}", flush=True)
            sys.exit(3)
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except RuntimeError as e:
        print(f"FAILED {time.monotonic():.3f} {e}", flush=True)
    else:
        raise AssertionError("the allreduce with a peer that left succeeded")
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "env":
        one_allreduce()
    elif mode == "mpi":
        os.environ.update(RANK=os.environ["OMPI_COMM_WORLD_RANK"],
                          WORLD_SIZE=os.environ["OMPI_COMM_WORLD_SIZE"],
                          LOCAL_RANK=os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
        one_allreduce()
    elif mode == "spawn":
        import torch.multiprocessing as mp
        mp.spawn(spawned_rank, args=(3,), nprocs=3)
    elif mode == "failed":
        failed_peer()
    elif mode == "left":
        left_peer()
    else:
        raise SystemExit(f"unknown mode {mode}")
