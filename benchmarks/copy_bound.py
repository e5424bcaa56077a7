#!/usr/bin/env python3
"""Where a two-rank allgather's time goes on one host: ringdist and Open MPI against the
copying neither can avoid, and against torch's own per-call cost.

    python benchmarks/copy_bound.py --bytes 256K 1M 4M --rounds 4 --json out.json

Per round and size, alternating: ringdist (op_loop.py under torchrun), Open MPI (op_loop.py
--backend mpi under mpirun; setup: benchmarks/setup_mpi.sh), and copy_bound.c in both its
modes: two forked processes doing only the copies an allgather needs, the own block with
memcpy and the peer's either by process_vm_readv ("kernel", one copy: Open MPI's single copy)
or through shared memory ("shm", a memcpy in by the peer and one out: what ringdist's rings
do). The copy bound is the cheaper mode. Once per round: torch's dispatch floor, an allgather
of one element per rank on torch's `fake` backend (no data moves). Medians over the rounds.

A backend's "own cost" is its time minus the copy bound, minus torch's floor for ringdist:
what its software adds per call. Where ringdist's own cost is at or below Open MPI's, what
is left between them is torch's dispatch, which no torch backend avoids.
"""
import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_common import machine_info, write_json
from compare import run_bounded
from sweep import parse_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
OP_LOOP = os.path.join(HERE, "op_loop.py")
PER_CALL = re.compile(r"([0-9.]+) us per call")


def per_call_us(cmd, timeout, log_path):
    """Runs cmd bounded (its whole process group killed on timeout); its per-call time."""
    rc = run_bounded(cmd, dict(os.environ, OMP_NUM_THREADS="1"), timeout, log_path)
    with open(log_path) as f:
        log = f.read()
    found = PER_CALL.search(log)
    if rc != 0 or found is None:
        sys.exit(f"copy_bound.py: {' '.join(cmd)} failed ({rc}):\n{log[-4000:]}")
    return float(found.group(1))


def build_probe(workdir):
    exe = os.path.join(workdir, "copy_bound")
    subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HERE, "copy_bound.c")], check=True)
    return exe


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", nargs="+", type=parse_bytes, default=[parse_bytes(b) for b in ("256K", "1M", "4M")],
                   help="bytes per rank's input (K/M suffixes)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.5, help="per backend, size and round")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--json")
    args = p.parse_args()
    with_mpi = shutil.which("mpirun") is not None and subprocess.run(
        [sys.executable, "-c", "import mpi4py.MPI"], capture_output=True).returncode == 0
    if not with_mpi:
        print("copy_bound.py: no mpirun or mpi4py, so no Open MPI column (bash benchmarks/setup_mpi.sh)")
    loop = ["--op", "allgather", "--seconds", str(args.seconds)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", OP_LOOP]
    mpirun = ["mpirun", "--allow-run-as-root", "-np", "2", sys.executable, OP_LOOP, "--backend", "mpi"]
    times = {}  # (label, bytes) -> [us per round]
    with tempfile.TemporaryDirectory() as workdir:
        probe = build_probe(workdir)
        log = os.path.join(workdir, "run.log")
        for r in range(args.rounds):
            times.setdefault(("floor", 0), []).append(
                per_call_us(torchrun + ["--backend", "fake", "--bytes", "4"] + loop, args.timeout, log))
            for nbytes in args.bytes:
                batch = ["--bytes", str(nbytes), "--batch", str(max(10, min(200, (8 << 20) // nbytes)))]
                times.setdefault(("ringdist", nbytes), []).append(
                    per_call_us(torchrun + batch + loop, args.timeout, log))
                if with_mpi:
                    times.setdefault(("mpi", nbytes), []).append(per_call_us(mpirun + batch + loop, args.timeout, log))
                iterations = str(max(100, min(5000, (1 << 30) // nbytes)))
                for mode in ("kernel", "shm"):
                    times.setdefault((f"copy_{mode}", nbytes), []).append(
                        per_call_us([probe, mode, str(nbytes), iterations], args.timeout, log))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    med = {key: statistics.median(v) for key, v in times.items()}
    floor = med[("floor", 0)]
    rows = []
    print(f"\ntorch's floor (fake allgather, 4 B): {floor:.1f} us; medians of {args.rounds} rounds, us per call")
    print(f"{'bytes/rank':>10} {'kernel':>8} {'shm':>8} {'Open MPI':>9} {'ringdist':>9} "
          f"{'MPI own':>8} {'ringdist own':>12} {'MPI/ringdist':>12}")
    for nbytes in args.bytes:
        kernel, shm = med[("copy_kernel", nbytes)], med[("copy_shm", nbytes)]
        bound, ours = min(kernel, shm), med[("ringdist", nbytes)]
        mpi = med.get(("mpi", nbytes), math.nan)
        row = {"bytes_per_rank": nbytes, "copy_kernel_us": kernel, "copy_shm_us": shm,
               "copy_bound_us": bound, "mpi_us": mpi, "ringdist_us": ours,
               "mpi_own_us": mpi - bound, "ringdist_own_us": ours - bound - floor,
               "speedup_vs_mpi": mpi / ours,
               "rounds": {k[0]: v for k, v in times.items() if k[1] == nbytes}}
        rows.append({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})
        print(f"{nbytes:>10} {kernel:>8.1f} {shm:>8.1f} {mpi:>9.1f} {ours:>9.1f} {row['mpi_own_us']:>8.1f} "
              f"{row['ringdist_own_us']:>12.1f} {row['speedup_vs_mpi']:>11.2f}x")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "floor_us": floor,
                               "floor_rounds": times[("floor", 0)], "rows": rows})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
