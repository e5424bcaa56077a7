#!/usr/bin/env python3
"""Bandwidth of ringdist's GPU kernels against the GPU's own device-to-device copy, and
the pinned host copies that bound the staged path.

    python benchmarks/cuda_kernels.py --json cuda_kernels.json

Issue target: reduction and codec kernels >= 80% of the measured device-to-device copy
bandwidth on 256 MiB. The top-k hook's kernels are timed too, against the least traffic
they need. Each kernel's bytes moved (read + written) per second is compared
with torch's D2D copy of the same buffer (also read + written), measured alternately in
the same run with CUDA events; medians of --reps. Needs a CUDA build of ringdist and a
GPU: exits with a message otherwise.
"""
import argparse
import statistics
import sys

import torch

from bench_common import write_json
from torch_ringdist._extension import load


def timed(fn, reps):
    """Median milliseconds of fn() on the current stream, CUDA events, after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="float32 buffer size in MiB")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", help="write results here")
    args = p.parse_args()
    C = load()
    if not (C.cuda_compiled() and torch.cuda.is_available()):
        sys.exit("cuda_kernels.py needs ringdist built with CUDA (TORCH_RINGDIST_CUDA=1) and a GPU")
    T = C.testing
    n = args.mib * (1 << 20) // 4
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    dst = torch.empty_like(a)
    copy_ms = timed(lambda: dst.copy_(a), args.reps)
    copy_gbps = 2 * a.numel() * 4 / copy_ms / 1e6
    rows = []

    def row(name, ms, moved):
        gbps = moved / ms / 1e6
        rows.append({"kernel": name, "ms": ms, "GBps": gbps, "of_copy": gbps / copy_gbps})
        print(f"{name:<28}{ms:9.3f} ms {gbps:9.1f} GB/s {gbps / copy_gbps:7.1%} of D2D copy", flush=True)

    print(f"{torch.cuda.get_device_name()}, {args.mib} MiB float32; D2D copy {copy_gbps:.1f} GB/s "
          f"(read + write)")
    # The staged path's ceiling (csrc/gpu/stage/device_stage.h): copies to and from pinned
    # host memory, counted one way (bytes crossing PCIe per second).
    pinned = torch.empty(n, pin_memory=True)
    d2h_ms = timed(lambda: pinned.copy_(a, non_blocking=True), args.reps)
    h2d_ms = timed(lambda: dst.copy_(pinned, non_blocking=True), args.reps)
    pinned_gbps = {"d2h": n * 4 / d2h_ms / 1e6, "h2d": n * 4 / h2d_ms / 1e6}
    print(f"pinned copies: device to host {pinned_gbps['d2h']:.1f} GB/s, host to device "
          f"{pinned_gbps['h2d']:.1f} GB/s")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, y = a.to(dtype), b.to(dtype)
        elem = x.element_size()
        row(f"reduce sum {dtype}".replace("torch.", ""),
            timed(lambda: T.cuda_reduce(x, y, "sum"), args.reps), 3 * n * elem)
    for codec in ("bf16", "fp16", "int8"):
        enc = T.codec_encode(a, codec, "cuda")
        row(f"encode {codec}", timed(lambda: T.codec_encode(a, codec, "cuda"), args.reps),
            n * 4 + enc.numel())
        row(f"decode {codec}", timed(lambda: T.codec_decode(enc, codec, n, "cuda"), args.reps),
            enc.numel() + n * 4)
    # Top-k hook kernels, 1% of the buffer: the least traffic a selection with error feedback
    # needs is reading grad and reading and writing the residual (3 passes); the scatter of
    # two ranks' selections writes the dense result and reads the selections.
    k = n // 100
    residual = torch.zeros(n, device="cuda")
    packed = torch.empty(2 * k, device="cuda")
    row("topk select 1% EF", timed(lambda: C.topk_select(a, residual, k, packed), args.reps), 3 * n * 4)
    gathered = torch.cat([packed, packed])
    row("topk scatter N=2", timed(lambda: C.topk_scatter(gathered, 2, k, dst), args.reps),
        n * 4 + gathered.numel() * 4)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "mib": args.mib,
              "copy_GBps": copy_gbps, "pinned_GBps": pinned_gbps, "rows": rows,
              "note": "the encode/decode rows allocate their output each call, as the test bindings do"}
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
