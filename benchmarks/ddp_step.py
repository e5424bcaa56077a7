#!/usr/bin/env python3
"""DDP step benchmark: a communication-bound model trained for a fixed number of steps.

Run under torchrun, one process per rank:

    torchrun --nproc-per-node 2 benchmarks/ddp_step.py --backend ringdist --hook int8 \
        --hook-option error_feedback=true --steps 15 --warmup 8 --json out.json

The model is an MLP of three large float32 nn.Linear layers (1024 -> 4096 -> 4096 -> 1024,
25.2M parameters, 100.7 MB of gradients) on a small batch, so each step is dominated by
the gradient allreduce on a slow link. Data: a fixed random regression task (targets from
a fixed random "teacher" network), identical for every backend and hook.

Per step: a barrier, then forward + backward (DDP's communication included) + optimizer
step timed on every rank; the step's time is the slowest rank's (all_reduce MAX). The
report is the median over the measured steps. Bookkeeping (barriers, time exchange, loss
and byte tallies) runs on a separate gloo group, never on the backend under test.

Bytes on the wire per step: for ringdist, measured (bytes sent per rank, from
torch_ringdist.stats() before/after the measured steps, every op counted); for other
backends, the uncompressed ring estimate 2(N-1)/N x gradient bytes per rank.

--hook: for ringdist, any name in torch_ringdist.hooks.available(), registered with
torch_ringdist.hooks.register; "none" keeps DDP's own allreduce; "diloco_optimizer": no DDP,
torch_ringdist.hooks.DiLoCoOptimizer on the plain model (its options as --hook-option). Other
backends: "none".

--backend torchft-gloo / torchft-ringdist --hook diloco: torchft's own (Streaming) DiLoCo on the
plain model instead of DDP, each rank a replica group of its own with its torchft Manager (rank
0 also runs the lighthouse), its replica collectives on torchft's gloo group or on
torch_ringdist.torchft.ProcessGroupRingdist; options period, fragments (1, or 2: the outer two
layers and the middle one), tau (fragment_sync_delay) and, for ringdist, codec. The default group
is gloo and serves only the bookkeeping. Bytes then come from the network interface's transmit
counter (everything the rank's host sent, bookkeeping and TCP/IP headers included).
"""

import argparse
import datetime
import fcntl
import os
import random
import socket
import statistics
import struct
import sys
import time

