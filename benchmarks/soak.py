"""Soak: a long random mix of every collective and point-to-point op, every result checked.

    python benchmarks/soak.py --nproc 4 --minutes 10 --json soak.json
    RINGDIST_HOST_ID=a,b,c,d python benchmarks/soak.py --minutes 10     # 4 emulated hosts (TCP)
    python benchmarks/soak.py --ops 400        # a fixed number of ops, however long they take

Starts --nproc ranks on this machine (RINGDIST_CRC=1: every transfer checksummed). All ranks
draw the same random sequence of operations, sizes (1 to 2^20 elements), dtypes, reduce ops,
roots and async/sync forms; inputs are small integers, so every expected result has a closed
form computed on the rank itself in float64. Each rank counts results that differ, and records
its resident memory and open file descriptors as it goes. Prints ops run, mismatches and memory
and fd growth (first sample after warm-up to the last); exit code 1 on any mismatch or error.
"""
import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import machine_info, write_json  # noqa: E402

SIZES = (1, 7, 1000, 4099, 65537, 1 << 18, 1 << 20)
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16)
WARMUP_OPS = 200  # memory is measured from here: caches and pools are filled by then
# torch 2.13 renamed these (the old names warn); torch 2.11/2.12 have only the old ones.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def value(rank, n, dtype, salt):
    """Rank ``rank``'s input: small integers (exact in every dtype and in their sums)."""
    return ((torch.arange(n, dtype=torch.float64) + salt) % 3 + 1 + rank).to(dtype)


def expected_reduce(op, n, dtype, salt, size):
    parts = [value(r, n, torch.float64, salt) for r in range(size)]
    stacked = torch.stack(parts)
    if op == dist.ReduceOp.SUM:
        return stacked.sum(0).to(dtype)
    if op == dist.ReduceOp.MAX:
        return stacked.max(0).values.to(dtype)
    return stacked.min(0).values.to(dtype)


class Soak:
    def __init__(self, rng, rank, size):
        self.rng, self.rank, self.size = rng, rank, size
        self.ops = {}

    def pick(self):
        n = self.rng.choice(SIZES)
        dtype = self.rng.choice(DTYPES)
        # Half types hold integers exactly only up to 256 (bf16): keep sums small.
        if dtype in (torch.bfloat16, torch.float16):
            n = min(n, 65537)
        return n, dtype, self.rng.randrange(1000)

    def step(self):
        name = self.rng.choice(sorted(self.CHECKS))
        self.ops[name] = self.ops.get(name, 0) + 1
        return self.CHECKS[name](self)

    def all_reduce(self):
        n, dtype, salt = self.pick()
        op = self.rng.choice((dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN))
        t = value(self.rank, n, dtype, salt)
        work = dist.all_reduce(t, op=op, async_op=self.rng.random() < 0.5)
        if work is not None:
            work.wait()
        return torch.equal(t, expected_reduce(op, n, dtype, salt, self.size))

    def reduce(self):
        n, dtype, salt = self.pick()
        root = self.rng.randrange(self.size)
        t = value(self.rank, n, dtype, salt)
        dist.reduce(t, dst=root)
        return self.rank != root or torch.equal(t, expected_reduce(dist.ReduceOp.SUM, n, dtype, salt,
                                                                     self.size))

    def broadcast(self):
        n, dtype, salt = self.pick()
        root = self.rng.randrange(self.size)
        t = value(self.rank, n, dtype, salt)
        dist.broadcast(t, src=root)
        return torch.equal(t, value(root, n, dtype, salt))

    def all_gather(self):
        n, dtype, salt = self.pick()
        n = min(n, 1 << 18)
        out = torch.empty(n * self.size, dtype=dtype)
        ALL_GATHER(out, value(self.rank, n, dtype, salt))
        return torch.equal(out, torch.cat([value(r, n, dtype, salt) for r in range(self.size)]))

    def reduce_scatter(self):
        n, dtype, salt = self.pick()
        n = min(n, 1 << 18)
        full = torch.cat([value(self.rank, n, dtype, salt + r) for r in range(self.size)])
        out = torch.empty(n, dtype=dtype)
        REDUCE_SCATTER(out, full)
        return torch.equal(out, expected_reduce(dist.ReduceOp.SUM, n, dtype, salt + self.rank,
                                                self.size))

    def all_to_all(self):
        n, dtype, salt = self.pick()
        n = min(n, 1 << 18)
        send = torch.cat([value(self.rank, n, dtype, salt + r) for r in range(self.size)])
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return torch.equal(recv, torch.cat([value(r, n, dtype, salt + self.rank)
                                            for r in range(self.size)]))

    def gather_scatter(self):
        n, dtype, salt = self.pick()
        root = self.rng.randrange(self.size)
        mine = value(self.rank, n, dtype, salt)
        bufs = [torch.empty_like(mine) for _ in range(self.size)] if self.rank == root else None
        dist.gather(mine, gather_list=bufs, dst=root)
        ok = self.rank != root or all(torch.equal(b, value(r, n, dtype, salt)) for r, b in enumerate(bufs))
        out = torch.empty_like(mine)
        dist.scatter(out, scatter_list=bufs, src=root)
        return ok and torch.equal(out, value(self.rank, n, dtype, salt))

    def ring_p2p(self):
        n, dtype, salt = self.pick()
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        got = torch.empty(n, dtype=dtype)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, value(self.rank, n, dtype, salt), right),
                                        dist.P2POp(dist.irecv, got, left)])
        for w in works:
            w.wait()
        return torch.equal(got, value(left, n, dtype, salt))

    def barrier(self):
        dist.barrier()
        return True

    CHECKS = {"all_reduce": all_reduce, "reduce": reduce, "broadcast": broadcast,
              "all_gather": all_gather, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
              "gather_scatter": gather_scatter, "ring_p2p": ring_p2p, "barrier": barrier}


