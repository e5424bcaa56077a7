#!/usr/bin/env python3
"""Single-core speed of the hooks' CPU kernels: wire codecs and the fused top-k passes.

    OMP_NUM_THREADS=1 python benchmarks/codec_speed.py [--json out.json]

Per kernel: median of --reps calls after one warm-up, on a buffer that fits in L3
(4 MiB) and on one DDP-bucket-sized buffer (100 MB, DRAM-bound). Codec figures are
float32 input GB/s of codec_roundtrip (encode + decode, block by block); with
residual=True as error feedback uses it. topk_select: 1% with error feedback;
topk_scatter: the dense result of N=2 ranks' selections. No process group needed.
Each kernel family this CPU runs is measured: generic, then avx2 (x86-64) or neon
(aarch64); --family picks one.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from bench_common import machine_info, write_json  # noqa: E402

from torch_ringdist._extension import load  # noqa: E402


def median_time(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", help="write results here")
    p.add_argument("--family", action="append", help="kernel family (default: every one this CPU runs)")
    args = p.parse_args()
    torch.set_num_threads(1)
    ext = load()
    best = ext.codec_kernel_family()
    families = args.family or (["generic"] if best == "generic" else ["generic", best])
    rows = []
    for family in families:
        if not ext.testing.select_kernel_family(family):
            raise SystemExit(f"this CPU cannot run kernel family {family!r} (best: {best})")
        rows += measure(ext, family, args.reps)
    print(f"{'family':<9}{'kernel':<24}{'size':>8}{'time(ms)':>10}{'GB/s':>8}")
    for r in rows:
        print(f"{r['family']:<9}{r['kernel']:<24}{r['size']:>8}{r['seconds'] * 1e3:>10.2f}"
              f"{r['gbps_fp32_in']:>8.2f}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "results": rows})


def measure(ext, family, reps):
    """One family's rows."""
    rows = []
    for count, size in ((1 << 20, "4 MiB"), (25_000_000, "100 MB")):
        grad = torch.randn(count) * 1e-3
        out = torch.empty(count)
        out.zero_()  # fault the pages in before timing
        for codec in ("bf16", "fp16", "int8", "int4"):
            for residual in (False, True):
                s = median_time(lambda: ext.codec_roundtrip(grad, codec, out=out, residual=residual),
                                reps)
                rows.append({"family": family,
                             "kernel": f"{codec} roundtrip" + (" residual" if residual else ""),
                             "size": size, "seconds": s, "gbps_fp32_in": count * 4 / s / 1e9})
        k = count // 100
        packed = torch.empty(2 * k)
        residual = torch.zeros(count)
        s = median_time(lambda: ext.topk_select(grad, residual, k, packed), reps)
        rows.append({"family": family, "kernel": "topk_select 1% EF", "size": size, "seconds": s,
                     "gbps_fp32_in": count * 4 / s / 1e9})
        gathered = torch.cat([packed, packed])
        s = median_time(lambda: ext.topk_scatter(gathered, 2, k, out), reps)
        rows.append({"family": family, "kernel": "topk_scatter N=2", "size": size, "seconds": s,
                     "gbps_fp32_in": count * 4 / s / 1e9})
    return rows


if __name__ == "__main__":
    main()
