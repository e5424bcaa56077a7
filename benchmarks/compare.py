#!/usr/bin/env python3
"""Run sweep.py for several backends, alternating A B A B ..., and merge the rounds.

    python benchmarks/compare.py --backends ringdist gloo --rounds 3 --out cmp.json

Alternation matters on a shared 2-core machine: load from other users drifts over
minutes, and interleaving spreads that drift over both backends instead of one.

Each sweep is its own torchrun (fresh master port, bounded by --timeout, its process
group killed on timeout). Per size, the merged time is the median of the per-round
medians. Speedup = baseline time / backend time (> 1: faster than the baseline),
summarised as a geometric mean in three size bands.

Backends may repeat (`--backends gloo gloo` measures the noise floor); repeats get labels
gloo, gloo.2, ... and `label=backend` picks a label explicitly. `--label-env LABEL:KEY=VAL`
sets a variable for one label only, e.g. two builds of ringdist in one run:

    python benchmarks/compare.py --backends before=ringdist ringdist gloo --baseline before \
        --label-env before:PYTHONPATH=/path/to/old/build

--hosts N runs every sweep on N emulated hosts (netns_hosts.sh: one network namespace per
host, shaped at --rate) with --nproc ranks per host instead of on this host directly.

--peer mpi adds Open MPI (mpi_sweep.py under mpirun; setup: benchmarks/setup_mpi.sh) and
torch's dispatch floor (label "floor": sweep.py on torch's `fake` backend, which moves no
data between ranks, so its time is what torch itself costs per call; for allgather and
reduce_scatter it also copies the input into the output locally, a write any backend makes) to
the alternation. --load runs one CPU-bound process per rank beside every sweep (a busy data
loader, say).
"""

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time

from bench_common import end_session, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
SWEEP = os.path.join(HERE, "sweep.py")
MPI_SWEEP = os.path.join(HERE, "mpi_sweep.py")
NETNS = os.path.join(HERE, "netns_hosts.sh")

KIB, MIB = 1 << 10, 1 << 20
# Bands from BENCHMARKING.md: latency-bound, middle, bandwidth-bound.
BANDS = (("<= 64 KiB", 0, 64 * KIB), ("64 KiB..4 MiB", 64 * KIB + 1, 4 * MIB - 1),
         (">= 4 MiB", 4 * MIB, float("inf")))


def free_port():
    # Port 0 asks the kernel for an unused port; the tiny race until torchrun binds it is
    # acceptable, and a collision fails fast with a clear error rather than hanging.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def labels_for(specs):
    out, seen = [], {}
    for spec in specs:
        label, _, backend = spec.rpartition("=")
        if not label:
            seen[backend] = seen.get(backend, 0) + 1
            label = backend if seen[backend] == 1 else f"{backend}.{seen[backend]}"
        if label in [lbl for lbl, _ in out]:
            sys.exit(f"duplicate label {label!r}")
        out.append((label, backend))
    return out


def run_bounded(cmd, env, timeout, log_path):
    """Run cmd in its own process group; kill the whole group on timeout. Returns rc."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_session(proc, grace=20)
            return 124


def sweep_cmd(args, backend, json_path):
    sweep_args = ["--collective", args.collective, "--dtype", args.dtype,
                  "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
                  "--time-budget", str(args.time_budget), "--iters", str(args.iters),
                  "--json", json_path] + args.sweep_arg
    if backend == "mpi":
        if args.hosts:
            sys.exit("--peer mpi runs on this host only")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        # More ranks than cores (N=4 on 2 cores): mpirun refuses unless told, and then does not
        # bind, as torchrun does not.
        over = ["--oversubscribe"] if args.nproc > (os.cpu_count() or 1) else []
        return ["mpirun", "-n", str(args.nproc)] + root + over + [sys.executable, MPI_SWEEP] + sweep_args
    sweep_args = ["--backend", backend] + sweep_args
    if args.hosts:
        return ["bash", NETNS, "run", "--hosts", str(args.hosts), "--rate", args.rate,
                "--procs-per-host", str(args.nproc), "--timeout", str(max(10, int(args.timeout - 30))),
                "--", SWEEP] + sweep_args + ["--ifname", "eth0"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
            "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            SWEEP] + sweep_args + ["--ifname", args.ifname]


def start_load(n):
    """n CPU-bound processes (--load): each rank then shares its core, as beside a data loader."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in range(n)]


