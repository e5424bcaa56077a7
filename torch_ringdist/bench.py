"""`python -m torch_ringdist.bench`: is ringdist faster than gloo on this machine?

Launches --nproc local ranks per backend (ringdist and gloo, alternating --rounds times),
all-reduces float32 buffers of each size in --sizes (SUM, in place), and prints an
nccl-tests-style table: time per allreduce (slowest rank, median over rounds), algbw and
busbw (2(N-1)/N x algbw), and ringdist's speedup. Every result is checked against its
closed form (#wrong counts mismatches). Defaults finish in well under a minute on two cores.

    python -m torch_ringdist.bench --nproc 4 --sizes 4K 1M 64M --json bench.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torch_ringdist._provenance import package_checkout, provenance

BACKENDS = ("ringdist", "gloo")
# Per size: iterations within this time (after warm-up), never fewer than MIN_ITERS.
TIME_BUDGET_S = 0.2
MIN_ITERS, MAX_ITERS = 3, 200


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    scale = units.get(text[-1:], 1)
    value = int(text[:-1] if text[-1:] in units else text)
    if value * scale < 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is smaller than one float32")
    return value * scale


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _measure(size: int, rank: int, world: int) -> tuple[float, int]:
    """Seconds per allreduce of `size` bytes (slowest rank) and elements that were wrong."""
    buf = torch.empty(size // 4)
    expected = world * (world + 1) / 2  # every rank contributes rank + 1: exact in float32
    wrong = 0
    buf.fill_(rank + 1.0)
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    first = _slowest(time.perf_counter() - t0)
    wrong += int((buf != expected).sum())
    iters = max(MIN_ITERS, min(MAX_ITERS, int(TIME_BUDGET_S / max(first, 1e-6))))
    dist.barrier()
    total = 0.0
    for _ in range(iters):
        buf.fill_(rank + 1.0)
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        total += time.perf_counter() - t0
    wrong += int((buf != expected).sum())
    return _slowest(total / iters), wrong


def _route(backend: str, size: int) -> str:
    """The route ringdist's allreduce takes at this size on this group ("" for gloo)."""
    if backend != "ringdist":
        return ""
    group = dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu")).allreduce_route(size)["route"]


def _rank(rank: int, world: int, backend: str, store: str, sizes: list[int], queue) -> None:
    try:
        import torch_ringdist  # noqa: F401  (registers "ringdist")
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                                world_size=world)
        rows = [(*_measure(size, rank, world), _route(backend, size)) for size in sizes]
        dist.destroy_process_group()
    except BaseException as exc:  # the parent names it and stops the other ranks
        queue.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1)
    if rank == 0:
        queue.put(("rows", rank, rows))


