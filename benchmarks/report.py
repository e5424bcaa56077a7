#!/usr/bin/env python3
"""Turn a compare.py (or sweep.py) JSON into a markdown table and a PNG plot.

    python benchmarks/report.py cmp.json --md cmp.md --png cmp.png \
        [--ceiling ceiling.json:tcp_loopback_1stream | --ceiling-gbs 5.0]

Table: one row per size, time and busbw per backend, speedup of each backend over the
baseline (baseline time / backend time), and busbw as % of the ceiling when one is given.
Plot: busbw vs size and time vs size, log-log, one line per backend; awkward counts
(not a power of two, or not divisible by N) are separate markers.
"""

import argparse
import json
import sys

KIB, MIB = 1 << 10, 1 << 20


def fmt_size(nbytes, awkward):
    if awkward:
        return f"{nbytes:,} B*"
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def load(path):
    """Normalise a sweep.py JSON into compare.py's shape so both can be reported."""
    with open(path) as f:
        data = json.load(f)
    if "results" not in data:
        data = {"machine": data["machine"], "collective": data["collective"],
                "dtype": data["dtype"], "world_size": data["world_size"], "rounds": 1,
                "baseline": data["backend"], "hosts": 1, "rate": None, "summary": None,
                "results": {data["backend"]: {"backend": data["backend"], "env": data["env"],
                                              "rows": data["rows"]}},
                "provenance": data.get("provenance")}
    return data


def read_ceiling(args):
    if args.ceiling_gbs:
        return args.ceiling_gbs, args.ceiling_name or "ceiling"
    if not args.ceiling:
        return None, None
    path, _, key = args.ceiling.partition(":")
    with open(path) as f:
        ceilings = json.load(f)["ceilings"]
    key = key or next(iter(ceilings))
    if key not in ceilings:
        sys.exit(f"ceiling {key!r} not in {path}; have {sorted(ceilings)}")
    return ceilings[key]["GBps"], args.ceiling_name or ceilings[key].get("what", key)


def title_of(data):
    m = data["machine"]
    where = (f"{data['hosts']} emulated hosts @ {data['rate']}" if data.get("hosts", 1) > 1
             else "one host")
    prov = data.get("provenance") or {}
    commit = (f"; commit {prov['commit'][:7]}{' (dirty)' if prov['dirty'] else ''}"
              if prov.get("commit") else "")
    return (f"{data['collective']} {data['dtype']}, N={data['world_size']} ranks, {where}; "
            f"{m['cpu_model']} x{m['cores']} cores, kernel {m['kernel']}, torch {m['torch']}, "
            f"{m['date'][:10]}; median of {data['rounds']} alternating round(s){commit}")


