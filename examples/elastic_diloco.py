"""DiLoCo that survives a lost rank and admits a new one, without stopping.

    python examples/elastic_diloco.py --nproc 4 --kill 3@35 --join 75
    python examples/elastic_diloco.py --nproc 4 --stop 2@35 --exchange-timeout 1
    # several machines: run on each, node 0 first (it hosts the store)
    python examples/elastic_diloco.py --nnodes 2 --node-rank N --nproc 2 \
        --master-addr HOST0 --master-port 29600 --kill 3@35 --join 75

Starts --nproc ranks on this machine (node 0's launcher hosts the store, so any rank may die)
and trains the digits MLP with DiLoCo (``torch_ringdist.hooks.DiLoCoOptimizer``: AdamW inner
steps, outer Nesterov SGD every --period steps, int8 pseudo-gradients, ``on_failure="shrink"``).
``--kill RANK@STEP`` SIGKILLs the process of that (original, global) rank once this node's
training reaches STEP (the node that runs it acts; the rank waits at STEP for it, so the loss
lands there however busy the machine). The survivors' inner steps do not
communicate, so they notice at the next round: its exchange fails, they agree on who is gone,
shrink the group, redo that round's exchange among themselves with the pseudo-gradients they
had sent, and train on from where they are: nothing rolls back, no round runs twice.
``--stop RANK@STEP`` SIGSTOPs it instead: a peer that goes silent (hung, or its host cut off)
fails nothing, so the survivors' round waits --exchange-timeout seconds for its exchange, then
asks who is alive and drops whoever does not answer (the stopped process is killed at the end).
``--join STEP`` (node 0): a process started with the others, idle until training reaches STEP
(so its start-up is not in the figure), asks the job to be admitted (``DiLoCoOptimizer.join``;
node 0's ranks wait at STEP until it has asked); at the end of that period the ranks re-form
the group with it, hand it theta_global, the outer momentum and the step counter, and all
train on. Every step's global
batch is the same 64 samples, split over the ranks alive. Rank 0 prints each recovery (the kill,
the failed exchange, the redo done), each join (the joiner's request, its admission) and the
final loss and accuracy of the model every rank shares. Needs scikit-learn.
"""

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

from elastic_shrink import (Progress, connect, launch_parser, parse_launch_args, rank_steps, reap,
                            show_stacks_on_request)
from train_ddp import make_data, make_model

GLOBAL_BATCH = 64