def stop_load(procs):
    for proc in procs:
        proc.kill()
        proc.wait()


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def merge(label, runs):
    """Per size: median of the per-round median times; keeps every round's value."""
    by_key = {}
    for run in runs:
        for row in run["rows"]:
            by_key.setdefault((row["count"], row["awkward"]), []).append(row)
    rows = []
    for (count, awkward), rs in sorted(by_key.items()):
        t = statistics.median(r["time_us"] for r in rs)
        factor = runs[0]["bus_factor"]
        nbytes = rs[0]["bytes"]
        algbw = nbytes / (t * 1e-6) / 1e9
        rows.append({"bytes": nbytes, "count": count, "awkward": awkward, "time_us": t,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                     "wrong": max(r["wrong"] for r in rs), "rounds": len(rs),
                     "round_times_us": [r["time_us"] for r in rs]})
    return rows


def band_of(nbytes):
    for name, lo, hi in BANDS:
        if lo <= nbytes <= hi:
            return name
    return None


def summarise(combined, baseline):
    """Per band: geomean speedup of each backend vs baseline, geomean busbw per backend."""
    res = combined["results"]
    base = {(r["count"], r["awkward"]): r for r in res[baseline]["rows"]}
    summary = {}
    for label, data in res.items():
        per_band = {}
        for name, _, _ in BANDS:
            rows = [r for r in data["rows"] if band_of(r["bytes"]) == name and r["wrong"] == 0]
            entry = {"rows": len(rows),
                     "busbw_geomean_GBps": geomean([r["busbw_GBps"] for r in rows])}
            if label != baseline:
                ratios = [base[k]["time_us"] / r["time_us"] for r in rows
                          if (k := (r["count"], r["awkward"])) in base and base[k]["wrong"] == 0]
                entry["speedup_geomean"] = geomean(ratios)
            per_band[name] = entry
        summary[label] = per_band
    return summary