def markdown(data, ceiling, ceiling_name):
    res, base = data["results"], data["baseline"]
    labels = list(res)
    others = [lbl for lbl in labels if lbl != base]
    keyed = {lbl: {(r["count"], r["awkward"]): r for r in res[lbl]["rows"]} for lbl in labels}
    keys = sorted(set().union(*keyed.values()), key=lambda k: (keyed_bytes(keyed, k), k))
    head = ["size", "count"]
    head += [f"{lbl} time (us)" for lbl in labels]
    head += [f"{lbl} busbw (GB/s)" for lbl in labels]
    if ceiling:
        head += [f"{lbl} % of ceiling" for lbl in labels]
    head += [f"speedup {lbl}/{base}" for lbl in others]
    lines = [f"_{title_of(data)}_", ""]
    if ceiling:
        lines += [f"_Ceiling: {ceiling_name} = {ceiling:.3g} GB/s._", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for k in keys:
        rows = {lbl: keyed[lbl].get(k) for lbl in labels}
        any_row = next(r for r in rows.values() if r)
        cells = [fmt_size(any_row["bytes"], any_row["awkward"]), str(any_row["count"])]

        def cell(lbl, fmt):
            r = rows[lbl]
            if r is None:
                return "-"
            bad = " (#wrong %d)" % r["wrong"] if r["wrong"] else ""
            return fmt(r) + bad

        cells += [cell(lbl, lambda r: f"{r['time_us']:.1f}") for lbl in labels]
        cells += [cell(lbl, lambda r: f"{r['busbw_GBps']:.3g}") for lbl in labels]
        if ceiling:
            cells += [cell(lbl, lambda r: f"{100 * r['busbw_GBps'] / ceiling:.3g}%")
                      for lbl in labels]
        for lbl in others:
            r, b = rows[lbl], rows[base]
            ok = r and b and not r["wrong"] and not b["wrong"]
            cells.append(f"x{b['time_us'] / r['time_us']:.2f}" if ok else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "_* awkward count (not a power of two / not divisible by N). "
              "Speedup = baseline time / backend time; > 1 is faster than the baseline._"]
    if data.get("summary"):
        lines += ["", "| backend | band | speedup (geomean) | busbw geomean (GB/s) | sizes |",
                  "|---|---|---:|---:|---:|"]
        for lbl, bands in data["summary"].items():
            for band, b in bands.items():
                if not b["rows"]:
                    continue  # band outside the swept range
                sp = f"x{b['speedup_geomean']:.3f}" if "speedup_geomean" in b else "(baseline)"
                lines.append(f"| {lbl} | {band} | {sp} | {b['busbw_geomean_GBps']:.3g} | "
                             f"{b['rows']} |")
    return "\n".join(lines) + "\n"


def keyed_bytes(keyed, k):
    for rows in keyed.values():
        if k in rows:
            return rows[k]["bytes"]
    return 0


def plot(data, png, ceiling, ceiling_name):
    import matplotlib
    matplotlib.use("Agg")  # no display on benchmark machines
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5))
    for i, (lbl, res) in enumerate(data["results"].items()):
        color = f"C{i}"
        for awkward, style in ((False, dict(marker="o", linestyle="-")),
                               (True, dict(marker="x", linestyle="none", markersize=9))):
            rows = [r for r in res["rows"] if r["awkward"] == awkward and not r["wrong"]]
            if not rows:
                continue
            x = [r["bytes"] for r in rows]
            name = lbl + (" (awkward counts)" if awkward else "")
            ax_bw.plot(x, [r["busbw_GBps"] for r in rows], color=color, label=name, **style)
            ax_t.plot(x, [r["time_us"] for r in rows], color=color, label=name, **style)
    if ceiling:
        ax_bw.axhline(ceiling, color="grey", linestyle="--", label=f"{ceiling_name}")

    def size_label(v, _):
        for unit, scale in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
            if v >= scale:
                return f"{v / scale:g}{unit}"
        return f"{v:g}"

    for ax, ylabel in ((ax_bw, "busbw (GB/s)"), (ax_t, "time per op (us), slowest rank")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # Label 2x and 5x ticks too: a run often spans less than two decades of time.
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.4)
        ax.legend(fontsize=8)
    ax_bw.set_title("bus bandwidth (higher is better)", fontsize=10)
    ax_t.set_title("latency (lower is better)", fontsize=10)
    fig.suptitle(title_of(data), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="compare.py or sweep.py output")
    p.add_argument("--md", help="write the markdown here (default: stdout)")
    p.add_argument("--png", help="write the plot here")
    p.add_argument("--ceiling", help="memcpy_ceiling.py JSON, optionally :KEY")
    p.add_argument("--ceiling-gbs", type=float, help="ceiling in GB/s, instead of --ceiling")
    p.add_argument("--ceiling-name", help="label for the ceiling")
    args = p.parse_args()
    data = load(args.json)
    ceiling, ceiling_name = read_ceiling(args)
    md = markdown(data, ceiling, ceiling_name)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
        print(f"wrote {args.md}")
    else:
        sys.stdout.write(md)
    if args.png:
        plot(data, args.png, ceiling, ceiling_name)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
