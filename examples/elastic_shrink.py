"""Keep training when ranks die: DDP on ringdist that shrinks its group and goes on.

    python examples/elastic_shrink.py --nproc 4 --kill 3@40 --kill 1@90
    # several machines: run on each, node 0 first (it hosts the store)
    python examples/elastic_shrink.py --nnodes 2 --node-rank N --master-addr HOST0 --master-port 29600 ...

Starts --nproc ranks on this machine (node 0 hosts the store, so any rank may die) and
trains the digits MLP with DDP. ``--kill RANK@STEP`` SIGKILLs the process of that (original)
rank once training reaches STEP. The survivors' collective fails; they agree on who is gone
(``torch_ringdist.lost_ranks``), call ``dist.shrink_group``, roll back to the last step all of
them completed, re-shard the batches over the survivors, rebuild DDP and finish. Each global
batch is the same 64 samples whatever the number of ranks, so the run ends where an
uninterrupted run ends. Prints each recovery's time (the kill to the first successful
allreduce of the new group). Needs scikit-learn.
"""

import argparse
import faulthandler
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


def launch_parser(doc, wait):
    """The options of a launcher of elastic ranks on one or several nodes (also
    examples/elastic_diloco.py's); ``wait``: the default lost_ranks window."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nproc", type=int, default=4, help="ranks on this machine")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1", help="node 0's address (the store)")
    p.add_argument("--master-port", type=int, default=0, help="the store's port (0: any, one node)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                   help="SIGKILL original rank RANK when training reaches STEP (repeatable)")
    p.add_argument("--wait", type=float, default=wait,
                   help="lost_ranks window: longer than a live rank needs to notice a failure")
    p.add_argument("--timeout", type=float, default=300, help="the whole job's deadline (s)")
    return p


def rank_steps(texts):
    """RANK@STEP options as sorted (step, rank) pairs."""
    return sorted((int(s), int(r)) for r, s in (t.split("@") for t in texts))


def parse_launch_args(p, argv=None):
    args = p.parse_args(argv)
    args.kill = rank_steps(args.kill)
    args.world = args.nnodes * args.nproc
    if args.nnodes > 1 and not args.master_port:
        p.error("--master-port is needed with --nnodes > 1")
    return args


def parse_args(argv=None):
    p = launch_parser(__doc__, wait=0.3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    return parse_launch_args(p, argv)


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


class Progress:
    """The steps each process of this node completed, shared without a lock: a process writes
    only its own slot, the launcher reads them all. (A shared lock stays held for good by a
    process SIGKILLed or SIGSTOPped inside it, and every other process and the launcher then
    wait on it forever.)"""

    def __init__(self, ctx, processes: int):
        self._steps = ctx.Array("i", processes, lock=False)

    def done(self, slot: int, step: int) -> None:
        self._steps[slot] = step

    def furthest(self) -> int:
        return max(self._steps)


def connect(args, port, is_master=False):
    return dist.TCPStore(args.master_addr, port, args.world, is_master=is_master,
                         wait_for_workers=False, timeout=timedelta(seconds=args.timeout))


def show_stacks_on_request():
    """SIGUSR1 prints this process's stacks to stderr: the launcher asks a rank still running
    at its deadline where it is."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def worker(rank, args, port, progress, slot):
    import torch_ringdist

    show_stacks_on_request()
    store = connect(args, port)
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=args.world,
                            timeout=timedelta(seconds=60))
    t = Trainer(args)
    t.ddp = DDP(t.model)
    recoveries = []
    while t.step < t.total:
        try:
            t.train_step()
            progress.done(slot, t.step)
        except dist.DistBackendError:
            failed_at = time.time()
            lost = torch_ringdist.lost_ranks(wait=args.wait)
            agreed = time.time()
            dist.shrink_group(lost)
            shrunk = time.time()
            dist.all_reduce(torch.zeros(1))  # the new group's first allreduce
            recovered = time.time()
            t.resync()
            killed_at = float(store.get("elastic/killed_at"))  # set by the killing node's launcher
            recoveries.append((lost, t.step, recovered - killed_at, failed_at - killed_at,
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
    store.add("elastic/done", 1)  # node 0's launcher keeps the store up until all are done


def reap(procs, ranks, killed, what) -> bool:
    """Ends the processes still running (past the deadline, or after a failure); False, with
    the exit codes printed, when one not SIGKILLed on purpose (index in ``killed``) failed.
    Each rank still running first prints its threads' stacks (show_stacks_on_request)."""
    stuck = [i for i, p in enumerate(procs) if p.is_alive() and i not in killed]
    if stuck:
        print(f"{what}: ranks {[ranks[i] for i in stuck]} still running; their stacks follow",
              file=sys.stderr)
        for i in stuck:
            os.kill(procs[i].pid, signal.SIGUSR1)
        time.sleep(1)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    bad = {ranks[i]: p.exitcode for i, p in enumerate(procs) if i not in killed and p.exitcode != 0}
    if bad:
        print(f"{what}: ranks failed or timed out (exit codes {bad})", file=sys.stderr)
    return not bad


def main(argv=None):
    args = parse_args(argv)
    # Node 0's launcher hosts the store: it outlives any rank.
    store = connect(args, args.master_port, is_master=args.node_rank == 0)
    ctx = mp.get_context("spawn")
    progress = Progress(ctx, args.nproc)
    first = args.node_rank * args.nproc  # global rank of this node's first rank
    procs = [ctx.Process(target=worker, args=(first + r, args, store.port, progress, r))
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    # Ranks move in lock step, so this node's progress is everyone's.
    kills = [(step, rank - first) for step, rank in args.kill if first <= rank < first + args.nproc]
    killed = set()
    deadline = time.monotonic() + args.timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if kills and progress.furthest() >= kills[0][0]:
            local = kills.pop(0)[1]
            store.set("elastic/killed_at", repr(time.time()))
            os.kill(procs[local].pid, signal.SIGKILL)
            killed.add(local)
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in killed]
        if failed:
            break
        time.sleep(0.002)
    if not reap(procs, [first + r for r in range(len(procs))], killed, "elastic_shrink"):
        return 1
    if args.node_rank == 0:
        survivors = args.world - len(args.kill)
        while store.add("elastic/done", 0) < survivors and time.monotonic() < deadline:
            time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
