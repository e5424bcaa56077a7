#!/usr/bin/env python3
"""Host time of DiLoCo's round passes on one core: the native passes against torch's ops.

    OMP_NUM_THREADS=1 python benchmarks/diloco_round_passes.py [--json out.json]

The 25.2M-parameter benchmark MLP (benchmarks/ddp_step.py) in --fragments fragments. Per
fragment and round, what a rank computes on the host besides the exchange: at the start, the
pseudo-gradient d = theta_local - theta_global and the contribution it keeps for a redo
(on_failure="shrink"), with error feedback; at the end (streaming), the outer Nesterov step
and the mix of the parameters with theta_global. Both paths give the same bits
(tests/test_diloco.py); `DiLoCoState._delta` and `_outer_step` with
`torch_ringdist.hooks.diloco.FUSED_PASSES` on and off, alternating, median of --reps each.
No process group needed.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from bench_common import machine_info, write_json  # noqa: E402
from ddp_step import make_model  # noqa: E402

import torch_ringdist.hooks.diloco as diloco  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--fragments", type=int, default=4)
    p.add_argument("--json", help="write results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = make_model(1024, 4096, 1024)
    state = diloco.DiLoCoState(period=50, fragments=args.fragments, codec="int4",
                               overlap="streaming", alpha=0.25, on_failure="shrink")
    state.bind_module(model)
    with torch.no_grad():
        for p_ in model.parameters():  # the replica moved away from theta_global
            p_.add_(torch.randn_like(p_), alpha=1e-3)
    times = {True: {"start": [], "end": []}, False: {"start": [], "end": []}}
    torch.set_grad_enabled(False)  # as in the rounds
    for rep in range(args.reps + 1):
        for fused in (True, False):
            diloco.FUSED_PASSES = fused
            start = end = 0.0
            for f in range(args.fragments):
                params = state._fragment_tensors(f)
                t0 = time.perf_counter()
                flat = state._delta(f, params)
                t1 = time.perf_counter()
                avg = flat.mul(0.5)  # stands for the exchange's average
                t2 = time.perf_counter()
                state._outer_step(f, params, avg, mix=True)
                t3 = time.perf_counter()
                start, end = start + t1 - t0, end + t3 - t2
            if rep > 0:  # the first is a warm-up (allocations, page faults)
                times[fused]["start"].append(start)
                times[fused]["end"].append(end)
    diloco.FUSED_PASSES = True
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    rows = []
    for phase in ("start", "end"):
        native, ops = median(times[True][phase]), median(times[False][phase])
        rows.append({"phase": phase, "native_ms": native * 1e3, "torch_ops_ms": ops * 1e3,
                     "speedup": ops / native})
    total_native = sum(r["native_ms"] for r in rows)
    total_ops = sum(r["torch_ops_ms"] for r in rows)
    rows.append({"phase": "round (all fragments)", "native_ms": total_native,
                 "torch_ops_ms": total_ops, "speedup": total_ops / total_native})
    params = sum(p_.numel() for p_ in model.parameters())
    print(f"{params / 1e6:.1f}M parameters in {args.fragments} fragments, one core, "
          f"median of {args.reps}")
    print(f"{'phase':<24}{'native (ms)':>12}{'torch ops (ms)':>16}{'speedup':>9}")
    for r in rows:
        print(f"{r['phase']:<24}{r['native_ms']:>12.1f}{r['torch_ops_ms']:>16.1f}"
              f"{r['speedup']:>8.2f}x")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "parameters": params,
                                "fragments": args.fragments, "reps": args.reps, "results": rows})


if __name__ == "__main__":
    main()
