"""The route model's predictions for allreduce across many hosts, one rank per host.

    python benchmarks/route_model.py                      # 2 to 1,024 hosts, 1 and 10 Gbit/s
    python benchmarks/route_model.py --hosts 64 256 --rtt 30ms --rate 10gbit

For each link (round trip, rate), size and number of hosts: the time the model
(csrc/collectives/route_model.h, through torch_ringdist._C.allreduce_route_model) predicts for
each route it allows, the route it picks, and that route's bus bandwidth, 2(N-1)/N * S / time
(what each host's link carries per second, as nccl-tests count it). Arithmetic only: no group,
no network. The model's measured side: benchmarks/wan_allreduce.py records its prediction beside
each measured time (N = 2, 4 and 8 emulated hosts).
"""
import argparse
import os
import sys

from torch_ringdist import _C

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "wan"))
from emulator import parse_rate, parse_size, parse_time  # noqa: E402

ROUTES = ["ring", "direct", "halving-doubling", "pair"]


def predictions(hosts, sizes, rtt_s, rate_bps):
    rows = []
    for n in hosts:
        for size in sizes:
            got = _C.allreduce_route_model(n, size, int(rtt_s * 1e6), rate_bps)
            times = {r: float(got[r + "_us"]) / 1e6 for r in ROUTES if r + "_us" in got}
            best = times[got["route"]]
            rows.append({"hosts": n, "bytes": size, "route": got["route"], "times_s": times,
                         "busbw_gbit": 2 * (n - 1) / n * size * 8 / best / 1e9 if n > 1 else 0})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16, 64, 256, 1024])
    ap.add_argument("--sizes", nargs="+", default=["64KiB", "1MiB", "16MiB", "256MiB"])
    ap.add_argument("--rtt", nargs="+", default=["100ms", "10ms"])
    ap.add_argument("--rate", nargs="+", default=["1gbit", "10gbit"])
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    for rtt in args.rtt:
        for rate in args.rate:
            print(f"\nRTT {rtt}, {rate} links, one rank per host; predicted time per route, "
                  "the model's pick (*) and its bus bandwidth")
            print(f"{'hosts':>6} {'size':>8} " + " ".join(f"{r:>17}" for r in ROUTES)
                  + f" {'busbw':>11}")
            for row in predictions(args.hosts, sizes, parse_time(rtt), parse_rate(rate)):
                cells = [(f"{row['times_s'][r] * 1e3:.1f} ms" + ("*" if r == row["route"] else " "))
                         if r in row["times_s"] else "-" for r in ROUTES]
                print(f"{row['hosts']:>6} {row['bytes'] >> 10:>6}Ki "
                      + " ".join(f"{c:>17}" for c in cells)
                      + f" {row['busbw_gbit']:>7.3f} Gb/s")


if __name__ == "__main__":
    main()
