#!/usr/bin/env python3
"""DDP step benchmark on emulated hosts: gloo vs ringdist hooks, alternating A B A B ...

    python benchmarks/ddp_compare.py --hosts 2 --rate 1gbit --rounds 2 \
        --out benchmarks/results/ddp_1g_n2.json

Checks the link first (netns_hosts.sh verify), then runs benchmarks/ddp_step.py once per
config and round, each as its own `netns_hosts.sh run` (one torchrun per emulated host,
one rank per host by default), bounded by --timeout with its process group killed on
expiry. Configs alternate within every round so load drift on the shared 2 cores spreads
over all of them. Per config, the step time is the median over all measured steps of all
rounds (each step: the slowest rank); speedup = gloo median / config median.

Configs are LABEL=BACKEND:HOOK[:KEY=VAL,KEY=VAL]; the default set is gloo (plain DDP),
ringdist without a hook, and the bf16, int8 and top-k 1% (error feedback) hooks. Ends by
checking that no network namespace of the run is left (`ip netns list`).

--rtt (and --loss): the hosts are joined by the WAN emulator (benchmarks/wan/emulator.py: per
host link one-way delay rtt/2, --rate and random loss, every socket starting on cubic) instead of
netns_hosts.sh's rate-only links; its self-check replaces the link check.

--algo diloco: the default set becomes gloo, the int8 hook, DiLoCo with int8 pseudo-gradients
every --period steps, and `nocomm` (DiLoCo whose first round lies beyond the run: the step with
no communication, L); the statistic becomes the mean step (the amortised cost of a round every
--period steps), and --steps must be a multiple of --period, so every run holds the same number
of rounds.
"""

import argparse
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

from bench_common import write_json
from compare import run_bounded  # same folder: one bounded, process-group-killing runner

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "wan"))
import emulator  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STEP = os.path.join(HERE, "ddp_step.py")
NETNS = os.path.join(HERE, "netns_hosts.sh")

DEFAULT_CONFIGS = (
    "gloo=gloo:none",
    "ringdist=ringdist:none",
    "bf16=ringdist:bf16",
    "int8=ringdist:int8",
    "topk1%=ringdist:topk:ratio=0.01,error_feedback=true",
)


def diloco_configs(period):
    return ("gloo=gloo:none", "int8=ringdist:int8",
            f"diloco=ringdist:diloco:period={period},codec=int8",
            "nocomm=ringdist:diloco:period=1000000000")


def parse_config(spec):
    label, sep, rest = spec.partition("=")
    if not sep:
        sys.exit(f"config {spec!r}: want LABEL=BACKEND:HOOK[:KEY=VAL,...]")
    backend, _, rest = rest.partition(":")
    hook, _, opts = rest.partition(":")
    options = [o for o in opts.split(",") if o]
    return {"label": label, "backend": backend, "hook": hook or "none", "options": options}


def our_namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("rdbench-")]


def verify_link(args, env):
    cmd = ["bash", NETNS, "verify", "--hosts", str(args.hosts), "--rate", args.rate]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    lines = [ln for ln in r.stderr.splitlines() if "verify:" in ln or "WARNING" in ln]
    for ln in lines:
        print(ln)
    # The figure is only in the report on stderr ("... one TCP stream: 0.955 Gbit/s ...").
    m = re.search(r"one TCP stream: ([0-9.]+) Gbit/s", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"netns_hosts.sh verify failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
    return float(m.group(1)), lines


def step_cmd(args, cfg, json_path):
    return ["bash", NETNS, "run", "--hosts", str(args.hosts), "--rate", args.rate,
            "--procs-per-host", str(args.nproc), "--verify-seconds", "1",
            "--timeout", str(max(30, int(args.timeout - 30))), "--",
            STEP] + step_args(args, cfg, json_path, "eth0")


def step_args(args, cfg, json_path, ifname):
    """ddp_step.py's arguments for one config."""
    out = ["--backend", cfg["backend"], "--hook", cfg["hook"], "--label", cfg["label"],
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--ifname", ifname,
           "--json", json_path]
    for opt in cfg["options"]:
        out += ["--hook-option", opt]
    return out + args.step_arg


def wan_link(args):
    return emulator.HostLink(emulator.parse_time(args.rtt) / 2, emulator.parse_rate(args.rate),
                             loss=args.loss)


def wan_check(wan):
    """The emulator's self-check as netns_hosts.sh verify's (Gbit/s, lines)."""
    rates = [r["measured"] for r in wan.check["rate"]]
    lines = [f"wan self-check: {json.dumps({k: wan.check[k] for k in ('rtt', 'rate', 'loss')})}"]
    return min(rates) / 1e9, lines


def run_on_wan(wan, args, cfg, json_path, log_path, env):
    """One run of ddp_step.py: a torchrun per emulated host (node rank = host), rank 0's host
    writing json_path; returns the worst exit code (124 on timeout). Each host's log goes to
    log_path.h<i>, host 0's also to log_path."""
    port = 29500 + os.getpid() % 1000
    argvs = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.hosts),
              "--node-rank", str(i), "--nproc-per-node", str(args.nproc),
              "--master-addr", wan.addrs[0], "--master-port", str(port), STEP]
             + step_args(args, cfg, json_path, emulator.IFNAME) for i in range(args.hosts)]
    logs = [f"{log_path}.h{i}" for i in range(args.hosts)]
    try:
        codes = wan.run(argvs, env=env, timeout=args.timeout, logs=logs)
    except TimeoutError:
        codes = [124]
    with open(logs[0]) as src, open(log_path, "w") as dst:
        dst.write(src.read())
    return max(codes)


