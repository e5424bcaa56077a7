"""What a torchrun restart costs when a rank dies, to compare with dist.shrink_group.

    python benchmarks/restart_recovery.py --nproc 4 --kill-step 40

Runs ``torchrun --max-restarts 1`` of a DDP job (the digits MLP of examples/train_ddp.py on
ringdist). In the first attempt the last rank SIGKILLs itself at --kill-step, after noting
the time. torchrun's agent notices, stops the other ranks and starts every rank again; in the
second attempt rank 0 prints the time from the kill to the first allreduce of the new
attempt: new processes, imports, rendezvous, init_process_group, DDP. Loading a checkpoint
and redoing the steps since it come on top. examples/elastic_shrink.py prints the same
interval for a shrink.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECOVERED = re.compile(r"restart recovery: (\d+) ms")


def worker(mark, kill_step):
    """One rank under torchrun."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    from train_ddp import make_model

    dist.init_process_group("ringdist")
    rank, size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    ddp = DDP(make_model())
    if attempt > 0:
        dist.all_reduce(torch.zeros(1))
        if rank == 0:
            with open(mark) as f:
                killed_at = float(f.read())
            print(f"restart recovery: {(time.time() - killed_at) * 1000:.0f} ms", flush=True)
        dist.destroy_process_group()
        return
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(10 * kill_step):
        if step == kill_step and rank == size - 1:
            with open(mark, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    raise SystemExit("the kill did not happen")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--kill-step", type=int, default=40)
    p.add_argument("--monitor-interval", type=float, default=0.1,
                   help="torchrun's failure polling (its default is 0.1 s)")
    p.add_argument("--worker", metavar="MARK", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.kill_step)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(args.nproc), "--max-restarts", "1",
               "--monitor-interval", str(args.monitor_interval), os.path.abspath(__file__),
               "--kill-step", str(args.kill_step), "--worker", os.path.join(tmp, "killed_at")]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    found = RECOVERED.findall(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        print((out.stdout + out.stderr)[-3000:], file=sys.stderr)
        return 1
    print(f"torchrun restart, {args.nproc} ranks: {found[0]} ms from the kill to the first "
          "allreduce of the restarted attempt (before any checkpoint is loaded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