# Before torch is imported: intra-op threads would compete with the backend's threads for
# the 2 cores and make runs incomparable.
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_common import machine_info, write_json  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def parse_option(text):
    """KEY=VALUE -> (key, int | float | bool | str)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--hook-option wants KEY=VALUE, got {text!r}")
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def make_model(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


def make_data(args, rank):
    """This rank's training batches and a held-out set shared by all ranks.

    Inputs and the teacher come from fixed seeds, so every backend and hook sees the same
    task; each rank draws its own inputs (seed + rank), as with a sharded data set.
    """
    g = torch.Generator().manual_seed(args.seed)
    teacher = torch.randn(args.d_in, args.d_out, generator=g) / args.d_in ** 0.5

    def targets(x):
        return torch.tanh(x @ teacher) + 0.01 * torch.randn(x.shape[0], args.d_out, generator=g)

    x_eval = torch.randn(args.eval_size, args.d_in, generator=g)
    y_eval = targets(x_eval)
    g.manual_seed(args.seed + 1 + rank)
    x = torch.randn(args.batches, args.batch, args.d_in, generator=g)
    y = targets(x.view(-1, args.d_in)).view(args.batches, args.batch, args.d_out)
    return x, y, x_eval, y_eval


def wire_bytes_sent(stats):
    """Bytes this rank sent, and the part of them to other hosts, summed over every op in a
    torch_ringdist.stats() dict."""
    return torch.tensor([sum(entry[key] for entry in stats.values())
                         for key in ("bytes_sent", "bytes_sent_across_hosts")], dtype=torch.float64)


def ring_bytes_estimate(grad_bytes, n):
    """Bytes one rank sends in an uncompressed ring allreduce of the gradients (gloo's)."""
    return 2 * (n - 1) / n * grad_bytes


def interface_address(ifname):
    """The IPv4 address of network interface `ifname` (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


def interface_tx_bytes(ifname):
    with open(f"/sys/class/net/{ifname}/statistics/tx_bytes") as f:
        return int(f.read())


def torchft_diloco(model, inner, args, rank, n, book):
    """torchft's DiLoCo over `model` (see the module's docstring): returns the entered DiLoCo
    context, its Manager, the replica group and the lighthouse (rank 0; else None)."""
    from torchft import Manager
    from torchft._torchft import LighthouseServer
    from torchft.local_sgd import DiLoCo
    from torchft.process_group import ProcessGroupGloo

    opts = dict(args.hook_options)
    timeout = datetime.timedelta(seconds=args.timeout)
    addr = interface_address(args.ifname)
    lighthouse = None
    where = [None]
    if rank == 0:
        lighthouse = LighthouseServer(bind="0.0.0.0:0", min_replicas=n)
        where[0] = f"http://{addr}:{lighthouse.address().rsplit(':', 1)[1]}"
    dist.broadcast_object_list(where, src=0, group=book)
    if args.backend == "torchft-ringdist":
        from torch_ringdist.torchft import ProcessGroupRingdist
        pg = ProcessGroupRingdist(timeout=timeout, codec=opts.pop("codec", None))
    else:
        pg = ProcessGroupGloo(timeout=timeout)
    store = dist.TCPStore(addr, 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=pg, min_replica_size=n, replica_id=f"replica{rank}", store_addr=addr,
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=where[0],
                      hostname=addr, port=0, timeout=timeout, use_async_quorum=False,
                      init_sync=False, load_state_dict=model.load_state_dict,
                      state_dict=model.state_dict)
    manager._bench_store = store  # the replica group's store lives as long as its manager
    fragments = {1: [model], 2: [nn.ModuleList([model[0], model[4]]), model[2]]}[
        opts.pop("fragments", 1)]
    outer = [torch.optim.SGD(f.parameters(), lr=0.7, momentum=0.9, nesterov=True)
             for f in fragments]
    diloco = DiLoCo(manager, fragments, inner, outer, sync_every=opts.pop("period"),
                    fragment_sync_delay=opts.pop("tau", 0))
    if opts:
        raise SystemExit(f"--backend {args.backend}: unknown --hook-option {sorted(opts)}")
    return diloco.__enter__(), manager, pg, lighthouse


# The model, data and optimizer options of add_model_args, by their argparse names (without the
# seed): what a caller forwards to run the same workload.
MODEL_ARGS = ("batch", "batches", "d_in", "hidden", "d_out", "eval_size", "lr")


def add_model_args(p, seed_flag="--seed"):
    """The model, data and optimizer options (MODEL_ARGS and the seed, named `seed_flag`); shared
    with hivemind_wan.py, whose peers train the same workload."""
    p.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    p.add_argument("--batches", type=int, default=16, help="distinct batches per rank (cycled)")
    p.add_argument("--d-in", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--d-out", type=int, default=1024)
    p.add_argument("--eval-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.0,
                   help="SGD learning rate (MSE over 1024 outputs has small gradients)")
    p.add_argument(seed_flag, type=int, default=0, help="weights and data")


def add_workload_args(p):
    """The backend, hook, model, data and DDP options (shared with ddp_timeline.py)."""
    p.add_argument("--backend", default="ringdist",
                   help="ringdist, gloo, torchft-gloo or torchft-ringdist (--hook diloco)")
    p.add_argument("--hook", default="none",
                   help="ringdist hook name (torch_ringdist.hooks.available()), "
                        "diloco_optimizer, or none")
    p.add_argument("--hook-option", dest="hook_options", action="append", default=[],
                   type=parse_option, metavar="KEY=VALUE", help="hook option (repeatable)")
    p.add_argument("--steps", type=int, default=15, help="measured steps")
    p.add_argument("--warmup", type=int, default=8,
                   help="unmeasured steps first (DDP rebuilds its buckets after step 1)")
    add_model_args(p)
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's own, 25 MiB buckets with a 1 MiB "
                        "first bucket; any value given also caps the first bucket, as in DDP)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the ranks spread over the GPUs (several per GPU when fewer GPUs); "
                        "each step ends with the GPU done")
    p.add_argument("--straggle", type=float, default=0,
                   help="the last rank sleeps a random 0..MS milliseconds at the start of each "
                        "step; also reports the other ranks' step time")
    p.add_argument("--ifname", default=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                   help="GLOO_SOCKET_IFNAME (gloo under test and the bookkeeping group)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p)
    p.add_argument("--timeout", type=float, default=300, help="process group timeout, seconds")
    p.add_argument("--label", help="name in the summary line (default backend/hook)")
    p.add_argument("--json", help="write results here (rank 0)")
    args = p.parse_args()
    args.hook_options = dict(args.hook_options)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (warm-up covers DDP's bucket rebuild)")

    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    torch.set_num_threads(1)
    if args.backend == "ringdist":
        try:
            import torch_ringdist
            import torch_ringdist.hooks as rd_hooks
        except ImportError as e:
            sys.exit(f"--backend ringdist needs torch_ringdist with its hooks subpackage: {e} "
                     "(an install without torch_ringdist/hooks: put a built checkout first on "
                     "PYTHONPATH; ddp_compare.py does that by itself)")
        known = ["none", "diloco_optimizer"] + list(rd_hooks.available())
        if args.hook not in known:
            p.error(f"--hook {args.hook!r}: not one of {', '.join(known)}")
    elif args.backend.startswith("torchft-"):
        if args.hook != "diloco":
            p.error(f"--backend {args.backend} runs torchft's DiLoCo: --hook diloco")
    elif args.hook != "none":
        p.error(f"--hook {args.hook} needs --backend ringdist (other backends: plain DDP)")
    torchft = args.backend.startswith("torchft-")

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(backend="gloo" if torchft else args.backend, timeout=timeout)
    book = dist.new_group(backend="gloo", timeout=timeout)
    rank, n = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts anyway)
    model = make_model(args.d_in, args.hidden, args.d_out).to(args.device)
    params = sum(t.numel() for t in model.parameters())
    grad_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    if torchft:  # torchft's DiLoCo wraps the plain model and the inner optimizer
        ddp = model
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        diloco, manager, replicas, lighthouse = torchft_diloco(model, opt, args, rank, n, book)
    elif args.hook == "diloco_optimizer":  # ringdist's DiLoCo on the plain model, as torchft's
        ddp = model
        opt = rd_hooks.DiLoCoOptimizer(model, torch.optim.SGD(model.parameters(), lr=args.lr),
                                       **args.hook_options)
    else:
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb,
                  device_ids=[torch.cuda.current_device()] if args.device == "cuda" else None)
        if args.hook != "none":
            rd_hooks.register(ddp, args.hook, **args.hook_options)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        model = ddp.module
    x, y, x_eval, y_eval = (t.to(args.device) for t in make_data(args, rank))
    loss_fn = nn.MSELoss()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def eval_loss():
        with torch.no_grad():
            return loss_fn(model(x_eval), y_eval).item()

    initial_eval = eval_loss()
    times, others, losses = [], [], []
    straggler = args.straggle > 0 and rank == n - 1
    late = random.Random(args.seed + 99)
    measured_bytes = None
    t_all = time.monotonic()
    for step in range(args.warmup + args.steps):
        if step == args.warmup and args.backend == "ringdist":
            before = wire_bytes_sent(torch_ringdist.stats())
        if step == args.warmup and torchft:
            tx_before = interface_tx_bytes(args.ifname)
        xb, yb = x[step % args.batches], y[step % args.batches]
        dist.barrier(group=book)
        t0 = time.perf_counter()
        if straggler:
            time.sleep(late.uniform(0, args.straggle) / 1e3)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xb), yb)
        loss.backward()  # returns once DDP's bucket allreduces (or hooks) have finished
        opt.step()
        sync()  # on a GPU: the step's kernels and copies done, not only queued
        dt = time.perf_counter() - t0
        # Slowest rank's time, the slowest non-straggler's, and the mean loss (bookkeeping group).
        tally = torch.tensor([dt, 0.0 if straggler else dt, loss.item() / n], dtype=torch.float64)
        dist.all_reduce(tally[:2], op=dist.ReduceOp.MAX, group=book)
        dist.all_reduce(tally[2:], op=dist.ReduceOp.SUM, group=book)
        losses.append(tally[2].item())
        if step >= args.warmup:
            times.append(tally[0].item())
            others.append(tally[1].item())
    wall = time.monotonic() - t_all

    if args.backend == "ringdist":
        sent = (wire_bytes_sent(torch_ringdist.stats()) - before) / args.steps
        dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=book)  # busiest rank (each count)
        measured_bytes, bytes_kind = sent[0].item(), "measured (torch_ringdist.stats, max over ranks)"
        across_hosts = sent[1].item()
        per_op = {k: v["bytes_sent"] for k, v in torch_ringdist.stats().items() if v["bytes_sent"]}
    elif torchft:
        sent = torch.tensor([(interface_tx_bytes(args.ifname) - tx_before) / args.steps],
                            dtype=torch.float64)
        dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=book)
        measured_bytes = across_hosts = sent.item()
        bytes_kind = "measured (the interface's tx_bytes, max over ranks; bookkeeping included)"
        per_op = None
    else:
        measured_bytes = ring_bytes_estimate(grad_bytes, n)
        bytes_kind = "estimate 2(N-1)/N x gradient bytes (uncompressed ring)"
        per_op = across_hosts = None
    ev = torch.tensor([eval_loss()], dtype=torch.float64)
    dist.all_reduce(ev, op=dist.ReduceOp.MAX, group=book)  # replicas should agree; MAX shows drift
    final_eval = ev.item()

    label = args.label or (args.backend if args.hook == "none" else f"{args.backend}/{args.hook}")
    median = statistics.median(times)
    if rank == 0:
        print(f"ddp_step {label}: N={n} params={params / 1e6:.1f}M median step "
              f"{median * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}; "
              f"{args.steps} steps after {args.warmup} warm-up) wire {measured_bytes / 1e6:.2f} "
              f"MB/step/rank{' (est.)' if bytes_kind.startswith('estimate') else ''} "
              f"loss {losses[-1]:.5f} eval {initial_eval:.5f} -> {final_eval:.5f}"
              + (f" others' median step {statistics.median(others) * 1e3:.1f} ms (straggle "
                 f"0..{args.straggle:g} ms)" if args.straggle else ""), flush=True)
        if args.json:
            out = {
                "machine": machine_info(),
                "label": label, "backend": args.backend, "hook": args.hook, "device": args.device,
                "hook_options": args.hook_options, "world_size": n,
                "model": {"params": params, "grad_bytes": grad_bytes,
                          "layers": [args.d_in, args.hidden, args.hidden, args.d_out],
                          "batch_per_rank": args.batch, "optimizer": f"SGD lr={args.lr}",
                          "bucket_cap_mb": args.bucket_cap_mb or "DDP default (25, first 1 MiB)"},
                "steps": args.steps, "warmup": args.warmup,
                "step_time_median_s": median, "step_times_s": times,
                "straggle_ms": args.straggle,
                "others_step_time_median_s": statistics.median(others),
                "wire_bytes_per_step": measured_bytes, "wire_bytes_kind": bytes_kind,
                "wire_bytes_across_hosts_per_step": across_hosts,
                "wire_bytes_by_op_total": per_op,
                "final_loss": losses[-1], "losses": losses,
                "eval_loss_initial": initial_eval, "eval_loss_final": final_eval,
                "wall_s": wall,
                "env": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith(("RINGDIST_", "RDBENCH_"))
                        or k in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME",
                                 "THP_MEM_ALLOC_ENABLE")},
            }
            write_json(args.json, out)
    dist.barrier(group=book)
    if torchft:
        diloco.__exit__(None, None, None)
        manager.shutdown(wait=False)
        replicas.shutdown()  # on every rank while every replica group's store is still up
        dist.barrier(group=book)  # every manager gone before the lighthouse goes
        if lighthouse is not None:
            lighthouse.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