def summarise(configs, runs, baseline, stat):
    base = stat([t for r in runs[baseline] for t in r["step_times_s"]])
    rows = []
    for cfg in configs:
        rs = runs[cfg["label"]]
        med = stat([t for r in rs for t in r["step_times_s"]])
        finals = [r["final_loss"] for r in rs]
        across = [r.get("wire_bytes_across_hosts_per_step") for r in rs]  # None: not measured
        rows.append({
            "label": cfg["label"], "backend": cfg["backend"], "hook": cfg["hook"],
            "options": cfg["options"], "step_time_s": med,  # the --statistic of all steps
            "round_step_times_s": [stat(r["step_times_s"]) for r in rs],
            "speedup_vs_" + baseline: base / med,
            "wire_bytes_per_step": statistics.fmean(r["wire_bytes_per_step"] for r in rs),
            "wire_bytes_across_hosts_per_step": None if None in across else statistics.fmean(across),
            "straggle_ms": rs[0].get("straggle_ms", 0),
            "others_step_time_median_s": statistics.median(
                r.get("others_step_time_median_s", r["step_time_median_s"]) for r in rs),
            "wire_bytes_kind": rs[0]["wire_bytes_kind"],
            "final_loss": finals[0], "final_loss_rounds": finals,
            "eval_loss_final": rs[0]["eval_loss_final"],
            "link_verified_gbitps": [r["env"].get("RDBENCH_VERIFIED_GBITPS") for r in rs],
        })
    return rows