def _run(backend: str, world: int, sizes: list[int]) -> list[tuple[float, int, str]]:
    """Runs the ranks; rank 0's rows. A rank that fails or dies ends the run within a second,
    with its error."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks: gloo on loopback
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank,
                             args=(r, world, backend, os.path.join(tmp, "store"), sizes, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = None
        try:
            rows = _wait_for_rows(backend, procs, queue, deadline=time.monotonic() + 300)
        finally:
            for p in procs:
                # After a failure the round is lost, its error is in hand, and the other ranks
                # may wait for the lost one: stop them all at once.
                if rows is None:
                    p.kill()
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if failed:
        raise SystemExit(f"torch_ringdist.bench: {backend}: a rank exited with code {failed[0]}")
    return rows


# After a rank reports an error, how long to look for a peer that died: a death makes its peers
# fail within milliseconds, sometimes before this process has seen the dead one exit.
DEATH_GRACE_S = 0.5


def _dead(procs, killed_only=False):
    """The first rank whose process ended in failure (killed_only: by a signal), and how, or
    None."""
    for r, p in enumerate(procs):
        if p.exitcode not in (None, 0) and (p.exitcode < 0 or not killed_only):
            how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
            return f"rank {r} died ({how})"
    return None


def _wait_for_rows(backend, procs, queue, deadline):
    while time.monotonic() < deadline:
        # A rank's error is in the queue before its process ends (exiting, it flushes the queue).
        dead = _dead(procs)
        try:
            kind, rank, payload = queue.get(timeout=0.1)
        except Empty:
            if dead:
                raise SystemExit(f"torch_ringdist.bench: {backend} {dead}")
            continue
        if kind == "error":
            # The cause first: a peer killed by a signal (the error here is then its consequence;
            # a rank that failed by itself reports its own error, as this one did).
            give_up = time.monotonic() + DEATH_GRACE_S
            while (dead := _dead(procs, True)) is None and time.monotonic() < give_up:
                time.sleep(0.05)
            cause = f"{dead}; then " if dead else ""
            raise SystemExit(f"torch_ringdist.bench: {backend} {cause}rank {rank} failed: {payload}")
        return payload
    raise SystemExit(f"torch_ringdist.bench: {backend} gave no result within 300 s")


def _human(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_ringdist.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    p.add_argument("--sizes", type=parse_size, nargs="+",
                   default=[parse_size(s) for s in ("4K", "64K", "1M", "16M", "64M")],
                   help="buffer sizes in bytes, K/M/G suffixes (default 4K 64K 1M 16M 64M)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per backend")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.nproc < 2:
        p.error("--nproc must be >= 2")
    times = {b: [[] for _ in args.sizes] for b in BACKENDS}
    wrong = {b: [0 for _ in args.sizes] for b in BACKENDS}
    routes = ["" for _ in args.sizes]
    start = time.perf_counter()
    try:
        for _ in range(args.rounds):
            for backend in BACKENDS:
                for i, (seconds, bad, route) in enumerate(_run(backend, args.nproc, args.sizes)):
                    times[backend][i].append(seconds)
                    wrong[backend][i] += bad
                    routes[i] = routes[i] or route
    except SystemExit:
        # A failed run leaves at once: Python's last garbage collections at exit would walk
        # every object torch made (a second on a loaded 2-core machine).
        gc.freeze()
        raise
    n = args.nproc
    print(f"# torch_ringdist.bench: allreduce float32 SUM, {n} local ranks, {args.rounds} "
          f"alternating rounds, torch {torch.__version__}, {os.cpu_count()} cores")
    print(f"# {'size':>8} {'ringdist us':>12} {'busbw GB/s':>11} {'#wrong':>6}"
          f" {'gloo us':>12} {'busbw GB/s':>11} {'#wrong':>6} {'speedup':>8}  ringdist route")
    rows = []
    for i, size in enumerate(args.sizes):
        ours = statistics.median(times["ringdist"][i])
        theirs = statistics.median(times["gloo"][i])
        bus = [2 * (n - 1) / n * size / t / 1e9 for t in (ours, theirs)]
        rows.append({"bytes": size, "ringdist_us": ours * 1e6, "gloo_us": theirs * 1e6,
                     "ringdist_busbw_GBps": bus[0], "gloo_busbw_GBps": bus[1],
                     "speedup": theirs / ours, "wrong": {b: wrong[b][i] for b in BACKENDS},
                     "ringdist_route": routes[i]})
        print(f"  {_human(size):>8} {ours * 1e6:12.1f} {bus[0]:11.3f} {wrong['ringdist'][i]:6d}"
              f" {theirs * 1e6:12.1f} {bus[1]:11.3f} {wrong['gloo'][i]:6d} {theirs / ours:7.2f}x"
              f"  {routes[i]}")
    print(f"# {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": n, "rounds": args.rounds, "torch": torch.__version__,
                       "cores": os.cpu_count(), "rows": rows, "provenance": provenance(package_checkout())}, f,
                      indent=1)
    return 1 if any(any(w) for w in wrong.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
