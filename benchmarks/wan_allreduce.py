"""Allreduce across emulated WAN hosts (benchmarks/wan/emulator.py): ringdist and gloo in the
same processes, alternating, on links of a given rate, round trip time and loss.

    python benchmarks/wan_allreduce.py --out benchmarks/results/wan_allreduce.json
    python benchmarks/wan_allreduce.py --hosts 2 --rtt 100ms --loss 0.001 --sizes 8 1M 16M \\
        --out benchmarks/results/wan_allreduce_loss.json

Per configuration (hosts x round trip x loss) the emulator brings the hosts up and checks them
(nothing is reported unless round trip, rate and loss are within 5% of their settings), then one
process per rank (--procs-per-host) joins a gloo world whose store is on host 0; it makes a
ringdist group and a gloo group of every rank. Per size: one correctness call per backend
(integer-valued fp32, exact sums), then --rounds rounds of a batch of back-to-back calls per
backend, the backends alternating (ringdist gloo ringdist gloo ...), each batch after a barrier
and one untimed call (the ranks leave a barrier up to several one-way trips apart, and the first
call after it would take that spread on top of its own time); a batch's time per call is the
slowest rank's. Reported: the median over the rounds, and that as
a fraction of the ideal

    ideal = 2(H-1)/H * 8S/R + 2d

(H hosts, S bytes, R the link rate in bits/s, d the one-way delay): the bytes every host's link
must carry in each direction, plus the two one-way trips of a direct exchange (a reduce-scatter
and an allgather of one round each), the fewest a bandwidth-optimal allreduce takes. The ring's
ideal, with its 2(H-1) trips, is kept beside it (`ring_ideal_s`; the results of commits before
the direct exchange were given against it). ringdist's route for each size is recorded from the
group (`allreduce_route`). With one rank per host H = N;
with several, ringdist's two-level allreduce crosses the hosts with one ring per local position,
whose transfers together carry what one ring of the hosts would (the ranks' work on their own
host is not counted). Small messages are also given in
one-way trips per call (time / d). Every TCP socket starts with cubic (the emulator's shim); the
socket limits are the system's. Results are JSON (with provenance), written after each
configuration; the line's counters (losses, queue drops, lateness) are kept with them.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "wan"))

import emulator  # noqa: E402

BACKENDS = ("ringdist", "gloo")  # the default --backends
# --backends variants of a backend: ringdist:plain is ringdist with RINGDIST_TCP_ENCRYPT=0 (what
# sealing the records costs), ringdist:ring, ringdist:direct, ringdist:halving and ringdist:pair
# with that RINGDIST_ROUTE (a route where the route model would take another), ringdist:cubic with
# RINGDIST_TCP_CONGESTION=cubic, ringdist:lanes1 with one TCP connection per peer
# (RINGDIST_TCP_LANES=1), ringdist:autobuf with the kernel's autotuned socket buffers, as an
# unprivileged process mostly gets (RINGDIST_TCP_BUFFER_BYTES=0); variants combine with +
# (ringdist:direct+cubic); measured
# alternating in the same processes.
VARIANT_ENV = {"plain": {"RINGDIST_TCP_ENCRYPT": "0"}, "ring": {"RINGDIST_ROUTE": "ring"},
               "direct": {"RINGDIST_ROUTE": "direct"},
               "halving": {"RINGDIST_ROUTE": "halving-doubling"},
               "cubic": {"RINGDIST_TCP_CONGESTION": "cubic"},
               "pair": {"RINGDIST_ROUTE": "pair"}, "lanes1": {"RINGDIST_TCP_LANES": "1"},
               "autobuf": {"RINGDIST_TCP_BUFFER_BYTES": "0"}}
PORT = 29700  # inside host 0's namespace: no other process on the machine can hold it
FORMULA = ("ideal = 2(H-1)/H * 8S/R + 2d  (H: hosts, R: link rate, d: one-way delay; "
           "ring ideal: 2(H-1)d)")
BROADCAST_FORMULA = "ideal = 8S/R + d  (R: link rate, d: one-way delay; the root sends every byte)"


def batch_for(nbytes):
    """Calls per timed batch: small messages back to back in a loop (per-call latency), large
    ones one at a time."""
    return 10 if nbytes < (64 << 10) else 3 if nbytes < (4 << 20) else 1


def ideal_s(nbytes, hosts, rate_bps, one_way_s, trips=2, op="allreduce"):
    """The bytes every host's link carries each way at the link's rate, plus `trips` one-way
    trips: 2 for the best allreduce of large messages (a direct exchange), 2(H-1) for a ring.
    A broadcast: the root sends every byte once, and the last arrives a one-way trip later."""
    if op == "broadcast":
        return 8 * nbytes / rate_bps + one_way_s
    return 2 * (hosts - 1) / hosts * 8 * nbytes / rate_bps + trips * one_way_s


# ---- one rank (in its emulated host) ----------------------------------------------------

def worker(args):
    import torch
    import torch.distributed as dist

    import torch_ringdist  # noqa: F401
    from bench_common import time_batches

    host, local = int(os.environ["WAN_HOST"]), int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WAN_HOSTS"]) * args.procs_per_host
    rank = host * args.procs_per_host + local
    os.environ.update(MASTER_ADDR=os.environ["WAN_ADDRS"].split(",")[0], MASTER_PORT=str(PORT),
                      GLOO_SOCKET_IFNAME=os.environ["WAN_IFNAME"])
    timeout = datetime.timedelta(seconds=args.op_timeout)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    def make_group(name):
        backend, _, variants = name.partition(":")
        env = {k: v for variant in filter(None, variants.split("+"))
               for k, v in VARIANT_ENV[variant].items()}
        os.environ.update(env)  # read when the group is made
        try:
            return dist.new_group(backend=backend, timeout=timeout)
        finally:
            for key in env:
                os.environ.pop(key)

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    backends = args.backends
    groups, group_s = {}, {}  # each group's creation (its connect), the slowest rank's
    for b in backends:
        dist.barrier()
        start = time.monotonic()
        groups[b] = make_group(b)
        group_s[b] = slowest(time.monotonic() - start)

    rows = []
    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        wrong = {}
        for b in backends:  # correctness, outside the timed batches (also a warm-up)
            t = torch.full((count,), float(rank + 1))
            if args.op == "broadcast":
                dist.broadcast(t, src=0, group=groups[b])
                wrong[b] = int((t != 1).sum())
            else:
                dist.all_reduce(t, group=groups[b])
                wrong[b] = int((t != world * (world + 1) / 2).sum())
        zeros = torch.zeros(count)  # stays zero however often it is summed
        if args.op == "broadcast":
            calls = {b: (lambda g=groups[b]: dist.broadcast(zeros, src=0, group=g))
                     for b in backends}
        else:
            calls = {b: (lambda g=groups[b]: dist.all_reduce(zeros, group=g)) for b in backends}
        batch = args.batch or batch_for(nbytes)
        times = time_batches(calls, args.rounds, batch, dist.barrier, slowest, lead=1)
        route = {b: groups[b]._get_backend(torch.device("cpu")).allreduce_route(count * 4)
                 for b in backends if b.startswith("ringdist") and args.op == "allreduce"}
        row = {"bytes": nbytes, "count": count, "batch": batch, "wrong": wrong, "route": route,
               "rounds_s": {b: [us / 1e6 for us in times[b]] for b in backends},
               "median_s": {b: statistics.median(times[b]) / 1e6 for b in backends},
               "group_s": group_s}
        rows.append(row)
        if rank == 0:
            print(f"N={world} {nbytes} B: " + "  ".join(
                f"{b} {row['median_s'][b] * 1e3:.1f} ms" for b in backends)
                + "".join(f"  ({b} route: {r['route']})" for b, r in route.items()), flush=True)
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def host_launcher(args, argv):
    """One host's ranks: --procs-per-host processes of this script; the first failure ends
    the others."""
    procs = [subprocess.Popen(argv, env=dict(os.environ, LOCAL_RANK=str(i)))
             for i in range(args.procs_per_host)]
    while True:
        codes = [p.poll() for p in procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad or all(c == 0 for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            return bad[0] if bad else 0
        time.sleep(0.1)


# ---- the orchestrator (root, outside the namespaces) ---------------------------------------

def run_config(args, hosts, rtt_s, loss):
    link = emulator.HostLink(rtt_s / 2, args.rate_bps, args.queue, loss)
    sizes = [s for s in args.sizes if not loss or s <= args.loss_max_bytes]
    world = hosts * args.procs_per_host
    print(f"\n== N={world} ({hosts} hosts x {args.procs_per_host}), {args.rate_bps / 1e9:g} Gbit/s, "
          f"RTT {rtt_s * 1e3:g} ms, loss {loss:g}", flush=True)
    load_before = os.getloadavg()[0]
    with emulator.Wan(hosts, link, timeout=args.config_timeout) as wan, \
            tempfile.TemporaryDirectory(prefix="wan_allreduce-") as tmp:
        result = os.path.join(tmp, "result.json")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--result", result,
                "--procs-per-host", str(args.procs_per_host), "--rounds", str(args.rounds),
                "--op-timeout", str(args.op_timeout), "--backends", *args.backends,
                *(["--batch", str(args.batch)] if args.batch else []), "--op", args.op,
                "--sizes", *map(str, sizes)]
        command = argv if args.procs_per_host == 1 else argv + ["--host-launcher"]
        logs = [os.path.join(tmp, f"h{i}.log") for i in range(hosts)]
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
            [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        started = time.monotonic()
        codes = wan.run(command, env=env, logs=logs, timeout=args.config_timeout)
        line = wan.line_stats()
        if any(codes) or not os.path.exists(result):
            for i, path in enumerate(logs):
                print(f"---- host {i} log tail\n" + open(path).read()[-3000:], file=sys.stderr)
            raise RuntimeError(f"ranks failed: exit codes {codes}")
        with open(result) as f:
            rows = json.load(f)
        print(open(logs[0]).read(), end="")
    from torch_ringdist import _C
    for row in rows:
        if args.procs_per_host == 1 and args.op == "allreduce":  # the model's prediction
            row["model_us"] = _C.allreduce_route_model(hosts, row["count"] * 4, int(rtt_s * 1e6),
                                                       args.rate_bps)
        row["ideal_s"] = ideal_s(row["bytes"], hosts, args.rate_bps, rtt_s / 2, op=args.op)
        row["ring_ideal_s"] = ideal_s(row["bytes"], hosts, args.rate_bps, rtt_s / 2,
                                      trips=2 * (hosts - 1))
        row["fraction_of_ideal"] = {b: row["ideal_s"] / row["median_s"][b] for b in args.backends}
        row["one_way_trips_per_call"] = {b: row["median_s"][b] / (rtt_s / 2) for b in args.backends}
    return {"op": args.op, "hosts": hosts, "procs_per_host": args.procs_per_host, "world": world,
            "rate_bps": args.rate_bps, "rtt_s": rtt_s, "loss": loss, "link": link.describe(),
            "rows": rows, "check": wan.check, "line_after": line,
            "seconds": time.monotonic() - started,
            "loadavg_1min_before": load_before, "loadavg_1min_after": os.getloadavg()[0]}


def line_health(cfg):
    """What the delay line did during the ranks' run (its counters after the run less those at
    the end of the self-check): writes, how many were over 1 ms and over 10 ms late (the line
    short of CPU: the times are then upper bounds), the latest since bring-up, and queue drops
    (the senders filling a link's queue: congestion, as on a real link)."""
    before, after = cfg["check"]["line"]["hosts"], cfg["line_after"]["hosts"]
    late = [sum(a["late"][b] - p["late"][b] for p, a in zip(before, after)) for b in range(5)]
    return {"writes": sum(a["written"] - p["written"] for p, a in zip(before, after)),
            "late_over_1ms": late[3] + late[4], "late_over_10ms": late[4],
            "late_max_ms": max(a["late_max_ns"] for a in after) / 1e6,
            "queue_drops": sum(a[k]["queue_drops"] - p[k]["queue_drops"]
                               for p, a in zip(before, after) for k in ("up", "down"))}


def predicted(row, route):
    us = row.get("model_us", {}).get(route + "_us")
    return f" ({float(us) / 1e3:.1f}ms)" if us else ""


def print_table(cfg):
    print(f"N={cfg['world']} RTT {cfg['rtt_s'] * 1e3:g} ms loss {cfg['loss']:g} "
          f"(load average {cfg['loadavg_1min_before']:.1f} -> {cfg['loadavg_1min_after']:.1f}); "
          + (BROADCAST_FORMULA if cfg.get("op") == "broadcast" else FORMULA))
    backends = list(cfg["rows"][0]["median_s"]) if cfg["rows"] else []
    print(f"{'size':>10} " + " ".join(f"{b:>14}" for b in backends) + f" {'ideal':>9} "
          + " ".join(f"{b + ' %':>14}" for b in backends) + f" {'trips/call':>11} {'#wrong':>7}  "
          "route (model's time for it, at the link's rate)")
    for r in cfg["rows"]:
        m, f = r["median_s"], r["fraction_of_ideal"]
        print(f"{r['bytes']:>10} " + " ".join(f"{m[b] * 1e3:>12.1f}ms" for b in backends)
              + f" {r['ideal_s'] * 1e3:>7.1f}ms "
              + " ".join(f"{100 * f[b]:>13.1f}%" for b in backends)
              + f" {r['one_way_trips_per_call'][backends[0]]:>11.2f} "
              f"{sum(r['wrong'].values()):>7}  "
              + " ".join(v["route"] + predicted(r, v["route"]) for v in r.get("route", {}).values()),
              flush=True)
    h = line_health(cfg)
    print(f"line during the run: {h['writes']} packets written, {h['late_over_1ms']} over 1 ms late "
          f"({100 * h['late_over_1ms'] / max(1, h['writes']):.2f}%), {h['late_over_10ms']} over 10 ms, "
          f"latest {h['late_max_ms']:.1f} ms; {h['queue_drops']} queue drops", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rtt", nargs="+", default=["100ms", "10ms"])
    ap.add_argument("--loss", type=float, nargs="+", default=[0.0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--queue", help="drop-tail queue per link (default: the emulator's, rate x RTT)")
    ap.add_argument("--sizes", nargs="+", default=["8", "1MiB", "16MiB", "64MiB"])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS),
                    help="measured alternating, in this order: ringdist, gloo, ringdist:plain "
                         "(RINGDIST_TCP_ENCRYPT=0), ringdist:ring, ringdist:direct, "
                         "ringdist:halving or ringdist:pair (RINGDIST_ROUTE=ring, direct, "
                         "halving-doubling, pair), ringdist:lanes1 (RINGDIST_TCP_LANES=1), "
                         "ringdist:autobuf (RINGDIST_TCP_BUFFER_BYTES=0), "
                         "ringdist:cubic (RINGDIST_TCP_CONGESTION=cubic); combined with +")
    ap.add_argument("--loss-max-bytes", default="16MiB",
                    help="largest size measured with loss (a cubic stream at 0.1%% loss and "
                         "100 ms moves ~1 MB/s)")
    ap.add_argument("--op", choices=["allreduce", "broadcast"], default="allreduce",
                    help="broadcast: from rank 0, its ideal 8S/R + d (the root sends every byte "
                         "once); no route or model is recorded")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int,
                    help="timed calls per batch (default: 10 below 64 KiB, 3 below 4 MiB, else 1)")
    ap.add_argument("--procs-per-host", type=int, default=1)
    ap.add_argument("--op-timeout", type=float, default=600)
    ap.add_argument("--config-timeout", type=float, default=1800)
    ap.add_argument("--out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--host-launcher", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [emulator.parse_size(s) for s in args.sizes]
    if args.host_launcher:
        argv = [a for a in sys.argv if a != "--host-launcher"]
        sys.exit(host_launcher(args, [sys.executable] + argv))
    if args.worker:
        return worker(args)

    from bench_common import write_json
    args.rate_bps = emulator.parse_rate(args.rate)
    args.queue = emulator.parse_size(args.queue) if args.queue else None
    args.loss_max_bytes = emulator.parse_size(args.loss_max_bytes)
    out = {"benchmark": "wan_allreduce", "dtype": "float32",
           "formula": FORMULA if args.op == "allreduce" else BROADCAST_FORMULA,
           "op": "sum" if args.op == "allreduce" else "broadcast",
           "rounds": args.rounds, "backends": args.backends, "tcp_congestion_start": "cubic",
           "configs": []}
    for loss in args.loss:
        for rtt in args.rtt:
            for hosts in args.hosts:
                cfg = run_config(args, hosts, emulator.parse_time(rtt), loss)
                out["configs"].append(cfg)
                print_table(cfg)
                if args.out:
                    write_json(args.out, out)


if __name__ == "__main__":
    main()