def table(rows, baseline, hosts, rate, stat_name):
    straggle = any(r.get("straggle_ms") for r in rows)
    out = [f"| config | {stat_name} step (ms) | speedup vs {baseline} | bytes/step/rank | final loss |"
           + (" other ranks' step (ms) |" if straggle else ""),
           "|---|---:|---:|---:|---:|" + ("---:|" if straggle else "")]
    for r in rows:
        est = " (est.)" if r["wire_bytes_kind"].startswith("estimate") else ""
        spread = "/".join(f"{t * 1e3:.0f}" for t in r["round_step_times_s"])
        loss = f"{r['final_loss']:.5f}"
        if len(set(r["final_loss_rounds"])) > 1:  # should be deterministic: show if not
            loss += " (" + "/".join(f"{x:.5f}" for x in r["final_loss_rounds"]) + ")"
        out.append(f"| {r['label']} | {r['step_time_s'] * 1e3:.0f} (rounds {spread}) | "
                   f"x{r['speedup_vs_' + baseline]:.2f} | "
                   f"{r['wire_bytes_per_step'] / 1e6:.2f} MB{est} | {loss} |"
                   + (f" {r['others_step_time_median_s'] * 1e3:.0f} |" if straggle else ""))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                   help="LABEL=BACKEND:HOOK[:KEY=VAL,...] in alternation order")
    p.add_argument("--baseline", default="gloo", help="label speedups are relative to")
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (network namespaces)")
    p.add_argument("--nproc", type=int, default=1, help="ranks per emulated host")
    p.add_argument("--rate", default="1gbit", help="link rate per host and direction (tc tbf)")
    p.add_argument("--rtt", help="join the hosts by the WAN emulator with this round trip "
                                 "(e.g. 100ms) instead of netns_hosts.sh")
    p.add_argument("--loss", type=float, default=0.0, help="with --rtt: random loss per link")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=15, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=8, help="warm-up steps per run")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    p.add_argument("--step-arg", action="append", default=[],
                   help="extra argument passed verbatim to ddp_step.py (repeatable)")
    p.add_argument("--thp", type=int, choices=(0, 1), default=1,
                   help="THP_MEM_ALLOC_ENABLE for every config (torch's huge-page CPU "
                        "allocator; 0: glibc pages, each step then page-faults its fresh "
                        "67 MB weight gradient)")
    p.add_argument("--out", default="ddp_compare.json")
    p.add_argument("--md", help="also write the table (markdown) here")
    p.add_argument("--algo", choices=("ddp", "diloco"), default="ddp",
                   help="diloco: the DiLoCo config set, mean step times (see above)")
    p.add_argument("--period", type=int, default=50, help="--algo diloco: inner steps per round")
    p.add_argument("--statistic", choices=("median", "mean"),
                   help="of all measured steps (default: median; mean with --algo diloco)")
    args = p.parse_args()
    if args.algo == "diloco":
        if args.configs == list(DEFAULT_CONFIGS):
            args.configs = list(diloco_configs(args.period))
        args.statistic = args.statistic or "mean"
        if args.steps % args.period:
            sys.exit(f"--algo diloco: --steps {args.steps} must be a multiple of --period "
                     f"{args.period} (the same number of rounds in every run)")
    stat_name = args.statistic or "median"
    stat = statistics.fmean if stat_name == "mean" else statistics.median

    configs = [parse_config(c) for c in args.configs]
    labels = [c["label"] for c in configs]
    if len(set(labels)) != len(labels) or args.baseline not in labels:
        sys.exit(f"labels must be unique and include --baseline {args.baseline!r}: {labels}")
    if os.geteuid() != 0:
        sys.exit("needs root (netns_hosts.sh: network namespaces, tc)")
    t_start = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable,
               THP_MEM_ALLOC_ENABLE=str(args.thp))
    workdir = os.path.splitext(os.path.abspath(args.out))[0] + ".runs"
    os.makedirs(workdir, exist_ok=True)

    wan = emulator.Wan(args.hosts, wan_link(args), timeout=args.timeout + 60) if args.rtt else None
    if wan:
        wan.__enter__()
        gbits, verify_lines = wan_check(wan)
        env["RDBENCH_VERIFIED_GBITPS"] = f"{gbits:.3f}"
    else:
        gbits, verify_lines = verify_link(args, env)
    for line in verify_lines if wan else []:
        print(line)
    runs = {lbl: [] for lbl in labels}
    try:
        for rnd in range(1, args.rounds + 1):
            for cfg in configs:
                label = cfg["label"]
                stem = os.path.join(workdir, f"r{rnd}_{label.replace('%', 'pct')}")
                json_path, log_path = stem + ".json", stem + ".log"
                if os.path.exists(json_path):
                    os.remove(json_path)  # never merge a stale result
                load = os.getloadavg()[0]
                t0 = time.monotonic()
                if wan:
                    rc = run_on_wan(wan, args, cfg, json_path, log_path, env)
                else:
                    rc = run_bounded(step_cmd(args, cfg, json_path), env, args.timeout, log_path)
                took = time.monotonic() - t0
                if rc != 0 or not os.path.exists(json_path):
                    with open(log_path) as f:
                        lines = f.readlines()
                    cause = [ln for ln in lines if any(k in ln for k in (
                        "Error", "error:", "needs", "Exception", "timeout"))][:10]
                    sys.exit(f"round {rnd} {label}: FAILED rc={rc} after {took:.0f}s, see "
                             f"{log_path}\n" + "".join(cause) + "---- log tail\n"
                             + "".join(lines[-8:]))
                with open(json_path) as f:
                    res = json.load(f)
                res["loadavg_1min_at_start"] = load
                runs[label].append(res)
                print(f"round {rnd} {label:<10} {took:5.0f}s  median step "
                      f"{res['step_time_median_s'] * 1e3:7.1f} ms  "
                      f"{res['wire_bytes_per_step'] / 1e6:7.2f} MB/step  loss "
                      f"{res['final_loss']:.4f}  link {res['env'].get('RDBENCH_VERIFIED_GBITPS')}"
                      f" Gbit/s  (load avg {load:.2f})", flush=True)
    finally:
        if wan:
            wan.close()
        left = our_namespaces()
        if left:  # a killed run may leave some: the script's clean removes only its own
            print(f"leftover namespaces {left}: running netns_hosts.sh clean")
            subprocess.run(["bash", NETNS, "clean"], env=env, timeout=120)
            left = our_namespaces()
        print(f"ip netns list after the run: {left or 'no rdbench-* namespaces'}")

    rows = summarise(configs, runs, args.baseline, stat)
    first = runs[labels[0]][0]
    md = table(rows, args.baseline, args.hosts, args.rate, stat_name)
    combined = {
        "machine": first["machine"], "hosts": args.hosts, "ranks_per_host": args.nproc,
        "world_size": first["world_size"], "rate": args.rate, "rounds": args.rounds,
        "steps": args.steps, "warmup": args.warmup, "model": first["model"],
        "link_verified_gbitps": gbits, "verify": verify_lines, "thp_mem_alloc": args.thp,
        "rtt": args.rtt, "loss": args.loss if args.rtt else None,
        "torch_ringdist": getattr(importlib.util.find_spec("torch_ringdist"), "origin", None),
        "command": sys.argv, "statistic": stat_name,
        "wall_s": time.monotonic() - t_start, "baseline": args.baseline,
        "summary": rows, "runs": runs,
    }
    write_json(args.out, combined)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    print(f"\n== DDP step, {first['model']['params'] / 1e6:.1f}M params fp32, N="
          f"{first['world_size']} ({args.hosts} emulated hosts x {args.nproc}), {args.rate}"
          f"{f', RTT {args.rtt}, loss {args.loss}' if args.rtt else ''}, "
          f"{args.rounds} rounds x {args.steps} steps (+{args.warmup} warm-up); {stat_name} of all "
          f"measured steps (slowest rank); per-round {stat_name}s in parentheses; "
          f"THP_MEM_ALLOC_ENABLE={args.thp}")
    print(md)
    print(f"\nwrote {args.out} (runs in {workdir}); {combined['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
