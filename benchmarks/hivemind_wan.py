#!/usr/bin/env python3
"""hivemind's decentralised averaging on the DDP benchmark model across the WAN emulator.

    python benchmarks/hivemind_wan.py --python /path/to/hivemind-env/bin/python --hosts 4 \
        --rate 100mbit --delay 50ms --loss 0.001 --period 50 --codec uint8 \
        --out benchmarks/data/hivemind_wan_n4.json

One peer per emulated host (this file with --peer, run by --python: an environment with
hivemind 1.1.12 and torch; hivemind pins its own protobuf and grpc, so it is kept apart from the
one that runs ringdist). Every peer trains ddp_step.py's MLP (25.2M parameters) on its data with
its SGD: first --steps steps without communication (L, in the same process), then --steps steps
where the parameters are averaged every --period steps by hivemind's DecentralizedAverager over
a group of every host. As hivemind.Optimizer does, matchmaking is scheduled --lead steps before
the round's end and the all-reduce is triggered at it. That is DiLoCo with outer learning rate 1
and no momentum (plain parameter averaging); the time and bytes do not depend on the outer step.

Reported per host: the mean step time over the measured steps with and without averaging, the
bytes its interface sent per step (TCP/IP headers and hivemind's DHT traffic included), and
whether every round averaged with the whole group (every peer's every part arrived: hivemind
otherwise warns and averages what came); the run's step is the slowest host's. Then,
on the same hosts, --ringdist's configurations of ddp_compare.py (by default ringdist's
DiLoCoOptimizer on the same plain model: ddp_step.py's mean step of the slowest rank; the first
without communication, ringdist's L), with the bytes each rank sent to other hosts as
torch_ringdist.stats() counts them.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "wan"))

PORT = 31337  # every host listens on its own address, in its own namespace
CODECS = ("none", "fp16", "uint8")
# hivemind's warning when an all-reduce went on without some peers' parts: it then averages
# what arrived, and the round is not the group's average.
PARTIAL = "[hivemind.averaging.partition.finalize"


def compression(name):
    from hivemind.compression import Float16Compression, NoCompression, Uniform8BitQuantization

    return {"none": NoCompression, "fp16": Float16Compression,
            "uint8": Uniform8BitQuantization}[name]()


def start_dht(host, addr, rendezvous, timeout):
    """Host 0 starts the DHT and writes its addresses for the others, who join through them."""
    import hivemind

    maps = {"host_maddrs": [f"/ip4/0.0.0.0/tcp/{PORT}"],
            "announce_maddrs": [f"/ip4/{addr}/tcp/{PORT}"]}
    path = os.path.join(rendezvous, "host0.maddrs")
    if host == 0:
        dht = hivemind.DHT(start=True, **maps)
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(str(m) for m in dht.get_visible_maddrs()))
        os.rename(path + ".tmp", path)
        return dht
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"host {host}: host 0's DHT addresses not written in {timeout} s")
        time.sleep(0.1)
    with open(path) as f:
        return hivemind.DHT(initial_peers=f.read().split(), start=True, **maps)


def peer(args):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.nn as nn
    from ddp_step import interface_tx_bytes, make_data, make_model
    from hivemind.averaging import DecentralizedAverager
    from hivemind.utils import get_dht_time

    torch.set_num_threads(1)
    host, n = int(os.environ["WAN_HOST"]), int(os.environ["WAN_HOSTS"])
    addr, ifname = os.environ["WAN_ADDRS"].split(",")[host], os.environ["WAN_IFNAME"]
    dht = start_dht(host, addr, args.rendezvous, args.round_timeout)
    args.seed = args.model_seed  # what make_data reads
    torch.manual_seed(args.seed)
    model = make_model(args.d_in, args.hidden, args.d_out)
    params = list(model.parameters())
    averager = DecentralizedAverager([p.detach().clone() for p in params], dht, prefix="bench",
                                     target_group_size=n, min_group_size=n,
                                     min_matchmaking_time=args.matchmaking_s,
                                     request_timeout=args.request_timeout_s,
                                     compression=compression(args.codec), start=True)
    opt = torch.optim.SGD(params, lr=args.lr)
    x, y, _, _ = make_data(args, host)
    loss_fn = nn.MSELoss()

    def train(step):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[step % args.batches]), y[step % args.batches]).backward()
        opt.step()

    def timed(steps, after_step):
        times = []
        for step in range(steps):
            t0 = time.perf_counter()
            train(step)
            after_step(step + 1)
            times.append(time.perf_counter() - t0)
        return times

    for step in range(args.warmup):
        train(step)
    alone = timed(args.steps, lambda local: None)
    control, rounds = [None], []

    def average(local):
        if local % args.period == args.period - args.lead:
            control[0] = averager.step(wait=False, require_trigger=True, timeout=args.round_timeout,
                                       scheduled_time=get_dht_time() + args.matchmaking_s)
        if local % args.period:
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            with averager.get_tensors() as tensors:
                for a, p in zip(tensors, params):
                    a.copy_(p)
            control[0].allow_allreduce()
            group = control[0].result(timeout=args.round_timeout)
            with averager.get_tensors() as tensors:
                for a, p in zip(tensors, params):
                    p.copy_(a)
        rounds.append({"seconds": time.perf_counter() - t0,
                       "group": len(group) if group is not None else 0})

    tx = interface_tx_bytes(ifname)
    averaging = timed(args.steps, average)
    sent = (interface_tx_bytes(ifname) - tx) / args.steps
    result = {"host": host, "step_s": statistics.fmean(averaging),
              "alone_step_s": statistics.fmean(alone), "bytes_per_step": sent, "rounds": rounds,
              "params": sum(p.numel() for p in params)}
    with open(os.path.join(args.rendezvous, f"host{host}.json"), "w") as f:
        json.dump(result, f)
    averager.shutdown()
    dht.shutdown()


RINGDIST_CONFIGS = ("nocomm=ringdist:diloco_optimizer:period=1000000000",
                    "int8=ringdist:diloco_optimizer:period=50,codec=int8",
                    "streaming_int4=ringdist:diloco_optimizer:period=50,codec=int4,fragments=4,"
                    "overlap=streaming,tau=2")


def run_hivemind(wan, args, argv, stem):
    """The hivemind peers, one per host: their results, in host order."""
    rendezvous = stem + ".rendezvous"
    shutil.rmtree(rendezvous, ignore_errors=True)  # never an earlier run's addresses
    os.makedirs(rendezvous)
    argv_peer = [args.python, os.path.abspath(__file__), "--peer", "--rendezvous", rendezvous]
    argv_peer += [a for a in argv if a != "--peer"]
    logs = [f"{stem}.hivemind.h{i}.log" for i in range(args.hosts)]
    codes = wan.run(argv_peer, env={"OMP_NUM_THREADS": "1"}, logs=logs)
    if any(codes):
        sys.exit(f"a hivemind peer failed (exit codes {codes}); logs: {logs}")
    hosts = []
    for i in range(args.hosts):
        with open(os.path.join(rendezvous, f"host{i}.json")) as f:
            hosts.append(json.load(f))
        # The all-reduce runs in the averager's own process, which logs to this file.
        with open(logs[i]) as f:
            hosts[-1]["partial_warnings"] = sum(PARTIAL in line for line in f)
    step = max(h["step_s"] for h in hosts)
    alone = max(h["alone_step_s"] for h in hosts)
    return {"step_s": step, "alone_step_s": alone, "utilisation": alone / step,
            "bytes_per_step": max(h["bytes_per_step"] for h in hosts),
            "every_round_whole_group": all(r["group"] == args.hosts and not h["partial_warnings"]
                                           for h in hosts for r in h["rounds"]),
            "hosts": hosts}


def run_ringdist(wan, args, spec, stem):
    """One ddp_compare.py configuration (ddp_step.py, a torchrun per host) on the same hosts."""
    import ddp_compare
    from ddp_step import MODEL_ARGS

    cfg = ddp_compare.parse_config(spec)
    model = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in MODEL_ARGS]
    step_args = argparse.Namespace(hosts=args.hosts, nproc=1, timeout=args.round_timeout * 5,
                                   steps=args.steps, warmup=args.period,
                                   step_arg=model + [f"--seed={args.model_seed}"])
    json_path, log_path = f"{stem}.{cfg['label']}.json", f"{stem}.{cfg['label']}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if ddp_compare.run_on_wan(wan, step_args, cfg, json_path, log_path, env) != 0:
        sys.exit(f"ringdist {cfg['label']} failed: see {log_path}")
    with open(json_path) as f:
        res = json.load(f)
    return {"label": cfg["label"], "options": cfg["options"],
            "step_s": statistics.fmean(res["step_times_s"]),
            "bytes_per_step": res["wire_bytes_across_hosts_per_step"], "result": res}


def main(argv=None):
    import emulator
    from bench_common import machine_info, write_json
    from ddp_step import add_model_args

    argv = argv if argv is not None else sys.argv[1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rendezvous", help=argparse.SUPPRESS)
    p.add_argument("--python", default=sys.executable, help="a Python with hivemind and torch")
    emulator.add_link_args(p)  # --hosts, --delay, --rate, --loss, --cc, --timeout (the run's)
    p.add_argument("--period", type=int, default=50, help="inner steps per averaging round")
    p.add_argument("--lead", type=int, default=5, help="steps before a round's end at which "
                                                       "its matchmaking starts")
    p.add_argument("--matchmaking-s", type=float, default=1.0,
                   help="hivemind's min_matchmaking_time (its default: 5 s)")
    p.add_argument("--request-timeout-s", type=float, default=3.0)
    p.add_argument("--codec", choices=CODECS, default="none",
                   help="hivemind's compression: none, Float16Compression, Uniform8BitQuantization")
    p.add_argument("--ringdist", nargs="*", default=list(RINGDIST_CONFIGS),
                   help="ddp_compare.py configurations run on the same hosts after hivemind's "
                        "(the first: no communication, ringdist's L)")
    p.add_argument("--steps", type=int, default=100, help="measured steps in each phase")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--round-timeout", type=float, default=120,
                   help="seconds for a round, and for joining the DHT")
    add_model_args(p, seed_flag="--model-seed")  # ddp_step's; --seed is the delay line's
    p.add_argument("--out", default="hivemind_wan.json")
    args = p.parse_args(argv)
    if args.peer:
        return peer(args)
    if args.steps % args.period or not 0 < args.lead < args.period:
        p.error("--steps must be a multiple of --period, and 0 < --lead < --period")

    t_start = time.monotonic()
    stem = os.path.splitext(os.path.abspath(args.out))[0] + ".run"
    with emulator.Wan(args.hosts, emulator.links_from_args(args), timeout=args.timeout,
                      cc=args.cc) as wan:
        hm = run_hivemind(wan, args, argv, stem)
        ours = [run_ringdist(wan, args, spec, stem) for spec in args.ringdist]
        check = wan.check
    alone = ours[0]["step_s"]
    for c in ours:
        c["utilisation"] = alone / c["step_s"]
    write_json(args.out, {"machine": machine_info(), "command": [sys.argv[0]] + argv,
                          "wan_check": check, "options": vars(args), "hivemind": hm,
                          "ringdist": ours, "wall_s": time.monotonic() - t_start})
    print(f"{args.hosts} hosts, period {args.period}, mean step (L/step), bytes sent per step "
          "by the busiest host:")
    print(f"  hivemind, {args.codec}: {hm['step_s'] * 1e3:.0f} ms ({hm['utilisation']:.2f} of its "
          f"{hm['alone_step_s'] * 1e3:.0f} ms), {hm['bytes_per_step'] / 1e6:.2f} MB; every round "
          f"with the whole group: {hm['every_round_whole_group']}")
    for c in ours:
        print(f"  ringdist {c['label']}: {c['step_s'] * 1e3:.0f} ms ({c['utilisation']:.2f}), "
              f"{c['bytes_per_step'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
