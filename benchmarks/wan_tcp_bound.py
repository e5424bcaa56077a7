#!/usr/bin/env python3
"""What raw TCP reaches on the emulated WAN at N hosts, without ringdist: the bound on what any
transport using the kernel's TCP can show on this machine's emulated line.

    sudo python benchmarks/wan_tcp_bound.py --hosts 4 --rtt 100ms --sizes 16MiB 64MiB \\
        --patterns direct ring --out bound.json

For each setting, benchmarks/wan/tcp_exchange.py runs in every emulated host (one connection per
pair of hosts, bbr and 32 MiB socket buffers as ringdist chooses them on this line, no
encryption, no reduction): the direct exchange's bytes (`direct`), or a ring's bytes in one
stream to the next host (`ring`: one flow into each host), or at two hosts each host's whole
buffer to the other in one round (`pair`, as ringdist's pair exchange). A round's time is the
slowest host's; the report gives every round, the median of those after the first (which
carries the connections' slow start) as a fraction of the ideal (wan/tcp_exchange.py), and what
the delay line did meanwhile (packets written over 1 ms late: the line short of CPU; queue drops).
Needs root (network namespaces).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "wan"))

import emulator  # noqa: E402
from wan_allreduce import ideal_s, line_health  # noqa: E402


def run_setting(args, rtt_s, loss, pattern, nbytes):
    link = emulator.HostLink(rtt_s / 2, args.rate_bps, None, loss)
    with emulator.Wan(args.hosts, link, timeout=args.timeout) as wan, \
            tempfile.TemporaryDirectory(prefix="wan_tcp_bound-") as tmp:
        logs = [os.path.join(tmp, f"h{i}.log") for i in range(args.hosts)]
        argv = [sys.executable, os.path.join(HERE, "wan", "tcp_exchange.py"),
                "--bytes", str(nbytes), "--rounds", str(args.rounds), "--pattern", pattern,
                "--cc", "bbr", "--buffer", "32MiB", "--one-way", str(rtt_s / 2)]
        codes = wan.run(argv, logs=logs, timeout=args.timeout)
        line = wan.line_stats()
        texts = [open(path).read() for path in logs]
        failed = [text for code, text in zip(codes, texts) if code]
        if failed:
            raise RuntimeError(f"tcp_exchange failed: exit codes {codes}\n{failed[0][-3000:]}")
        hosts = [json.loads(t.strip().splitlines()[-1]) for t in texts]
        check = wan.check
    rounds = [max(h["rounds_s"][i] for h in hosts) for i in range(args.rounds)]
    median = statistics.median(rounds[1:])
    # A ring's bytes at the link rate, plus the direct exchange's two one-way trips or one
    # stream's one (wan/tcp_exchange.py).
    ideal = ideal_s(nbytes, args.hosts, args.rate_bps, rtt_s / 2,
                    trips=2 if pattern == "direct" else 1)
    return {"pattern": pattern, "bytes": nbytes, "hosts": args.hosts, "rtt_s": rtt_s,
            "loss": loss, "rate_bps": args.rate_bps, "link": link.describe(),
            "rounds_s": rounds, "median_s": median, "ideal_s": ideal,
            "fraction_of_ideal": ideal / median, "per_host": hosts,
            "line": line_health({"check": check, "line_after": line}), "check": check}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--rtt", nargs="+", default=["100ms"])
    ap.add_argument("--loss", nargs="+", type=float, default=[0.0])
    ap.add_argument("--sizes", nargs="+", default=["16MiB", "64MiB"])
    ap.add_argument("--patterns", nargs="+", default=["direct", "ring"],
                    choices=("direct", "ring", "pair"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    from bench_common import write_json
    args.rate_bps = emulator.parse_rate(args.rate)
    out = {"benchmark": "wan_tcp_bound", "rounds": args.rounds, "tcp": "bbr, 32 MiB buffers",
           "settings": []}
    for loss in args.loss:
        for rtt in args.rtt:
            for pattern in args.patterns:
                for size in args.sizes:
                    row = run_setting(args, emulator.parse_time(rtt), loss, pattern,
                                      emulator.parse_size(size))
                    out["settings"].append(row)
                    print(f"N={args.hosts} RTT {row['rtt_s'] * 1e3:g} ms loss {loss:g} "
                          f"{pattern:6s} {size:>6s}: median {row['median_s'] * 1e3:.1f} ms, "
                          f"ideal {row['ideal_s'] * 1e3:.1f} ms "
                          f"({row['fraction_of_ideal']:.0%}); rounds "
                          f"{[round(t * 1e3) for t in row['rounds_s']]} ms; line "
                          f"{row['line']}", flush=True)
                    if args.out:
                        write_json(args.out, out)


if __name__ == "__main__":
    main()