def resources():
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return rss_pages * os.sysconf("SC_PAGE_SIZE"), len(os.listdir("/proc/self/fd"))


def worker(rank, args, port, results):
    import torch_ringdist  # noqa: F401

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, args.nproc, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=args.nproc,
                            timeout=timedelta(seconds=120))
    soak = Soak(random.Random(args.seed), rank, args.nproc)
    deadline = time.monotonic() + args.seconds
    mismatches, ops, samples = 0, 0, []
    while True:
        if args.ops is not None:
            if ops == args.ops:
                break
        elif ops % 50 == 0:
            # Every rank stops at the same op: rank 0's clock decides, every 50 ops.
            stop = torch.tensor([float(time.monotonic() >= deadline)])
            dist.broadcast(stop, src=0)
            if stop.item():
                break
        mismatches += 0 if soak.step() else 1
        ops += 1
        if ops >= WARMUP_OPS and ops % 20 == 0:
            samples.append((ops, *resources()))
    total = torch.tensor([float(mismatches), float(ops)])
    dist.all_reduce(total)
    results.put((rank, {"ops": ops, "mismatches": mismatches, "by_op": soak.ops, "samples": samples}))
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--ops", type=int, default=None,
                   help=f"run exactly this many ops instead of a time (at least {WARMUP_OPS + 60}, "
                        "so that memory growth has samples to compare)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    if args.minutes is not None:
        args.seconds = args.minutes * 60
    if args.ops is not None and args.ops < WARMUP_OPS + 60:
        p.error(f"--ops {args.ops}: memory is sampled from op {WARMUP_OPS} on, every 20 ops; "
                f"give at least {WARMUP_OPS + 60}")
    os.environ.setdefault("RINGDIST_CRC", "1")
    # Buffers above 128 KiB get their own mappings, returned on free: RSS then follows live
    # memory instead of glibc's dynamic threshold, so a leak stands out (read at rank start).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 << 10))
    store = dist.TCPStore("127.0.0.1", 0, args.nproc, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, store.port, results)) for r in range(args.nproc)]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    got = {}
    # Ranks that have not reported by then are stuck: a time run ends at its time, an op-count
    # run gets a generous 2 s per op on a loaded machine.
    give_up = start + 300 + (args.seconds if args.ops is None else 2 * args.ops)
    while len(got) < args.nproc and time.monotonic() < give_up:
        try:
            rank, report = results.get(timeout=1)
            got[rank] = report
        except Exception:  # noqa: BLE001 (queue.Empty)
            if any(proc.exitcode not in (None, 0) for proc in procs):
                break
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if len(got) < args.nproc or any(proc.exitcode != 0 for proc in procs):
        print(f"soak: ranks failed (exit codes {[proc.exitcode for proc in procs]})", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - start
    if len(got[0]["samples"]) < 3:
        print(f"soak: only {got[0]['ops']} ops, too few to measure memory growth (samples start "
              f"at op {WARMUP_OPS}): run longer", file=sys.stderr)
        return 1
    growth = {}
    for rank, r in sorted(got.items()):
        # Transient buffers (up to 8 MiB each) make single samples swing by tens of MiB:
        # compare the medians of the first and last thirds of the run.
        rss = [sample[1] for sample in r["samples"]]
        third = max(1, len(rss) // 3)
        growth[rank] = {"rss_mib": (statistics.median(rss[-third:]) - statistics.median(rss[:third])) / 2**20,
                        "fds": r["samples"][-1][2] - r["samples"][0][2],
                        "rss_mib_end": rss[-1] / 2**20}
    mismatches = sum(r["mismatches"] for r in got.values())
    ops = got[0]["ops"]
    hosts = os.environ.get("RINGDIST_HOST_ID", "")
    print(f"soak: {args.nproc} ranks{' on hosts ' + hosts if hosts else ''}, CRC "
          f"{os.environ['RINGDIST_CRC']}, {elapsed:.0f} s: {ops} ops per rank ({got[0]['by_op']}), "
          f"{mismatches} mismatches")
    for rank, g in growth.items():
        print(f"  rank {rank}: RSS {g['rss_mib_end']:.1f} MiB, growth (median of the last "
              f"third of samples minus the first) {g['rss_mib']:+.1f} MiB, fds {g['fds']:+d}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "nproc": args.nproc, "hosts": hosts,
                               "seconds": elapsed, "ops": ops, "by_op": got[0]["by_op"],
                               "mismatches": mismatches, "growth": growth,
                               "samples": {r: got[r]["samples"] for r in got}})
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