def print_summary(combined, baseline):
    s = combined["summary"]
    print(f"\n== {combined['collective']} {combined['dtype']}  N={combined['world_size']}"
          f"  rounds={combined['rounds']}  baseline={baseline}"
          f"  (speedup = {baseline} time / backend time; busbw geomean GB/s)")
    head = f"{'backend':<14}" + "".join(f"{name:>26}" for name, _, _ in BANDS)
    print(head)
    for label, bands in s.items():
        cells = []
        for name, _, _ in BANDS:
            b = bands[name]
            if not b["rows"]:
                cells.append("-".rjust(26))  # band outside the swept range
                continue
            sp = f"x{b['speedup_geomean']:.3f} " if "speedup_geomean" in b else ""
            cells.append(f"{sp}{b['busbw_geomean_GBps']:.3g} GB/s ({b['rows']})".rjust(26))
        print(f"{label:<14}" + "".join(cells))
    wrong = {lbl: sum(r["wrong"] for r in d["rows"]) for lbl, d in combined["results"].items()}
    if any(wrong.values()):
        print(f"WARNING: wrong elements {wrong}: those rows are invalid and left out above")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=["ringdist", "gloo"],
                   help="backends (or label=backend) in alternation order")
    p.add_argument("--baseline", default="gloo", help="label the others are compared with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, help="ranks on this host (default 2); with --hosts, "
                   "ranks per emulated host (default 1; 2 for the mixed case)")
    p.add_argument("--collective", default="allreduce",
                   choices=("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--time-budget", type=float, default=1.0)
    p.add_argument("--ifname", default="lo", help="GLOO_SOCKET_IFNAME on this host")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                   help="extra environment for every sweep (e.g. RINGDIST_TRANSPORT=tcp)")
    p.add_argument("--label-env", action="append", default=[], metavar="LABEL:KEY=VAL",
                   help="environment variable for one label's sweeps only (repeatable)")
    p.add_argument("--sweep-arg", action="append", default=[],
                   help="extra argument passed verbatim to sweep.py (repeatable)")
    p.add_argument("--hosts", type=int, default=0, help="emulated hosts (netns); 0 = this host")
    p.add_argument("--rate", default="10gbit", help="link rate per emulated host (tc tbf)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per sweep")
    p.add_argument("--peer", choices=("mpi",), action="append", default=[],
                   help="also run this peer (mpi: Open MPI through mpi4py) and torch's "
                        "dispatch floor (label floor = backend fake) in the alternation")
    p.add_argument("--load", action="store_true",
                   help="a CPU-bound process per rank runs beside every sweep")
    p.add_argument("--out", default="compare.json")
    args = p.parse_args()
    for peer in args.peer:
        args.backends += [peer, "floor=fake"]

    if args.nproc is None:
        args.nproc = 1 if args.hosts else 2
    backends = labels_for(args.backends)
    if args.baseline not in [lbl for lbl, _ in backends]:
        sys.exit(f"--baseline {args.baseline!r} is not one of the labels "
                 f"{[lbl for lbl, _ in backends]}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
    for kv in args.env:
        key, sep, val = kv.partition("=")
        if not sep:
            sys.exit(f"--env wants KEY=VAL, got {kv!r}")
        env[key] = val
    label_env = {lbl: {} for lbl, _ in backends}
    for spec in args.label_env:
        label, _, kv = spec.partition(":")
        key, sep, val = kv.partition("=")
        if label not in label_env or not sep:
            sys.exit(f"--label-env wants LABEL:KEY=VAL with a label of --backends, got {spec!r}")
        label_env[label][key] = val
    workdir = os.path.splitext(os.path.abspath(args.out))[0] + ".runs"
    os.makedirs(workdir, exist_ok=True)

    runs = {lbl: [] for lbl, _ in backends}
    loads = {}
    for rnd in range(1, args.rounds + 1):
        for label, backend in backends:
            json_path = os.path.join(workdir, f"r{rnd}_{label}.json")
            log_path = os.path.join(workdir, f"r{rnd}_{label}.log")
            if os.path.exists(json_path):
                os.remove(json_path)  # never merge a stale result from an earlier run
            # Other users' load is the main noise source on shared 2-core machines: record it.
            load = os.getloadavg()[0]
            loads.setdefault(label, []).append(load)
            t0 = time.monotonic()
            hogs = start_load(args.nproc * max(1, args.hosts)) if args.load else []
            try:
                rc = run_bounded(sweep_cmd(args, backend, json_path),
                                 dict(env, **label_env[label]), args.timeout, log_path)
            finally:
                stop_load(hogs)
            took = time.monotonic() - t0
            if rc != 0 or not os.path.exists(json_path):
                print(f"round {rnd} {label}: FAILED rc={rc} after {took:.0f}s, see {log_path}")
                with open(log_path) as f:
                    lines = f.readlines()
                # torchrun's own report buries the cause; show the error lines first.
                cause = [ln for ln in lines if any(k in ln for k in (
                    "Error", "error:", "needs", "Exception", "timeout"))][:10]
                sys.stdout.write("".join(cause) + "---- log tail\n" + "".join(lines[-8:]))
                sys.exit(1)
            with open(json_path) as f:
                runs[label].append(json.load(f))
            print(f"round {rnd} {label:<12} {took:6.1f}s  avg busbw "
                  f"{runs[label][-1]['avg_busbw_GBps']:.3f} GB/s  (load avg at start "
                  f"{load:.2f})", flush=True)

    first = runs[backends[0][0]][0]
    combined = {
        "machine": first["machine"],
        "collective": args.collective,
        "dtype": args.dtype,
        "world_size": first["world_size"],
        "rounds": args.rounds,
        "baseline": args.baseline,
        "hosts": args.hosts or 1,
        "rate": args.rate if args.hosts else None,
        "load": args.load,
        "env": {kv.partition("=")[0]: kv.partition("=")[2] for kv in args.env},
        "label_env": label_env,
        "command": sys.argv,
        "results": {lbl: {"backend": be, "env": runs[lbl][0]["env"],
                          "checked": runs[lbl][0].get("checked", True),
                          "mpi_library": runs[lbl][0].get("mpi_library"),
                          "same_host_copy": [r.get("same_host_copy") for r in runs[lbl]],
                          # netns_hosts.sh checks the link before every sweep
                          "link_verified_gbitps": [r["env"].get("RDBENCH_VERIFIED_GBITPS")
                                                   for r in runs[lbl]] if args.hosts else None,
                          # ... and the ring of concurrent streams: the ring's real ceiling
                          "ring_verified_gbitps": [r["env"].get("RDBENCH_RING_GBITPS")
                                                   for r in runs[lbl]] if args.hosts else None,
                          "settings": runs[lbl][0]["settings"],
                          "loadavg_1min_at_start": loads[lbl],
                          "rows": merge(lbl, runs[lbl])}
                    for lbl, be in backends},
    }
    combined["summary"] = summarise(combined, args.baseline)
    write_json(args.out, combined)
    print_summary(combined, args.baseline)
    print(f"\nwrote {args.out} (per-round sweeps in {workdir})")


if __name__ == "__main__":
    main()
