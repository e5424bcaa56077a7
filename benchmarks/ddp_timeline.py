#!/usr/bin/env python3
"""Where a DDP step's time goes: forward, each bucket's hook call and completion, optimizer.

Run under netns_hosts.sh like ddp_step.py (same model, data and options):

    bash benchmarks/netns_hosts.sh run --hosts 2 --rate 1gbit -- \\
        benchmarks/ddp_timeline.py --hook int8 --ifname eth0

Rank 0 prints, per measured step, the times (ms from the step's start) at which the
forward ended, DDP called the hook for bucket i (Hi@call-return) and its future completed
(Di@), backward returned and the optimizer finished. With --hook delayed, Xi@ marks when
the exchange of bucket i started in an earlier step completed: while this step computed. The summary gives medians and the
wire-bound floor of this step:

    floor = first hook call + wire bytes per step / link rate + optimizer

No communication can start before DDP hands over the first bucket, the link cannot move
the step's bytes faster than its rate, and the optimizer runs after the last bucket. A
config's speedup over gloo cannot exceed gloo's step / this floor. The link rate is
RDBENCH_RING_GBITPS (set by netns_hosts.sh: a ring of concurrent streams) or --gbitps.

--backend gloo times DDP through torch's default allreduce hook (the same arithmetic and
collective as DDP without a hook), so its buckets can be seen too.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_step import (add_workload_args, make_data, make_model, ring_bytes_estimate,  # noqa: E402
                      wire_bytes_sent)


def tcp_retransmits():
    """TCP segments retransmitted in this network namespace so far (/proc/net/snmp)."""
    with open("/proc/self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])


def timed(hook, events, clock):
    """hook wrapped to log its call, its return and its future's completion; for the
    delayed hook also when the exchange it started completes (X: in a later step)."""
    def wrapper(state, bucket):
        index, called = bucket.index(), clock()
        fut = hook(state, bucket)
        events.append(("hook", index, called, clock()))
        queue = getattr(state, "pending", {}).get(index)
        if queue and not isinstance(queue[-1][0], torch.Tensor):
            queue[-1][0].then(lambda f: events.append(("exchanged", index, clock())))

        def done(f):
            events.append(("done", index, clock()))
            return f.value()
        return fut.then(done)
    return wrapper


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p)
    # Fewer steps, a small held-out set (unused here) and a hook to time by default.
    p.set_defaults(hook="allreduce", steps=10, warmup=6, eval_size=16)
    p.add_argument("--gbitps", type=float, help="link rate for the floor (default: measured)")
    args = p.parse_args()
    args.hook_options = dict(args.hook_options)
    if args.hook == "none":
        args.hook = "allreduce"  # DDP's own arithmetic, through a hook that can be timed

    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(backend=args.backend, timeout=timeout)
    book = dist.new_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    ddp = DDP(make_model(args.d_in, args.hidden, args.d_out), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    events, t0 = [], [0.0]

    def clock():
        return (time.perf_counter() - t0[0]) * 1e3

    if args.backend == "ringdist":
        import torch_ringdist
        import torch_ringdist.hooks as rd_hooks
        state = rd_hooks.make_state(args.hook, **args.hook_options)
        state.bind(ddp)
        ddp.register_comm_hook(state, timed(getattr(rd_hooks, f"{args.hook}_hook"), events, clock))
        label = f"ringdist/{args.hook}"
    else:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, timed(default_hooks.allreduce_hook, events, clock))
        label = args.backend
    x, y, _, _ = make_data(args, rank)
    loss_fn = nn.MSELoss()

    rows = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            retrans_before = tcp_retransmits()
            if args.backend == "ringdist":
                before = wire_bytes_sent(torch_ringdist.stats())
        xb, yb = x[step % args.batches], y[step % args.batches]
        dist.barrier(group=book)
        events.clear()
        t0[0] = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = ddp(xb)
        fwd = clock()
        loss_fn(out, yb).backward()
        bwd = clock()
        opt.step()
        rows.append({"forward": fwd, "backward_end": bwd, "optimizer": clock() - bwd,
                     "first_hook": min(e[2] for e in events if e[0] == "hook"),
                     "events": list(events)})
    rows = rows[args.warmup:]
    retrans = torch.tensor([tcp_retransmits() - retrans_before], dtype=torch.float64)
    dist.all_reduce(retrans, group=book)  # every host's namespace (bookkeeping traffic included)
    if args.backend == "ringdist":
        wire = (wire_bytes_sent(torch_ringdist.stats()) - before) / args.steps
    else:
        grad_bytes = sum(t.numel() * t.element_size() for t in ddp.parameters())
        wire = ring_bytes_estimate(grad_bytes, dist.get_world_size())
    gbitps = args.gbitps or float(os.environ.get("RDBENCH_RING_GBITPS", "nan"))

    if rank == 0:
        for i, r in enumerate(rows):
            marks = " ".join(f"H{e[1]}@{e[2]:.1f}-{e[3]:.1f}" if e[0] == "hook"
                             else f"{'D' if e[0] == 'done' else 'X'}{e[1]}@{e[2]:.1f}"
                             for e in r["events"])
            print(f"step {i}: fwd {r['forward']:.1f} | {marks} | bwd_end {r['backward_end']:.1f}"
                  f" opt {r['optimizer']:.1f}")
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("forward", "first_hook", "backward_end", "optimizer")}
        wire_ms = wire * 8 / (gbitps * 1e9) * 1e3
        step = statistics.median(r["backward_end"] + r["optimizer"] for r in rows)
        floor = med["first_hook"] + wire_ms + med["optimizer"]
        print(f"timeline {label}: median step {step:.1f} ms = forward {med['forward']:.1f}, "
              f"first hook at {med['first_hook']:.1f}, backward returns {med['backward_end']:.1f}, "
              f"optimizer {med['optimizer']:.1f}; wire {wire / 1e6:.2f} MB/step at {gbitps:.3f} "
              f"Gbit/s = {wire_ms:.1f} ms; floor {floor:.1f} ms (step/floor {step / floor:.3f}); "
              f"TCP retransmits {retrans.item() / args.steps:.0f}/step (all hosts)",
              flush=True)
    dist.barrier(group=book)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
