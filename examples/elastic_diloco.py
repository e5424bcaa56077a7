"""DiLoCo that survives a lost rank: the round's exchange fails, the survivors shrink and go on.

    python examples/elastic_diloco.py --nproc 4 --kill 3@35 --join 75

Starts --nproc ranks on this machine (this launcher hosts the store, so any rank may die) and
trains the digits MLP with DiLoCo (``torch_ringdist.hooks.DiLoCoOptimizer``: AdamW inner steps,
outer Nesterov SGD every --period steps, int8 pseudo-gradients, ``on_failure="shrink"``).
``--kill RANK@STEP`` SIGKILLs the process of that (original) rank once training reaches STEP.
The survivors' inner steps do not communicate, so they notice at the next round: its exchange
fails, they agree on who is gone, shrink the group, redo that round's exchange among themselves
with the pseudo-gradients they had sent, and train on from where they are: nothing rolls back,
no round runs twice. ``--join STEP``: a process started with the others, idle until training
reaches STEP (so its start-up is not in the figure), asks the job to be admitted
(``DiLoCoOptimizer.join``); at the end of that period the ranks re-form
the group with it, hand it theta_global, the outer momentum and the step counter, and all train
on. Every step's global batch is the same 64 samples, split over the ranks alive. Prints each
recovery (the kill, the failed exchange, the redo done), each join (the joiner's start, its
admission) and the final loss and accuracy of the model every rank shares. Needs scikit-learn.
"""

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from train_ddp import make_data, make_model

GLOBAL_BATCH = 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nproc", type=int, default=4, help="ranks on this machine")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--period", type=int, default=10, help="inner steps per round")
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate")
    p.add_argument("--codec", default="int8", help="pseudo-gradient codec ('none': exact)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                   help="SIGKILL original rank RANK when training reaches STEP (repeatable)")
    p.add_argument("--join", action="append", type=int, default=[], metavar="STEP",
                   help="a new process joins when training reaches STEP (repeatable)")
    p.add_argument("--wait", type=float, default=1.0,
                   help="lost_ranks window: longer than a live rank needs to reach the round")
    p.add_argument("--timeout", type=float, default=300, help="the whole job's deadline (s)")
    args = p.parse_args(argv)
    args.kill = sorted((int(s), int(r)) for r, s in (k.split("@") for k in args.kill))
    args.join = sorted(args.join)
    return args


def batch(train_ds, step, seed):
    """This rank's rows of global batch ``step`` (the same 64 samples for any world size)."""
    per_epoch = len(train_ds) // GLOBAL_BATCH
    epoch, i = divmod(step, per_epoch)
    order = torch.randperm(len(train_ds), generator=torch.Generator().manual_seed(seed + epoch))
    rows = order[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH][dist.get_rank()::dist.get_world_size()]
    x, y = train_ds.tensors
    return x[rows], y[rows]


def worker(rank, args, port, progress):
    """An original rank (rank >= 0) or a joiner (rank < 0)."""
    import torch_ringdist.hooks as hooks

    store = dist.TCPStore("127.0.0.1", port, args.nproc, is_master=False,
                          timeout=timedelta(seconds=args.timeout))
    torch.manual_seed(args.seed)
    train_ds, test_ds = make_data(args.seed)
    model = make_model()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank < 0:
        store.wait([f"elastic/join_go/{-rank - 1}"])  # the launcher says when
        started = time.time()
        opt = hooks.DiLoCoOptimizer.join(model, inner, store, timeout=args.timeout)
        store.set(f"elastic/joined/{-rank - 1}", json.dumps([started, time.time()]))
    else:
        dist.init_process_group("ringdist", store=store, rank=rank, world_size=args.nproc,
                                timeout=timedelta(seconds=60))
        opt = hooks.DiLoCoOptimizer(model, inner, period=args.period, store=store,
                                    codec=None if args.codec == "none" else args.codec,
                                    on_failure="shrink", lost_wait=args.wait)
    for step in range(opt.state.iteration, args.steps):
        x, y = batch(train_ds, step, args.seed)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()  # every --period steps: the round (and, after a death, the recovery)
        with progress.get_lock():
            progress.value = max(progress.value, step + 1)
    # After the last round (steps a multiple of --period) every survivor holds theta_global.
    with torch.no_grad():
        tx, ty = test_ds.tensors
        x, y = train_ds.tensors
        loss = F.cross_entropy(model(x), y).item()
        acc = (model(tx).argmax(dim=1) == ty).float().mean().item()
    spread = torch.tensor([loss, -loss], dtype=torch.float64)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        killed_at = [float(store.get(f"elastic/killed_at/{n}")) for n in range(len(args.kill))]
        for n, r in enumerate(opt.state.recoveries):
            print(f"recovery {n + 1}: lost ranks {r['lost']}; the round's exchange failed "
                  f"{(r['failed_at'] - killed_at[n]) * 1000:.0f} ms after the kill; back to "
                  f"training {r['seconds'] * 1000:.0f} ms after the failure", flush=True)
        for n in range(len(args.join)):
            started, joined = json.loads(store.get(f"elastic/joined/{n}"))
            print(f"join {n + 1}: admitted {(joined - started) * 1000:.0f} ms after the joiner "
                  f"started", flush=True)
        print(f"final: loss={loss:.6f} accuracy={acc:.6f} world_size={dist.get_world_size()} "
              f"rounds={opt.state.rounds} recoveries={len(opt.state.recoveries)} "
              f"joins={opt.state.admitted} "
              f"replica_spread={spread[0].item() + spread[1].item():.3g}", flush=True)
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if args.steps % args.period:
        sys.exit(f"--steps {args.steps} must be a multiple of --period {args.period}")
    store = dist.TCPStore("127.0.0.1", 0, args.nproc, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.timeout))
    ctx = mp.get_context("spawn")
    progress = ctx.Value("i", 0)
    procs = [ctx.Process(target=worker, args=(r, args, store.port, progress))
             for r in list(range(args.nproc)) + [-(i + 1) for i in range(len(args.join))]]
    for p in procs:
        p.start()
    kills, joins = list(args.kill), list(args.join)
    killed = set()
    deadline = time.monotonic() + args.timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if kills and progress.value >= kills[0][0]:
            rank = kills.pop(0)[1]
            store.set(f"elastic/killed_at/{len(killed)}", repr(time.time()))
            os.kill(procs[rank].pid, signal.SIGKILL)
            killed.add(rank)
        if joins and progress.value >= joins[0]:
            joins.pop(0)
            store.set(f"elastic/join_go/{len(args.join) - len(joins) - 1}", "1")
        if any(p.exitcode not in (None, 0) for r, p in enumerate(procs) if r not in killed):
            break
        time.sleep(0.002)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    bad = {r: p.exitcode for r, p in enumerate(procs) if r not in killed and p.exitcode != 0}
    if bad:
        print(f"elastic_diloco: ranks failed or timed out (exit codes {bad})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
