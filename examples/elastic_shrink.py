"""Keep training when ranks die: DDP on ringdist that shrinks its group and goes on.

    python examples/elastic_shrink.py --nproc 4 --kill 3@40 --kill 1@90

Starts --nproc ranks on this machine (it hosts the store itself, so any rank may die) and
trains the digits MLP with DDP. ``--kill RANK@STEP`` SIGKILLs the process of that (original)
rank once training reaches STEP. The survivors' collective fails; they agree on who is gone
(``torch_ringdist.lost_ranks``), call ``dist.shrink_group``, roll back to the last step all of
them completed, re-shard the batches over the survivors, rebuild DDP and finish. Each global
batch is the same 64 samples whatever the number of ranks, so the run ends where an
uninterrupted run ends. Prints each recovery's time (the kill to the first successful
allreduce of the new group). Needs scikit-learn.
"""

import argparse
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from train_ddp import make_data, make_model

GLOBAL_BATCH = 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                   help="SIGKILL original rank RANK when training reaches STEP (repeatable)")
    p.add_argument("--wait", type=float, default=0.3,
                   help="lost_ranks window: longer than a live rank needs to notice a failure")
    p.add_argument("--timeout", type=float, default=300, help="the whole job's deadline (s)")
    args = p.parse_args(argv)
    args.kill = sorted((int(s), int(r)) for r, s in (k.split("@") for k in args.kill))
    return args


class Trainer:
    """One rank's model, optimizer and position (optimizer steps completed)."""

    def __init__(self, args):
        torch.manual_seed(args.seed)
        self.args = args
        self.train_ds, self.test_ds = make_data(args.seed)
        self.model = make_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.per_epoch = len(self.train_ds) // GLOBAL_BATCH
        self.total = args.epochs * self.per_epoch
        self.step = 0
        self.ddp = None

    def batch(self, step):
        """This rank's rows of global batch ``step`` (the same 64 samples for any world size)."""
        epoch, i = divmod(step, self.per_epoch)
        order = torch.randperm(len(self.train_ds),
                               generator=torch.Generator().manual_seed(self.args.seed + epoch))
        rows = order[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH][dist.get_rank()::dist.get_world_size()]
        x, y = self.train_ds.tensors
        return x[rows], y[rows]

    def train_step(self):
        x, y = self.batch(self.step)
        # DDP averages over ranks: sum / 64 * world_size makes that the mean over the
        # global batch, however the 64 rows are split.
        loss = F.cross_entropy(self.ddp(x), y, reduction="sum") * (dist.get_world_size() / GLOBAL_BATCH)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    def resync(self):
        """After a shrink: everyone continues from the lowest step any survivor completed, with
        the model and optimizer of a survivor that stopped there (one that failed mid-step
        applied nothing of that step)."""
        steps = [None] * dist.get_world_size()
        dist.all_gather_object(steps, self.step)
        self.step = min(steps)
        state = [{"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}]
        dist.broadcast_object_list(state, src=steps.index(self.step))
        self.model.load_state_dict(state[0]["model"])
        self.optimizer.load_state_dict(state[0]["optimizer"])
        # The failed step's backward left partial gradients; the next one must not add to them.
        self.optimizer.zero_grad(set_to_none=True)
        self.ddp = None  # drop the old DDP (its reducer hooks the parameters) before the new one
        self.ddp = DDP(self.model)

    def final(self):
        x, y = self.train_ds.tensors
        tx, ty = self.test_ds.tensors
        with torch.no_grad():
            loss = F.cross_entropy(self.model(x), y).item()
            acc = (self.model(tx).argmax(dim=1) == ty).float().mean().item()
        return loss, acc


def worker(rank, args, port, progress, killed_at):
    import torch_ringdist

    store = dist.TCPStore("127.0.0.1", port, args.nproc, is_master=False,
                          timeout=timedelta(seconds=args.timeout))
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=args.nproc,
                            timeout=timedelta(seconds=60))
    t = Trainer(args)
    t.ddp = DDP(t.model)
    recoveries = []
    while t.step < t.total:
        try:
            t.train_step()
            with progress.get_lock():
                progress.value = max(progress.value, t.step)
        except dist.DistBackendError:
            failed_at = time.time()
            lost = torch_ringdist.lost_ranks(wait=args.wait)
            agreed = time.time()
            dist.shrink_group(lost)
            shrunk = time.time()
            dist.all_reduce(torch.zeros(1))  # the new group's first allreduce
            recovered = time.time()
            t.resync()
            recoveries.append((lost, t.step, recovered - killed_at.value, failed_at - killed_at.value,
                               agreed - failed_at, shrunk - agreed, recovered - shrunk))
    loss, acc = t.final()
    if dist.get_rank() == 0:
        for n, (lost, step, total, detect, agree, shrink, first) in enumerate(recoveries):
            print(f"recovery {n + 1}: lost ranks {lost} of the group, resumed at step {step}: "
                  f"{total * 1000:.0f} ms from the kill to the first allreduce of the new group "
                  f"(failure seen {detect * 1000:.0f} ms, agreement {agree * 1000:.0f} ms, shrink "
                  f"{shrink * 1000:.0f} ms, first allreduce {first * 1000:.1f} ms)", flush=True)
        print(f"final: loss={loss:.6f} accuracy={acc:.6f} world_size={dist.get_world_size()} "
              f"steps={t.step} recoveries={len(recoveries)}", flush=True)
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    # The launcher hosts the store: it outlives any rank.
    store = dist.TCPStore("127.0.0.1", 0, args.nproc, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    progress, killed_at = ctx.Value("i", 0), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=worker, args=(r, args, store.port, progress, killed_at))
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    kills, killed = list(args.kill), set()
    deadline = time.monotonic() + args.timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if kills and progress.value >= kills[0][0]:
            rank = kills.pop(0)[1]
            killed_at.value = time.time()
            os.kill(procs[rank].pid, signal.SIGKILL)
            killed.add(rank)
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in killed]
        if failed:
            break
        time.sleep(0.002)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    bad = {r: p.exitcode for r, p in enumerate(procs) if r not in killed and p.exitcode != 0}
    if bad:
        print(f"elastic_shrink: ranks failed or timed out (exit codes {bad})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