def parse_args(argv=None):
    p = launch_parser(__doc__, wait=1.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--period", type=int, default=10, help="inner steps per round")
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate")
    p.add_argument("--codec", default="int8", help="pseudo-gradient codec ('none': exact)")
    p.add_argument("--stop", action="append", default=[], metavar="RANK@STEP",
                   help="SIGSTOP original rank RANK when training reaches STEP (repeatable)")
    p.add_argument("--exchange-timeout", type=float, default=None,
                   help="seconds a round waits for its exchange before it checks for silent "
                        "peers (DiLoCoState's exchange_timeout)")
    p.add_argument("--join", action="append", type=int, default=[], metavar="STEP",
                   help="a new process joins on node 0 when training reaches STEP (repeatable; "
                        "other nodes ignore it, so every node may get the same command)")
    p.add_argument("--send-ahead", action="store_true",
                   help="send a joiner the state while the period trains, then the round's "
                        "average (DiLoCoOptimizer's send_ahead)")
    args = parse_launch_args(p, argv)
    args.join = sorted(args.join) if args.node_rank == 0 else []
    # Losses by step: ("kill" or "stop", original rank).
    args.losses = sorted([(step, rank, "kill") for step, rank in args.kill] +
                         [(step, rank, "stop") for step, rank in rank_steps(args.stop)])
    return args


def batch(train_ds, step, seed):
    """This rank's rows of global batch ``step`` (the same 64 samples for any world size)."""
    per_epoch = len(train_ds) // GLOBAL_BATCH
    epoch, i = divmod(step, per_epoch)
    order = torch.randperm(len(train_ds), generator=torch.Generator().manual_seed(seed + epoch))
    rows = order[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH][dist.get_rank()::dist.get_world_size()]
    x, y = train_ds.tensors
    return x[rows], y[rows]


def worker(rank, args, port, progress, slot):
    """An original rank (rank >= 0) or a joiner (rank < 0)."""
    import torch_ringdist.hooks as hooks

    show_stacks_on_request()
    store = connect(args, port)
    store.add("elastic/alive", 1)  # node 0's launcher keeps the store until this is back to 0
    torch.manual_seed(args.seed)
    train_ds, test_ds = make_data(args.seed)
    model = make_model()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank < 0:
        store.wait([f"elastic/join_go/{-rank - 1}"])  # a rank at the join's step says when
        started = time.time()
        # join() files the request right after connecting a spare store client (milliseconds),
        # well before the ranks waiting on this key reach the period's end.
        store.set(f"elastic/asked/{-rank - 1}", "1")
        opt = hooks.DiLoCoOptimizer.join(model, inner, store, timeout=args.timeout)
        store.set(f"elastic/joined/{-rank - 1}", json.dumps([started, time.time()]))
    else:
        dist.init_process_group("ringdist", store=store, rank=rank, world_size=args.world,
                                timeout=timedelta(seconds=60))
        opt = hooks.DiLoCoOptimizer(model, inner, period=args.period, store=store,
                                    codec=None if args.codec == "none" else args.codec,
                                    on_failure="shrink", lost_wait=args.wait,
                                    exchange_timeout=args.exchange_timeout,
                                    send_ahead=args.send_ahead)
    # Events land at their steps however late the launcher looks: this rank waits at the step
    # of its loss for the launcher's signal, and node 0's ranks start each joiner at its step
    # and wait there until it has asked (so its request is counted where the step says).
    lost_at = {step for step, r, _ in args.losses if r == rank}
    joins_at = {step: n for n, step in enumerate(args.join)} if rank >= 0 else {}
    while opt.state.iteration < args.steps:  # an excluded rank rejoins at the job's step
        step = opt.state.iteration
        x, y = batch(train_ds, step, args.seed)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()  # every --period steps: the round (and, after a death, the recovery)
        progress.done(slot, step + 1)
        if step + 1 in joins_at:
            store.set(f"elastic/join_go/{joins_at[step + 1]}", "1")
            store.wait([f"elastic/asked/{joins_at[step + 1]}"])
        while step + 1 in lost_at:  # until the launcher's SIGKILL or SIGSTOP
            time.sleep(0.01)
    # After the last round (steps a multiple of --period) every survivor holds theta_global.
    with torch.no_grad():
        tx, ty = test_ds.tensors
        x, y = train_ds.tensors
        loss = F.cross_entropy(model(x), y).item()
        acc = (model(tx).argmax(dim=1) == ty).float().mean().item()
    spread = torch.tensor([loss, -loss], dtype=torch.float64)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        losses = store.add("elastic/kills", 0)
        lost_at = [store.get(f"elastic/killed_at/{n}").decode().split() for n in range(losses)]
        for n, r in enumerate(opt.state.recoveries):
            how, at = lost_at[n][0], float(lost_at[n][1])
            print(f"recovery {n + 1}: lost ranks {r['lost']}; the round's exchange failed "
                  f"{(r['failed_at'] - at) * 1000:.0f} ms after the {how}; back to "
                  f"training {r['seconds'] * 1000:.0f} ms after the failure", flush=True)
        for n in range(len(args.join)):
            # An admitted joiner writes this right after joining: a short wait, never a hang.
            try:
                store.wait([f"elastic/joined/{n}"], timedelta(seconds=30))
            except Exception:  # noqa: BLE001 (the store's timeout)
                print(f"join {n + 1}: not admitted (its request came after the last round)",
                      flush=True)
                continue
            started, joined = json.loads(store.get(f"elastic/joined/{n}"))
            print(f"join {n + 1}: admitted {(joined - started) * 1000:.0f} ms after the joiner "
                  f"started", flush=True)
        print(f"final: loss={loss:.6f} accuracy={acc:.6f} world_size={dist.get_world_size()} "
              f"rounds={opt.state.rounds} recoveries={len(opt.state.recoveries)} "
              f"join_requests={opt.state.admitted} "
              f"replica_spread={spread[0].item() + spread[1].item():.3g}", flush=True)
    dist.destroy_process_group()
    store.add("elastic/alive", -1)


def main(argv=None):
    args = parse_args(argv)
    if args.steps % args.period:
        sys.exit(f"--steps {args.steps} must be a multiple of --period {args.period}")
    # Node 0's launcher hosts the store: it outlives any rank.
    store = connect(args, args.master_port, is_master=args.node_rank == 0)
    ctx = mp.get_context("spawn")
    first = args.node_rank * args.nproc  # global rank of this node's first rank
    ranks = list(range(first, first + args.nproc)) + [-(i + 1) for i in range(len(args.join))]
    progress = Progress(ctx, len(ranks))
    procs = [ctx.Process(target=worker, args=(r, args, store.port, progress, slot))
             for slot, r in enumerate(ranks)]
    for p in procs:
        p.start()
    losses = [(step, rank - first, how) for step, rank, how in args.losses
              if first <= rank < first + args.nproc]
    killed = set()
    deadline = time.monotonic() + args.timeout
    # A stopped rank (killed set) is alive but out of the job: it is killed at the end.
    running = lambda ps: [p for i, p in ps if p.is_alive() and i not in killed]  # noqa: E731
    while running(enumerate(procs)) and time.monotonic() < deadline:
        if losses and progress.furthest() >= losses[0][0]:
            _, local, how = losses.pop(0)
            store.set(f"elastic/killed_at/{store.add('elastic/kills', 1) - 1}",
                      f"{how} {time.time()!r}")
            os.kill(procs[local].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            store.add("elastic/alive", -1)
            killed.add(local)
        if any(p.exitcode not in (None, 0) for i, p in enumerate(procs) if i not in killed):
            break
        if not running(enumerate(procs[:args.nproc])):
            # The training is over: nobody will admit a joiner still waiting (an admitted one
            # wrote its key and is only finishing).
            waiting = [n + 1 for n, p in enumerate(procs[args.nproc:])
                       if p.is_alive() and not store.check([f"elastic/joined/{n}"])]
            if waiting:
                print(f"elastic_diloco: joiner(s) {waiting} not admitted before the training "
                      f"ended", file=sys.stderr)
                break
        time.sleep(0.002)
    if not reap(procs, ranks, killed, "elastic_diloco"):
        return 1
    if args.node_rank == 0:  # the other nodes' ranks may still be finishing
        while store.add("elastic/alive", 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
