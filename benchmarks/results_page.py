#!/usr/bin/env python3
"""Write docs/performance.md, the one page of benchmark results, from benchmarks/data/*.json.

    python3 benchmarks/results_page.py           # rewrite the page
    python3 benchmarks/results_page.py --check   # exit 1 if the page differs from the data

Each file in benchmarks/data/ is the latest result of one scenario. SCENARIOS below lists
every file with its group, its title and the extractor for its benchmark's JSON (one function
per benchmark kind); a file missing from the list is an error, so no result is left off the
page. README and docs quote this page, never the raw data.
"""
import argparse
import json
import os
import statistics
import sys
from collections import namedtuple

from compare import BANDS, band_of, geomean

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
PAGE = os.path.join(os.path.dirname(HERE), "docs", "performance.md")

# One line of a table: what is measured, ringdist's value, the reference's name and value,
# and how many times better ringdist is (reference / ringdist for times and losses, ringdist /
# reference for rates). All four are text, formatted by the extractor.
Row = namedtuple("Row", "metric ours reference ratio")


# ---- formatting ----

def size(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time_unit(us):
    if us >= 1e6:
        return 1e6, "s"
    if us >= 1e3:
        return 1e3, "ms"
    return 1, "us"


def _number(x):
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def us_range(values):
    """Microseconds as '4.21 us', '1.75 ms' or, over several runs, '3.2-3.6 us'."""
    scale, unit = _time_unit(max(values))
    lo, hi = min(values) / scale, max(values) / scale
    text = _number(lo) if _number(lo) == _number(hi) else f"{_number(lo)}-{_number(hi)}"
    return f"{text} {unit}"


def gbps_range(values):
    lo, hi = f"{min(values):.3g}", f"{max(values):.3g}"
    return f"{lo} GB/s" if lo == hi else f"{lo}-{hi} GB/s"


def ratio_range(values):
    lo, hi = min(values), max(values)
    return f"x{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"x{lo:.2f}-{hi:.2f}"


def count(n, noun):
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def runs_of(data):
    """The runs a file holds: a combined file's list of runs, else the file itself."""
    return data.get("runs", [data])


# ---- extractors: one per benchmark kind, each data -> [Row] ----

def sweep(data, ours="ringdist", ref="gloo", ref_name="gloo"):
    """compare.py: per size band, the geometric mean of the times of the sizes both labels got
    right (ratio: as compare.py's band summary)."""
    rows_of = {lbl: {(r["count"], r["awkward"]): r for r in res["rows"] if r["wrong"] == 0}
               for lbl, res in data["results"].items()}
    rows = []
    for band, _, _ in BANDS:
        keys = [k for k, r in rows_of[ours].items()
                if k in rows_of[ref] and band_of(r["bytes"]) == band]
        if not keys:
            continue
        mine = geomean([rows_of[ours][k]["time_us"] for k in keys])
        theirs = geomean([rows_of[ref][k]["time_us"] for k in keys])
        rows.append(Row(f"time, geomean of {count(len(keys), 'size')} {band}", us_range([mine]),
                        f"{ref_name} {us_range([theirs])}", ratio_range([theirs / mine])))
    return rows


def plain_rows(data, label):
    """A compare.py label's rows by size: the power-of-two sizes it got right."""
    return {r["bytes"]: r for r in data["results"][label]["rows"]
            if not r["awkward"] and r["wrong"] == 0}


def three_way(data):
    """compare.py --peer mpi: the bands against Open MPI, then the smallest size, 64 KiB, 2 MiB
    and the largest against Open MPI, and the smallest against torch's floor (the same call on
    torch's `fake` backend, which moves no data)."""
    rows = sweep(data, ref="mpi", ref_name="Open MPI")
    mine, mpi, floor = (plain_rows(data, lbl) for lbl in ("ringdist", "mpi", "floor"))
    sizes = sorted(s for s in mine if s in mpi)
    for s in sorted({sizes[0], 64 << 10, 2 << 20, sizes[-1]} & set(sizes)):
        rows.append(Row(f"time at {size(s)}", us_range([mine[s]["time_us"]]),
                        f"Open MPI {us_range([mpi[s]['time_us']])}",
                        ratio_range([mpi[s]["time_us"] / mine[s]["time_us"]])))
    s = sizes[0]
    rows.append(Row(f"time at {size(s)}", us_range([mine[s]["time_us"]]),
                    f"torch's floor {us_range([floor[s]['time_us']])}",
                    ratio_range([floor[s]["time_us"] / mine[s]["time_us"]])))
    return rows


def netns(data):
    """compare.py --hosts: the bands against gloo, and the bus bandwidth of the sizes from 16 MiB
    as a share of the shaped link."""
    rows = sweep(data)
    gbit = float(data["rate"].removesuffix("gbit"))
    big = [r["busbw_GBps"] for s, r in plain_rows(data, "ringdist").items() if s >= 16 << 20]
    link = gbit / 8
    rows.append(Row(f"busbw from 16 MiB ({count(len(big), 'size')}) against the {gbit:g} Gbit/s "
                    "link", gbps_range(big), f"link {gbps_range([link])}",
                    ratio_range([min(big) / link, max(big) / link])))
    return rows


DDP_NAMES = {"gloo": "gloo", "nocomm": "no communication (L)", "int8": "int8 hook"}


def ddp_steps(data):
    """ddp_compare.py: each ringdist configuration's step time (and final loss) against gloo's,
    or against the run's baseline where gloo did not run (no communication, L)."""
    key = "step_time_s" if "step_time_s" in data["summary"][0] else "step_time_median_s"
    stat = data.get("statistic", "median")
    by_label = {c["label"]: c for c in data["summary"]}
    base = by_label["gloo" if "gloo" in by_label else data["baseline"]]
    ref = (f"{DDP_NAMES.get(base['label'], base['label'])} {us_range([base[key] * 1e6])}, "
           f"loss {base['final_loss']:.4f}")
    return [Row(f"{stat} step, {c['label']}",
                f"{us_range([c[key] * 1e6])}, loss {c['final_loss']:.4f}",
                ref, ratio_range([base[key] / c[key]]))
            for c in data["summary"] if c["backend"] == "ringdist" and c is not base]


def diloco_peers(data):
    """ddp_compare.py with torchft's DiLoCo: every other configuration's mean step (with its
    share of compute L/step and the bytes sent per step) against torchft's DiLoCo over gloo."""
    by_label = {c["label"]: c for c in data["summary"]}
    ref, alone = by_label["torchft_gloo"], by_label[data["baseline"]]

    def step(c):
        return (f"{us_range([c['step_time_s'] * 1e6])}, L/step "
                f"{alone['step_time_s'] / c['step_time_s']:.2f}, "
                f"{c['wire_bytes_per_step'] / 1e6:.2f} MB/step")
    return [Row(f"mean step, {c['label']}", step(c), f"torchft over gloo {step(ref)}",
                ratio_range([ref["step_time_s"] / c["step_time_s"]]))
            for c in data["summary"] if c is not ref and c is not alone]


def hivemind(data):
    """hivemind_wan.py: ringdist's DiLoCo configurations against hivemind's averaging on the
    same hosts: mean step, share of compute (each against its own L) and bytes per step."""
    hm = data["hivemind"]
    ref = (f"hivemind {data['options']['codec']} {us_range([hm['step_s'] * 1e6])}, L/step "
           f"{hm['utilisation']:.2f}, {hm['bytes_per_step'] / 1e6:.2f} MB/step")
    return [Row(f"mean step, {c['label']}",
                f"{us_range([c['step_s'] * 1e6])}, L/step {c['utilisation']:.2f}, "
                f"{c['bytes_per_step'] / 1e6:.2f} MB/step", ref,
                ratio_range([hm["step_s"] / c["step_s"]]))
            for c in data["ringdist"][1:]]


def per_size(data, ours, ref, ref_name, what="allreduce"):
    """deepspeed_peer.py and same_process.py: us per call at each size, labels alternating in the
    same processes; ranges over the runs the file holds."""
    rows = []
    for i, first in enumerate(runs_of(data)[0]["results"]):
        results = [run["results"][i] for run in runs_of(data)]
        wrong = any(r["wrong"][ours] or r["wrong"][ref] for r in results)
        metric = f"{what} {size(first['bytes'])}, us per call" + (" (WRONG)" if wrong else "")
        rows.append(Row(metric,
                        us_range([r["us"][ours] for r in results]),
                        f"{ref_name} {us_range([r['us'][ref] for r in results])}",
                        ratio_range([r["us"][ref] / r["us"][ours] for r in results])))
    return rows


def board(data):
    """The board A/B (deepspeed_peer.py runs of several builds): per build, ringdist's op against
    DeepSpeed's, geometric mean over the sizes up to 4 KiB; ranges over that build's runs."""
    builds = {}
    for run in data["runs"]:
        builds.setdefault(run["build"], []).append(run)
    rows = []
    for build, runs in builds.items():
        small = [[r for r in run["results"] if r["bytes"] <= 4096] for run in runs]
        mine = [geomean([r["us"]["direct-op"] for r in rs]) for rs in small]
        theirs = [geomean([r["us"]["deepspeed"] for r in rs]) for rs in small]
        metric = (f"{build}: op, geomean of {count(len(small[0]), 'size')} 8 B..4 KiB "
                  f"({count(len(runs), 'run')})")
        rows.append(Row(metric, us_range(mine), f"DeepSpeed's op {us_range(theirs)}",
                        ratio_range([t / m for t, m in zip(theirs, mine)])))
    return rows


def copy_bound(data):
    """copy_bound.py: the two-rank allgather against Open MPI, with the copies any allgather
    needs (through shared memory) for scale."""
    return [Row(f"allgather {size(r['bytes_per_rank'])} per rank (the copies alone: "
                f"{us_range([r['copy_shm_us']])})", us_range([r["ringdist_us"]]),
                f"Open MPI {us_range([r['mpi_us']])}",
                ratio_range([r["mpi_us"] / r["ringdist_us"]]))
            for r in data["rows"]]


def tp_inference(data):
    """tp_inference_bench.py: ms per generated token of examples/tp_inference.py's model;
    ranges over the runs."""
    def value(label):
        cell = us_range([run["ms_per_token"][label] * 1e3 for run in runs_of(data)])
        # no-comm and the like skip the collectives: their tokens differ by design
        wrong = label in ("direct", "deepspeed", "dtensor-ringdist", "dtensor-gloo") and \
            not all(run["tokens_equal"][label] for run in runs_of(data))
        return cell + (" (wrong tokens)" if wrong else "")

    def ratio(ours, ref):
        return ratio_range([run["ms_per_token"][ref] / run["ms_per_token"][ours]
                            for run in runs_of(data)])

    runs = count(len(runs_of(data)), "run")
    return [Row(f"ms per token, direct ops ({runs})", value("direct"),
                f"DeepSpeed's op {value('deepspeed')}", ratio("direct", "deepspeed")),
            Row(f"ms per token, direct ops ({runs})", value("direct"),
                f"no communication (L) {value('no-comm')}", ratio("direct", "no-comm")),
            Row(f"ms per token, DTensor on ringdist ({runs})", value("dtensor-ringdist"),
                f"DTensor on gloo {value('dtensor-gloo')}",
                ratio("dtensor-ringdist", "dtensor-gloo"))]


def convergence(data):
    """diloco_convergence.py: held-out loss (nats per byte) of each algorithm against DDP's
    (exact DiLoCo's where DDP did not run), median over the seeds the file holds."""
    seeds = runs_of(data)
    how = "1 seed" if len(seeds) == 1 else f"median of {len(seeds)} seeds"
    ref = "ddp" if "ddp" in seeds[0]["results"] else "diloco"
    base = statistics.median(s["results"][ref]["held_out"] for s in seeds)
    rows = []
    for algo in seeds[0]["results"]:
        if algo != ref:
            loss = statistics.median(s["results"][algo]["held_out"] for s in seeds)
            rows.append(Row(f"held-out loss, {algo} ({how})", f"{loss:.4f}",
                            f"{'DDP' if ref == 'ddp' else 'exact DiLoCo'} {base:.4f}",
                            ratio_range([base / loss])))
    return rows


def round_passes(data):
    """diloco_round_passes.py: a round's host time, the native passes against torch's ops."""
    return [Row(f"host time: {r['phase']}", f"{r['native_ms']:.1f} ms",
                f"torch's ops {r['torch_ops_ms']:.1f} ms", ratio_range([r["speedup"]]))
            for r in data["results"]]


def sparse(data):
    """sparse_allreduce.py: a sparse gradient's allreduce, medians of the rounds."""
    ours, theirs = data["median_us"]["ringdist"], data["median_us"]["gloo"]
    return [Row(f"{what} of a {data['args']['rows']} x {data['args']['dim']} table",
                us_range([ours[what]]), f"gloo {us_range([theirs[what]])}",
                ratio_range([theirs[what] / ours[what]]))
            for what in ours if what in theirs]


def one_rank(data):
    """one_rank_latency.py: a call on a one-rank group against torch's floor, the newer build's
    rounds (median)."""
    rounds = data["runs"]["new"]

    def median(label, op):
        return statistics.median(r[label][op] for r in rounds)
    return [Row(f"{op} on a one-rank group", us_range([median("ringdist", op)]),
                f"torch's floor {us_range([median('fake', op)])}",
                ratio_range([median("fake", op) / median("ringdist", op)]))
            for op in rounds[0]["ringdist"]]


def soak(data):
    """soak.py: operations checked and what the ranks' memory and file descriptors did."""
    growth = [g["rss_mib"] for g in data["growth"].values()]
    fds = max(abs(g["fds"]) for g in data["growth"].values())
    return [Row(f"{data['ops']} random ops per rank in {data['seconds'] / 60:.0f} min, "
                f"N={data['nproc']}",
                f"{data['mismatches']} mismatches, RSS {min(growth):+.1f} to {max(growth):+.1f} "
                f"MiB, fds +{fds}", "-", "-")]


def churn(data):
    """diloco_churn.py: the digest check over the churned rounds, the exclusion and admission
    times (ranges) against the issue's bounds."""
    c, sm = data["check"], data["summary"]
    span = lambda xs: f"{min(xs):.1f}-{max(xs):.1f} s" if xs else "-"  # noqa: E731
    verdict = "every replica equal, every round once" if not c["problems"] else \
        "; ".join(c["problems"])
    return [Row(f"{c['rounds']} rounds, {sm['losses']} losses, {sm['joins']} joins, "
                f"{c['processes']} processes", verdict, "-", "-"),
            Row("killed host excluded, kill to training", span(sm["kill_to_training_s"]),
                "2 s", "-"),
            Row("silent host excluded, SIGSTOP to training", span(sm["stop_to_training_s"]),
                "2 s", "-"),
            Row(f"join admitted ({data['state_bytes'] / 1e6:.1f} MB of state)",
                span(sm["admission_s"]), f"{data['join_bound_s']:.1f} s", "-")] + slow_host(data)


def slow_host(data):
    """diloco_churn.py's slow link: host 1 at a tenth of its rate, waited for or dropped."""
    slow = data.get("slow_link")
    if not slow:
        return []
    policy = data["args"].get("slow_peer", "wait")
    rows = [Row(f"host 1 at a tenth of its rate ({policy}): median round before / during / "
                "after", f"{slow['before_s']:.2f} / {slow['slow_s']:.2f} / {slow['after_s']:.2f} s",
                "-", "-")]
    for drop in slow.get("drops") or []:
        rejoined = slow.get("rejoined")
        rows.append(Row(f"dropped as the slow peer in round {drop['round']}: check to training; "
                        "back in after", f"{drop['seconds']:.1f} s; "
                        + (f"{rejoined['seconds']:.1f} s" if rejoined else "not back"),
                        f"rejoin_after {data['args']['rejoin_after']:.0f} s", "-"))
    return rows


def codec_families(data):
    """codec_speed.py --family: the vector kernels against the generic ones on 100 MB, one core
    (GB/s of float32 input)."""
    rate = {(r["family"], r["kernel"]): r["gbps_fp32_in"] for r in data["results"]
            if r["size"] == "100 MB"}
    vector = next(f for f, _ in rate if f != "generic")
    return [Row(f"{kernel}, 100 MB, GB/s", f"{vector} {rate[vector, kernel]:.2f}",
                f"generic {rate['generic', kernel]:.2f}",
                ratio_range([rate[vector, kernel] / rate["generic", kernel]]))
            for family, kernel in rate if family == vector]


def gpu_kernels(data):
    """cuda_kernels.py: ringdist's GPU kernels against the GPU's own device-to-device copy
    (GB/s counting bytes read and written, 256 MiB)."""
    return [Row(f"{r['kernel']}, {data['mib']} MiB, GB/s", f"{r['GBps']:.0f}",
                f"device copy {data['copy_GBps']:.0f}", ratio_range([r["of_copy"]]))
            for r in data["rows"]]


def gpu_handoff(data):
    """gpu_handoff.py: one hand-off between two processes' work on one GPU (microseconds, rank
    0), against one process's add and wait with the GPU to itself."""
    us = data["results"]["rank0_us"]
    alone = us["sync-alone"]
    return [Row(f"{mode}, us", f"{us[mode]:.1f}", f"alone {alone:.1f}", ratio_range([alone / us[mode]]))
            for mode in ("sync-both", "host-pingpong", "stream-pingpong-host", "stream-pingpong-device")]


def ceilings(data):
    """memcpy_ceiling.py: what this machine's memory and loopback deliver (no ringdist)."""
    rows = [Row(c["what"], "-", f"{c['GBps']:.1f} GB/s", "-") for c in data["ceilings"].values()]
    bound = data["ceilings"]["memcpy_64MiB_2procs"]["allreduce_n2_busbw_bound_GBps"]
    rows.append(Row("N=2 allreduce busbw bound (two copying processes / 4)", "-",
                    f"{bound:.1f} GB/s", "-"))
    return rows


def line_short(health):
    """Whether the delay line fell behind (wan_allreduce.line_health's counters): it wrote over
    1% of its packets more than 1 ms late, or any more than 10 ms late."""
    return health["late_over_10ms"] or health["late_over_1ms"] > 0.01 * health["writes"]


def wan_where(cfg):
    """A wan_allreduce.py configuration as a row's prefix: hosts, round trip, loss, and a mark
    when the delay line fell behind during it (line_short)."""
    from wan_allreduce import line_health

    short = line_short(line_health(cfg))
    return (f"N={cfg['world']}, RTT {cfg['rtt_s'] * 1e3:g} ms"
            + (f", loss {cfg['loss'] * 100:g}%" if cfg["loss"] else "")
            + (" (delay line short of CPU: times are upper bounds)" if short else ""))


def wan(data):
    """wan_allreduce.py: per configuration and size, the median time against gloo's, and each
    as a share of the ideal (the formula the file records), or for small messages in one-way
    trips per call; a configuration whose delay line fell behind is marked (wan_where)."""
    rows = []
    for cfg in data["configs"]:
        where = wan_where(cfg)
        made = cfg["rows"][0].get("group_s", {}) if cfg["rows"] else {}
        mine = "ringdist" if "ringdist" in made else None
        for other in made if mine else []:  # each group's creation, the slowest rank's
            if other != mine:
                rows.append(Row(f"{where}: creating a group", us_range([made[mine] * 1e6]),
                                f"{other} {us_range([made[other] * 1e6])}",
                                ratio_range([made[other] / made[mine]])))
        for r in cfg["rows"]:
            m = r["median_s"]
            # Small messages run as loops of dependent calls, which overlap: one-way trips per
            # call says more there than a share of one call's ideal.
            if r["bytes"] < (64 << 10):
                share = {b: f"{r['one_way_trips_per_call'][b]:.2f} one-way trips per call"
                         for b in m}
            else:
                share = {b: f"{100 * r['fraction_of_ideal'][b]:.0f}% of ideal" for b in m}
            wrong = " (WRONG)" if any(r["wrong"].values()) else ""
            # ringdist as run, or the first variant of it where every one was forced
            key = "ringdist" if "ringdist" in m else next(b for b in m if b.startswith("ringdist"))
            route = r.get("route", {}).get(key, {}).get("route")
            ours = f"{us_range([m[key] * 1e6])} ({share[key]})"
            # Against gloo where it ran (not in runs with loss, where a call takes it ~30 s),
            # else against the ideal.
            reference, seconds = ((f"gloo {us_range([m['gloo'] * 1e6])} ({share['gloo']})", m["gloo"])
                                  if "gloo" in m else
                                  (f"ideal {us_range([r['ideal_s'] * 1e6])}", r["ideal_s"]))
            rows.append(Row(f"{where}: {size(r['bytes'])}{wrong}"
                            + (f", route {route}" if route else ""), ours, reference,
                            ratio_range([seconds / m[key]])))
            for other in m:  # the same build with a setting changed (the rings forced, ...)
                if other.startswith("ringdist:") and other != key:
                    name = other.partition(":")[2]
                    rows.append(Row(f"{where}: {size(r['bytes'])}, against ringdist:{name}", ours,
                                    f"{name} {us_range([m[other] * 1e6])} ({share[other]})",
                                    ratio_range([m[other] / m[key]])))
    return rows


def tcp_bound(data):
    """wan_tcp_bound.py: raw TCP's median round per setting as a share of its ideal, the rounds'
    range, and the delay line's mark (line_short)."""
    rows = []
    for r in data["settings"]:
        where = (f"N={r['hosts']}, RTT {r['rtt_s'] * 1e3:g} ms"
                 + (f", loss {r['loss'] * 100:g}%" if r["loss"] else "")
                 + (" (delay line short of CPU)" if line_short(r["line"]) else ""))
        rounds = r["rounds_s"][1:]
        rows.append(Row(f"{where}: raw TCP, {r['pattern']} pattern, {size(r['bytes'])}",
                        f"{us_range([r['median_s'] * 1e6])} "
                        f"({100 * r['fraction_of_ideal']:.0f}% of ideal; rounds "
                        f"{us_range([t * 1e6 for t in rounds])})",
                        f"ideal {us_range([r['ideal_s'] * 1e6])}",
                        ratio_range([r["ideal_s"] / r["median_s"]])))
    return rows


# ---- the scenarios: file -> group, title, extractor ----

def ab(ours, ref, ref_name):
    return lambda data: sweep(data, ours, ref, ref_name)


def wan_routes(data):
    """wan_allreduce.py with ringdist's routes forced (ringdist:direct, :halving, :ring, each
    possibly +cubic): per configuration, size and route, the median time against the route
    model's prediction for that route at the link's rate (its bandwidth given, as a group learns
    it from its allreduces); small messages, which every route sends in one round, left out."""
    rows = []
    for cfg in data["configs"]:
        where = wan_where(cfg)
        for r in cfg["rows"]:
            if r["bytes"] < (64 << 10):
                continue
            for b, seconds in r["median_s"].items():
                route = r.get("route", {}).get(b, {}).get("route")
                predicted = r.get("model_us", {}).get(f"{route}_us") if route else None
                if predicted is None:
                    continue
                cc = " (cubic)" if b.endswith("+cubic") else ""
                wrong = " (WRONG)" if r["wrong"].get(b) else ""
                rows.append(Row(f"{where}: {size(r['bytes'])}, {route}{cc}{wrong}",
                                f"{us_range([seconds * 1e6])} "
                                f"({100 * r['fraction_of_ideal'][b]:.0f}% of ideal)",
                                f"model {us_range([float(predicted)])}",
                                ratio_range([float(predicted) / (seconds * 1e6)])))
    return rows


def labels(ours, ref, ref_name, what="allreduce"):
    return lambda data: per_size(data, ours, ref, ref_name, what)


ONE_HOST = "Collectives against gloo, one host, N=2"
MPI = "Against Open MPI and torch's floor, one host"
NETNS = "Emulated hosts (network namespaces, `tc tbf` links), one rank per host unless stated"
DIRECT = "Direct operators and tensor-parallel inference against DeepSpeed, one host"
WAN = ("Emulated WAN at 1 Gbit/s (`benchmarks/wan/`: delay line, every TCP socket starting with "
       "cubic), one rank per host unless stated; ideal = 2(H-1)/H * 8S/R + T * d, H hosts, d the "
       "one-way delay, T = 2(H-1) (a ring's trips) in the files before the direct exchange and 2 "
       "(its trips) in `wan_allreduce_direct*.json`")
DDP = "DDP training step with communication hooks, emulated hosts at 1 Gbit/s"
DILOCO = "Local steps (DiLoCo), emulated hosts"
OTHER = "Other operations"
GPU = "GPU: one H100, ranks sharing it"
AB = "Before/after experiments (builds or settings alternating in one run)"
CEILINGS = "Ceilings of the machine"

SCENARIOS = {
    "same_host_n2.json": (ONE_HOST, "fp32 allreduce", sweep),
    "same_host_n2_bf16.json": (ONE_HOST, "bf16 allreduce", sweep),
    "same_host_n2_allgather.json": (ONE_HOST, "fp32 allgather", sweep),
    "same_host_n2_broadcast.json": (ONE_HOST, "fp32 broadcast", sweep),
    "same_host_n2_reduce_scatter.json": (ONE_HOST, "fp32 reduce_scatter", sweep),
    "tcp_n2.json": (ONE_HOST, "fp32 allreduce, TCP only (`RINGDIST_TRANSPORT=tcp`)", sweep),
    "three_way_allreduce.json": (MPI, "allreduce, N=2", three_way),
    "three_way_allgather.json": (MPI, "allgather, N=2", three_way),
    "three_way_broadcast.json": (MPI, "broadcast, N=2", three_way),
    "three_way_reduce_scatter.json": (MPI, "reduce_scatter, N=2", three_way),
    "three_way_allreduce_load.json": (MPI, "allreduce, N=2, a CPU-bound process beside each rank",
                                      three_way),
    "three_way_allreduce_n4.json": (MPI, "allreduce, N=4 on 2 cores", three_way),
    "three_way_allgather_n4.json": (MPI, "allgather, N=4 on 2 cores", three_way),
    "same_process_allreduce.json": (MPI, "allreduce in the same two processes",
                                    labels("ringdist", "mpi", "Open MPI")),
    "same_process_allgather.json": (MPI, "allgather in the same two processes",
                                    labels("ringdist", "mpi", "Open MPI", "allgather")),
    "same_process_broadcast.json": (MPI, "broadcast in the same two processes",
                                    labels("ringdist", "mpi", "Open MPI", "broadcast")),
    "same_process_reduce_scatter.json": (MPI, "reduce_scatter in the same two processes",
                                         labels("ringdist", "mpi", "Open MPI", "reduce_scatter")),
    "copy_bound.json": (MPI, "allgather against the copies it cannot avoid", copy_bound),
    "netns10g_n2.json": (NETNS, "N=2, 10 Gbit/s", netns),
    "netns10g_n2_bf16.json": (NETNS, "N=2, 10 Gbit/s, bf16", netns),
    "netns10g_n4.json": (NETNS, "N=4, 10 Gbit/s", netns),
    "mixed_2x2_hier.json": (NETNS, "2 hosts x 2 ranks, 10 Gbit/s, two-level", sweep),
    "mixed_2x2.json": (NETNS, "2 hosts x 2 ranks, 10 Gbit/s, one flat ring", sweep),
    "netns5g_n2.json": (NETNS, "N=2, 5 Gbit/s", netns),
    "netns1g_n2.json": (NETNS, "N=2, 1 Gbit/s", netns),
    "wan_allreduce.json": (WAN, "fp32 allreduce", wan),
    "wan_allreduce_loss.json": (WAN, "fp32 allreduce, 0.1% random loss", wan),
    "wan_allreduce_2x2.json": (WAN, "fp32 allreduce, 2 hosts x 2 ranks (N=4)", wan),
    "wan_pair_n2.json": (WAN, "fp32 allreduce, N=2: the model's route (the pair exchange at RTT "
                         "100 ms) against the ring", wan),
    "wan_pair_loss_n2.json": (WAN, "the same, 0.1% random loss", wan),
    "wan_pair_2x2.json": (WAN, "fp32 allreduce, 2 hosts x 2 ranks: the pair exchange across the "
                          "hosts against the ring", wan),
    "wan_pair_2x2_loss.json": (WAN, "the same, 0.1% random loss", wan),
    "wan_lanes_n2.json": (WAN, "fp32 allreduce, N=2, the pair exchange on 4 TCP lanes against 1, "
                          "set and autotuned socket buffers", wan),
    "wan_lanes_loss_n2.json": (WAN, "the same, 0.1% random loss", wan),
    "wan_pair_n2_rerun.json": (WAN, "fp32 allreduce, N=2, the pair exchange, a second run", wan),
    "wan_pair_loss_n2_rerun.json": (WAN, "the same, 0.1% random loss, a second run", wan),
    "wan_pair_2x2_rerun.json": (WAN, "fp32 allreduce, 2 hosts x 2 ranks, the pair exchange across "
                                "the hosts, a second run", wan),
    "wan_pair_2x2_loss_rerun.json": (WAN, "the same, 0.1% random loss, a second run", wan),
    "wan_loss_routes.json": (WAN, "fp32 allreduce, 0.1% random loss, N=2 and 4, routes by the "
                             "model", wan),
    "wan_loss_n2_direct.json": (WAN, "the same, N=2, 16 MiB: the direct exchange (allowed at N=2 "
                                "for this run) against the ring", wan_routes),
    "wan_allreduce_direct.json": (WAN, "fp32 allreduce, N=4: the direct exchange (route model) "
                                       "against the rings, same build", wan),
    "wan_allreduce_direct_rerun.json": (WAN, "the same, a second run (RTT 100 ms)", wan),
    "wan_tcp_bound_n4.json": (WAN, "raw kernel TCP without ringdist, N=4 (`wan_tcp_bound.py`: "
                              "bbr, 32 MiB buffers, the direct exchange's bytes or a ring's): "
                              "what any TCP transport reaches on this machine's line", tcp_bound),
    "wan_tcp_bound_n4_rerun.json": (WAN, "the same, a second run", tcp_bound),
    "wan_tcp_bound_n4_rerun2.json": (WAN, "the same, a third run", tcp_bound),
    "wan_tcp_bound_n4_250m.json": (WAN, "the same at 250 Mbit/s, where the line keeps time",
                                   tcp_bound),
    "wan_tcp_bound_n2.json": (WAN, "raw kernel TCP without ringdist, N=2", tcp_bound),
    "wan_tcp_bound_n2_rerun.json": (WAN, "the same, RTT 100 ms, a second run", tcp_bound),
    "wan_tcp_bound_pair_n2.json": (WAN, "raw kernel TCP, N=2, RTT 100 ms: the pair pattern "
                                   "(ringdist's route there: each host's whole buffer in one "
                                   "round) and the direct exchange's two phases", tcp_bound),
    "wan_tcp_bound_pair_n2_rtt10.json": (WAN, "the same, RTT 10 ms", tcp_bound),
    "wan_alone_sealed_n2.json": (WAN, "fp32 allreduce, N=2, RTT 100 ms, sealed (the default), "
                                 "alone in its run, the day of the pair bound", wan),
    "wan_alone_plain_n2.json": (WAN, "the same, plaintext (`RINGDIST_TCP_ENCRYPT=0`), alone in "
                                "its run", wan),
    "wan_alone_sealed_n2_rerun.json": (WAN, "the same, sealed, a second run", wan),
    "wan_alone_plain_n2_rerun.json": (WAN, "the same, plaintext, a second run", wan),
    "wan_sealed_plain_alternating_n2.json": (WAN, "the same, sealed and plaintext groups "
                                             "alternating in the same processes (their "
                                             "connections side by side)", wan),
    "wan_route_pair_n2.json": (WAN, "fp32 allreduce, N=2, RTT 100 ms, the model's route (the pair "
                               "exchange), alone in its run", wan),
    "wan_route_pair_n2_rerun.json": (WAN, "the same, a second run", wan),
    "wan_route_direct_n2.json": (WAN, "the same, the direct exchange's two rounds "
                                 "(`RINGDIST_ROUTE=direct`), alone in its run (its code not yet "
                                 "committed)", wan),
    "wan_route_direct_n2_rerun.json": (WAN, "the same, a second run", wan),
    "wan_route_direct_n2_rerun2.json": (WAN, "the same, committed, a third run", wan),
    "wan_route_direct_n2_rerun3.json": (WAN, "the same, a fourth run", wan),
    "wan_route_pair_n2_rtt10.json": (WAN, "fp32 allreduce, N=2, RTT 10 ms, the model's route, "
                                     "alone in its run", wan),
    "wan_route_direct_n2_rtt10.json": (WAN, "the same, the direct exchange (its code not yet "
                                       "committed)", wan),
    "wan_route_direct_n2_rtt10_rerun.json": (WAN, "the same, committed, a second run", wan),
    "wan_allreduce_routes_day.json": (WAN, "fp32 allreduce, N=2 and 4, RTT 100 and 10 ms, routes "
                                      "by the model, gloo alternating in the same processes "
                                      "(the guide's table, at a later commit)", wan),
    "wan_allreduce_2x2_routes_day.json": (WAN, "the same, 2 hosts x 2 ranks", wan),
    "wan_allreduce_loss_routes_day.json": (WAN, "the same, N=2, RTT 100 ms, 0.1% random loss",
                                           wan),
    "wan_alone_n2_rtt10.json": (WAN, "fp32 allreduce, N=2, RTT 10 ms, the day of the pair bound",
                                wan),
    "wan_allreduce_direct_n4_bound_day.json": (WAN, "fp32 allreduce, N=4, RTT 100 ms, the day of "
                                               "the raw-TCP bound", wan),
    "wan_allreduce_direct_loss_n4_bound_day.json": (WAN, "the same, 0.1% random loss", wan),
    "wan_pair_10ms_n2.json": (WAN, "fp32 allreduce, N=2, RTT 10 ms, 9 rounds: 4 lanes against 1, "
                              "set 32 MiB buffers", wan),
    "wan_pair_10ms_n2_variants.json": (WAN, "the same, 5 rounds: 4 lanes, 1 lane, the ring and "
                                       "plaintext, alternating", wan),
    "wan_lanes_set_n2.json": (WAN, "fp32 allreduce, N=2, RTT 100 ms, set 32 MiB buffers: 4 lanes "
                              "against 1 (the build before lanes followed the windows)", wan),
    "wan_lanes_set_loss_n2.json": (WAN, "the same, 0.1% random loss", wan),
    "wan_window_lanes_n2.json": (WAN, "fp32 allreduce, N=2, RTT 100 ms: lanes from the windows "
                                 "(set 32 MiB: one) against autotuned buffers (4 lanes)", wan),
    "wan_window_lanes_n2_rerun.json": (WAN, "the same, 64 MiB, a second run", wan),
    "wan_window_lanes_10ms_n2.json": (WAN, "fp32 allreduce, N=2, RTT 10 ms, lanes from the windows "
                                      "(one), against gloo, 7 rounds", wan),
    "wan_window_lanes_10ms_n2_rerun.json": (WAN, "the same, a second run", wan),
    "wan_window_lanes_2x2.json": (WAN, "the same, 2 hosts x 2 ranks (the two-level allreduce's "
                                  "pair exchange across the hosts)", wan),
    "wan_routes.json": (WAN, "fp32 allreduce, N=4 and 8: each route forced, against the route "
                             "model's prediction for it (ratio: model / measured)", wan_routes),
    "wan_routes_rerun.json": (WAN, "the same, N=4, a second run", wan_routes),
    "wan_routes_cubic.json": (WAN, "the same, N=4, each route with bbr and with cubic "
                                   "(`RINGDIST_TCP_CONGESTION=cubic`)", wan_routes),
    "wan_broadcast.json": (WAN, "fp32 broadcast from rank 0, N=4, the direct broadcast "
                                "(`RINGDIST_ROUTE=direct`); ideal 8S/R + d", wan),
    "wan_two_level_3x2.json": (WAN, "fp32 allreduce, 3 hosts x 2 ranks (N=6): the two-level "
                                    "allreduce with its cross stage by the route model", wan),
    "deepspeed_peer_n2.json": (DIRECT, "ringdist's op against DeepSpeed's, N=2",
                               labels("direct-op", "deepspeed", "DeepSpeed's op")),
    "deepspeed_peer_n2_small.json": (DIRECT, "the same, small sizes",
                                     labels("direct-op", "deepspeed", "DeepSpeed's op")),
    "deepspeed_peer_n4.json": (DIRECT, "ringdist's op against DeepSpeed's, N=4 on 2 cores",
                               labels("direct-op", "deepspeed", "DeepSpeed's op")),
    "deepspeed_peer_n2_board.json": (DIRECT, "the board A/B, N=2", board),
    "deepspeed_peer_n4_board.json": (DIRECT, "the board A/B, N=4 on 2 cores", board),
    "tp_inference_n2_f32.json": (DIRECT, "tensor-parallel example, N=2, float32", tp_inference),
    "tp_inference_n2_f64.json": (DIRECT, "tensor-parallel example, N=2, float64", tp_inference),
    "ddp_1g_n2.json": (DDP, "N=2", ddp_steps),
    "ddp_1g_n4.json": (DDP, "N=4", ddp_steps),
    "ddp_1g_n2_nothp.json": (DDP, "N=2, without huge pages", ddp_steps),
    "ddp_delayed_1g_n2.json": (DDP, "N=2, with the `delayed` hook", ddp_steps),
    "ddp_delayed_1g_n4.json": (DDP, "N=4, with the `delayed` hook", ddp_steps),
    "ddp_delayed_straggle_1g_n2.json": (DDP, "N=2, one rank 150 ms late every step", ddp_steps),
    "diloco_1g_n2.json": (DILOCO, "N=2, 1 Gbit/s", ddp_steps),
    "diloco_100m_n2.json": (DILOCO, "N=2, 100 Mbit/s", ddp_steps),
    "diloco_1g_n4.json": (DILOCO, "N=4, 1 Gbit/s", ddp_steps),
    "diloco_1g_n4_direct.json": (DILOCO, "N=4, 1 Gbit/s: streaming int4 and eager int8 against "
                                 "no communication", ddp_steps),
    "diloco_1g_n4_direct_rerun.json": (DILOCO, "the same, a second run", ddp_steps),
    "diloco_1g_n4_direct_rerun2.json": (DILOCO, "the same, a third run", ddp_steps),
    "diloco_overlap_1g_n2.json": (DILOCO, "N=2, 1 Gbit/s, overlapped exchanges", ddp_steps),
    "diloco_streaming_1g_n2.json": (DILOCO, "N=2, 1 Gbit/s, streaming", ddp_steps),
    "diloco_wan_n2.json": (DILOCO, "N=2, 100 Mbit/s, RTT 100 ms: int4, streaming and not, "
                           "against no communication", ddp_steps),
    "diloco_wan_loss_n2.json": (DILOCO, "the same, 0.1% random loss", ddp_steps),
    "diloco_wan_loss_n4.json": (DILOCO, "the same, N=4 (one rank per host)", ddp_steps),
    "diloco_wan_loss_n4_rerun.json": (DILOCO, "the same, N=4, a second run", ddp_steps),
    "diloco_wan_loss_n4_rerun2.json": (DILOCO, "the same, N=4, a third run", ddp_steps),
    "diloco_wan_loss_n4_direct.json": (DILOCO, "the same, N=4, streaming, the compressed "
                                       "allreduce by the direct exchange", ddp_steps),
    "diloco_wan_loss_n4_direct_rerun.json": (DILOCO, "the same, direct exchange, a second run",
                                             ddp_steps),
    "diloco_wan_loss_n4_direct_rerun2.json": (DILOCO, "the same, direct exchange, a third run",
                                              ddp_steps),
    "diloco_wan_loss_n4_direct_rerun3.json": (DILOCO, "the same, direct exchange, a fourth run "
                                              "(the hour of the period 60 runs)", ddp_steps),
    "diloco_wan_loss_n4_p60.json": (DILOCO, "the same, N=4, streaming, period 60", ddp_steps),
    "diloco_wan_loss_n4_p60_rerun.json": (DILOCO, "the same, period 60, a second run", ddp_steps),
    "diloco_wan_loss_n4_p60_rerun2.json": (DILOCO, "the same, period 60, a third run", ddp_steps),
    "diloco_wan_loss_2x2.json": (DILOCO, "the same, N=4 as 2 hosts x 2 ranks", ddp_steps),
    "diloco_wan_loss_2x2_rerun.json": (DILOCO, "the same, 2 hosts x 2 ranks, a second run",
                                       ddp_steps),
    "diloco_wan_loss_2x2_rerun2.json": (DILOCO, "the same, 2 hosts x 2 ranks, a third run",
                                        ddp_steps),
    "diloco_wan_loss_2x2_bytes.json": (DILOCO, "the same, 2 hosts x 2 ranks, one round, with "
                                       "the bytes sent across hosts", ddp_steps),
    "torchft_wan_n4.json": (DILOCO, "4 hosts, 100 Mbit/s, RTT 100 ms, 0.1% loss: ringdist's "
                            "DiLoCoOptimizer and torchft's DiLoCo over ringdist, against torchft's "
                            "DiLoCo over gloo", diloco_peers),
    "torchft_wan_n4_rerun.json": (DILOCO, "the same, a second run", diloco_peers),
    "torchft_wan_n4_rerun2.json": (DILOCO, "the same, a third run", diloco_peers),
    "hivemind_wan_n4.json": (DILOCO, "4 hosts, 100 Mbit/s, RTT 100 ms, 0.1% loss: ringdist's "
                             "DiLoCoOptimizer against hivemind's averaging (8-bit) on the same "
                             "hosts", hivemind),
    "hivemind_wan_n4_rerun.json": (DILOCO, "the same, a second run", hivemind),
    "hivemind_wan_n4_rerun2.json": (DILOCO, "the same, a third run", hivemind),
    "diloco_convergence_n2.json": (DILOCO, "convergence, N=2", convergence),
    "diloco_convergence_n4.json": (DILOCO, "convergence, N=4", convergence),
    "diloco_churn_wan_n4.json": (DILOCO, "churn on 4 emulated hosts, 100 Mbit/s, RTT 100 ms, "
                                 "0.1% loss: 10 losses, 10 joins", churn),
    "diloco_churn_wan_n4_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_held.json": (DILOCO, "the same, joiners telling the members they hold "
                                      "the state (one one-way trip) instead of a barrier", churn),
    "diloco_churn_wan_n4_held_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_held_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_still.json": (DILOCO, "the same, a silent rank's wait counted from when "
                                       "its beat fell still", churn),
    "diloco_churn_wan_n4_still_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_watch.json": (DILOCO, "the same, the ranks of a check learning of its "
                                       "decision from a wait the store answers", churn),
    "diloco_churn_wan_n4_watch_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_look.json": (DILOCO, "the same, and a look for ranks alive elsewhere "
                                      "ending once the check is decided", churn),
    "diloco_churn_wan_n4_look_rerun.json": (DILOCO, "the same, the last look before a proposal "
                                            "too", churn),
    "diloco_churn_wan_n4_look_rerun2.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_lost_wait05.json": (DILOCO, "the same with lost_wait 0.5 s: a live rank "
                                             "excluded ends the run", churn),
    "diloco_churn_wan_n4_kept.json": (DILOCO, "the same, a shrink keeping the survivors' "
                                      "links (fenced), connects afresh no more", churn),
    "diloco_churn_wan_n4_quiet.json": (DILOCO, "the same, beats every 0.1 s carrying each link's "
                                       "quiet time; a silent rank whose links are quiet dropped "
                                       "after one lost_wait", churn),
    "diloco_churn_wan_n4_quiet_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_quiet_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_lost_wait07.json": (DILOCO, "the same with lost_wait 0.7 s", churn),
    "diloco_churn_wan_n4_lost_wait07_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_alongside.json": (DILOCO, "lost_wait 1 s, the look for ranks alive "
                                           "elsewhere alongside the check-in: two store round "
                                           "trips to agree", churn),
    "diloco_churn_wan_n4_alongside_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_alongside_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_alongside_rerun3.json": (DILOCO, "the same, a fourth run (its records "
                                                  "name each check's looks)", churn),
    "diloco_churn_wan_n4_every_checkin.json": (DILOCO, "the same, a look alongside every "
                                               "check-in", churn),
    "diloco_churn_wan_n4_every_checkin_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_every_checkin_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_kept_on_kill.json": (DILOCO, "the same, the survivors' links kept "
                                              "through a kill's shrink", churn),
    "diloco_churn_wan_n4_kept_on_kill_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_kept_on_kill_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_churn_wan_n4_kept_on_kill_rerun3.json": (DILOCO, "the same, a fourth run (its "
                                                     "records name what each link carried "
                                                     "in the redo)", churn),
    "diloco_churn_wan_n4_kept_on_kill_rerun4.json": (DILOCO, "the same, a fifth run", churn),
    "diloco_churn_wan_n4_kept_on_kill_rerun5.json": (DILOCO, "the same, a sixth run (its "
                                                     "records name what each link carried "
                                                     "while the state was shared)", churn),
    "diloco_churn_wan_n4_beat005.json": (DILOCO, "the same, beats and reads every 0.05 s "
                                         "(reverted)", churn),
    "diloco_churn_wan_n4_beat005_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_churn_wan_n4_warm_up.json": (DILOCO, "the same, with a joiner's connection warmed "
                                         "by 2 MiB while the period trains (reverted)", churn),
    "diloco_churn_wan_n4_send_ahead_p150.json": (DILOCO, "the same, period 150 with send_ahead, "
                                                 "20 rounds, 2 losses, 2 joins", churn),
    "diloco_slow_peer_drop_n4.json": (DILOCO, "churn with slow_peer='drop' (36 rounds, 2 losses, "
                                      "exchange_timeout 1.5 s, lost_wait 2 s), host 1 at a "
                                      "tenth of its rate for 6 rounds", churn),
    "diloco_slow_peer_drop_n4_rerun.json": (DILOCO, "the same, a second run", churn),
    "diloco_slow_peer_drop_n4_rerun2.json": (DILOCO, "the same, a third run", churn),
    "diloco_convergence_n4_p50.json": (DILOCO, "convergence, N=4, period 50: int4 and streaming "
                                       "int4 against exact DiLoCo", convergence),
    "diloco_round_passes.json": (DILOCO, "a round's host work, 25.2M parameters in 4 fragments, "
                                 "one core: native passes against torch's ops", round_passes),
    "diloco_round_passes_rerun.json": (DILOCO, "the same, a second run", round_passes),
    "diloco_convergence_n4_p60.json": (DILOCO, "convergence, N=4, period 60: int4 and streaming "
                                       "int4 (alpha 0.25) against exact DiLoCo", convergence),
    "sparse_allreduce_n2.json": (OTHER, "sparse allreduce, N=2", sparse),
    "one_rank_latency.json": (OTHER, "one-rank groups", one_rank),
    "soak_n4_one_host.json": (OTHER, "soak, one host", soak),
    "soak_n4_four_hosts.json": (OTHER, "soak, 4 emulated hosts", soak),
    "codec_families_x86.json": (OTHER, "hook codecs, x86 kernel families", codec_families),
    "gpu_h100_allreduce_n2.json": (GPU, "allreduce of CUDA tensors, N=2", sweep),
    "gpu_h100_kernels.json": (GPU, "kernels against the device copy", gpu_kernels),
    "gpu_h200_kernels.json": (GPU, "kernels against the device copy, H200", gpu_kernels),
    "gpu_h200_handoff.json": (GPU, "hand-off between two processes on one H200", gpu_handoff),
    "gpu_h200_kernels_run2.json": (GPU, "kernels against the device copy, H200, second run",
                                   gpu_kernels),
    "gpu_h200_allreduce_n2.json": (GPU, "same-GPU allreduce, N=2, H200, before the abort latch",
                                   sweep),
    "gpu_h200_allreduce_n4.json": (GPU, "same-GPU allreduce, N=4, H200, before the abort latch",
                                   lambda data: sweep(data, ref="ipc", ref_name="IPC buffers")),
    "gpu_h200_allgather_n2.json": (GPU, "same-GPU allgather, N=2, H200, before the abort latch",
                                   sweep),
    "gpu_h200_reduce_scatter_n2.json": (GPU, "same-GPU reduce-scatter, N=2, H200, before the "
                                        "abort latch", sweep),
    "stream_order_n2.json": (AB, "in-cache forwarding, N=2", ab("ringdist", "before", "before")),
    "stream_order_n4.json": (AB, "in-cache forwarding, N=4", ab("ringdist", "before", "before")),
    "in_flight_same_host_n2.json": (AB, "data in flight from the round trip, one host, N=2",
                                    ab("ringdist", "before", "before")),
    "in_flight_tcp_n2.json": (AB, "data in flight from the round trip, one host over TCP, N=2",
                              ab("ringdist", "before", "before")),
    "cleanup_same_host_n2.json": (AB, "the issue-12 cleanup", ab("after", "before", "before")),
    "cleanup_small_n2.json": (AB, "the issue-12 cleanup, small sizes",
                              ab("after", "before", "before")),
    "pipeline_depth_allgather.json": (AB, "pipeline depth, allgather", ab("new", "old", "old")),
    "pipeline_depth_broadcast.json": (AB, "pipeline depth, broadcast", ab("new", "old", "old")),
    "allgather_mpi_nocma.json": (AB, "allgather against Open MPI without CMA",
                                 ab("ringdist", "mpi", "Open MPI")),
    "single_copy_vs_rings.json": (AB, "rings against single copy, ringdist's op",
                                  labels("direct-op-single-copy-0", "direct-op-single-copy-1",
                                         "single copy")),
    "ceiling.json": (CEILINGS, "memory and loopback", ceilings),
}
GROUPS = [ONE_HOST, MPI, NETNS, WAN, DIRECT, DDP, DILOCO, OTHER, GPU, AB, CEILINGS]


# ---- the page ----

def commit_cell(prov):
    if prov.get("reconstructed"):
        return f"`{prov['recorded_in_commit'][:7]}`*"
    if not prov.get("commit"):
        return "none"
    return f"`{prov['commit'][:7]}`" + ("+dirty" if prov["dirty"] else "")


def load_data(folder=DATA):
    data = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                data[name] = json.load(f)
    unlisted = sorted(set(data) - set(SCENARIOS))
    if unlisted:
        raise SystemExit(f"benchmarks/data files not in results_page.SCENARIOS: {unlisted}")
    return data


def render(data):
    lines = [
        "# Performance",
        "",
        "Generated from `benchmarks/data/*.json` by `benchmarks/results_page.py`; do not edit "
        "by hand. To regenerate after adding or replacing a result: "
        "`python3 benchmarks/results_page.py` (`tests/test_results_page.py` fails while the "
        "page and the data differ). How each scenario is run: `benchmarks/README.md`.",
        "",
        "Each scenario shows its latest result. **ratio**: how many times better ringdist is "
        "than the reference, measured in the same run (reference time / ringdist time; for "
        "losses reference / ringdist; for rates ringdist / reference): x > 1, ringdist better. "
        "Ranges (a-b) span the runs a file holds. **commit**: the commit the benchmark "
        "recorded (+dirty: with uncommitted changes). `*`: reconstructed, for results measured "
        "before benchmarks recorded their commit: the commit that added the result to the "
        "repository, whose code (or the uncommitted work it records) was measured. A commit "
        "not in main's history (a branch measured before it was rebased) is kept as the tag "
        "`measured/<commit>`.",
    ]
    for group in GROUPS:
        names = [n for n, (g, _, _) in SCENARIOS.items() if g == group and n in data]
        if not names:
            continue
        machines = sorted({data[n]["provenance"]["machine"] for n in names})
        lines += ["", f"## {group}", "", f"Machine: {'; '.join(machines)}.", "",
                  "| scenario | metric | ringdist | reference | ratio | date | commit |",
                  "|---|---|---|---|---|---|---|"]
        for name in names:
            _, title, extract = SCENARIOS[name]
            prov = data[name]["provenance"]
            first = [f"[{title}](../benchmarks/data/{name})", prov["date"][:10], commit_cell(prov)]
            for i, row in enumerate(extract(data[name])):
                scenario, date, commit = first if i == 0 else ("", "", "")
                lines.append(f"| {scenario} | {row.metric} | {row.ours} | {row.reference} | "
                             f"{row.ratio} | {date} | {commit} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if out of date")
    args = p.parse_args()
    page = render(load_data())
    if args.check:
        with open(PAGE) as f:
            same = f.read() == page
        print(f"{PAGE}: " + ("up to date" if same else "out of date (run results_page.py)"))
        return 0 if same else 1
    with open(PAGE, "w") as f:
        f.write(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
