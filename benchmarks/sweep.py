#!/usr/bin/env python3
"""nccl-tests style sweep of one collective on one torch.distributed backend.

Run under torchrun, one process per rank:

    torchrun --nproc-per-node 2 benchmarks/sweep.py --backend gloo \
        --collective allreduce --dtype float32 --min-bytes 8 --max-bytes 256M --json out.json

Terms (as in nccl-tests):
  size   bytes of the full buffer: the in-place buffer for allreduce and broadcast, the
         gathered output for allgather, the input of reduce_scatter and of alltoall.
  count  elements in that buffer (allgather/reduce_scatter/alltoall: N chunks of count/N
         each).
  time   per sample, the slowest rank's wall time for one op (ops faster than --batch-us
         are timed as a batch of back-to-back calls and divided); the row shows the
         median over samples.
  algbw  size / time.   busbw  algbw * factor, the factor making busbw comparable to
         link bandwidth: allreduce 2(N-1)/N, allgather, reduce_scatter and alltoall
         (N-1)/N, broadcast 1.

Two process groups: the backend under test runs only the measured op; a separate gloo
group does every barrier, time exchange and correctness tally, so bookkeeping never runs
on (or warms, or queues behind) the backend being measured.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

# Fixed before torch is imported: intra-op threads would compete with the backend's
# own threads for the 2 cores and make runs incomparable.
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_common import machine_info, write_json  # noqa: E402

# sendrecv: each rank sends its buffer to the next rank and receives the previous one's.
COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall", "sendrecv")
# Collectives whose buffer is N blocks (the count a multiple of N).
CHUNKED = ("allgather", "reduce_scatter", "alltoall")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SHORT_TYPE = {"float32": "float", "bfloat16": "bfloat16"}

# Values stay small integers so every partial sum is exact: bf16 holds integers exactly
# up to 256, so with pattern (i % kPattern) + 1 and ranks weighted 1..N the largest sum is
# N(N+1)/2 * kPattern, exact for N <= 12 in bf16 (fp32 is exact far beyond that).
kPattern = 3


def parse_bytes(text):
    """'8', '64K', '256M', '1G' -> bytes (binary multiples, as nccl-tests)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def bus_factor(collective, n):
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in CHUNKED:
        return (n - 1) / n
    return 1.0


def size_plan(args, n, elsize):
    """(count, awkward) pairs: x4 grid from min to max bytes (max included) + awkward counts.

    For allgather/reduce_scatter the count is the full buffer (N chunks), so it is rounded
    to a multiple of N; their awkward cases use an odd chunk instead.
    """
    sizes = []
    b = args.min_bytes
    while b < args.max_bytes:
        sizes.append(b)
        b *= args.step_factor
    sizes.append(args.max_bytes)
    chunked = args.collective in CHUNKED
    plan = []
    for nbytes in sizes:
        count = max(1, nbytes // elsize)
        if chunked:
            count = max(n, count // n * n)
        plan.append((count, False))
    if not args.no_awkward:
        # 2^20+3: odd, large enough to take a multi-segment path; n*4096+1: not divisible
        # by N, in the small band. Both only if inside the requested byte range.
        for count in (n * 4096 + 1, (1 << 20) + 3):
            if chunked:
                count = count * n  # chunk = the awkward count itself
            elif count % n == 0:
                count += 1
            if args.min_bytes <= count * elsize <= args.max_bytes:
                plan.append((count, True))
    plan = sorted(set(plan), key=lambda p: (p[0], p[1]))
    return plan


class Collective:
    """Buffers, the op under test and its closed-form check for one (collective, count)."""

    def __init__(self, name, count, dtype, rank, n, pg, api, device):
        self.name, self.count, self.rank, self.n, self.pg, self.api = name, count, rank, n, pg, api
        self.device = device
        # int32: half the memory at 256 MiB
        idx = torch.arange(count, dtype=torch.int32, device=device)
        self.pattern = (idx % kPattern + 1).to(dtype)
        chunk = count // n
        zeros = lambda k: torch.zeros(k, dtype=dtype, device=device)  # noqa: E731
        if name == "allreduce":
            self.buf = self.pattern * (rank + 1)
        elif name == "broadcast":
            self.buf = self.pattern.clone() if rank == 0 else zeros(count)
        elif name == "allgather":
            # chunk r of the output must hold rank r's input: pattern + r*kPattern.
            self.inp = self.pattern[rank * chunk:(rank + 1) * chunk] + rank * kPattern
            self.out = zeros(count)
        elif name == "reduce_scatter":
            self.inp = self.pattern * (rank + 1)
            self.out = zeros(chunk)
        elif name == "alltoall":
            # block d of rank r's input goes to rank d: pattern + r*kPattern.
            self.inp = self.pattern + rank * kPattern
            self.out = zeros(count)
        elif name == "sendrecv":
            self.inp = self.pattern + rank * kPattern
            self.out = zeros(count)
        self.chunk = chunk

    def run(self):
        pg = self.pg
        if self.name == "allreduce":
            dist.all_reduce(self.buf, op=dist.ReduceOp.SUM, group=pg)
        elif self.name == "broadcast":
            dist.broadcast(self.buf, src=0, group=pg)
        elif self.name == "allgather":
            if self.api == "list":
                dist.all_gather(list(self.out.chunk(self.n)), self.inp, group=pg)
            else:
                _all_gather_single(self.out, self.inp, group=pg)
        elif self.name == "reduce_scatter":
            if self.api == "list":
                dist.reduce_scatter(self.out, list(self.inp.chunk(self.n)), group=pg)
            else:
                _reduce_scatter_single(self.out, self.inp, group=pg)
        elif self.name == "alltoall":
            if self.api == "list":
                dist.all_to_all(list(self.out.chunk(self.n)), list(self.inp.chunk(self.n)), group=pg)
            else:
                dist.all_to_all_single(self.out, self.inp, group=pg)
        elif self.name == "sendrecv":
            ranks = dist.get_process_group_ranks(pg) if pg is not None else range(self.n)
            ranks = list(ranks)
            nxt, prv = ranks[(self.rank + 1) % self.n], ranks[(self.rank - 1) % self.n]
            works = [dist.irecv(self.out, src=prv, group=pg), dist.isend(self.inp, dst=nxt, group=pg)]
            for w in works:
                w.wait()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # timed to the result, not to the launch

    def wrong(self):
        """Elements on this rank that differ from the closed form."""
        n = self.n
        if self.name == "allreduce":
            got, want = self.buf, self.pattern * (n * (n + 1) // 2)
        elif self.name == "broadcast":
            got, want = self.buf, self.pattern
        elif self.name == "allgather":
            offs = torch.arange(self.count, dtype=torch.int32, device=self.device) // self.chunk * kPattern
            got, want = self.out, self.pattern + offs.to(self.pattern.dtype)
        elif self.name == "sendrecv":
            got, want = self.out, self.pattern + (self.rank - 1) % n * kPattern
        elif self.name == "alltoall":
            # block s holds rank s's block `rank`: that slice of the pattern + s*kPattern.
            r = self.rank
            offs = torch.arange(self.count, dtype=torch.int32, device=self.device) // self.chunk * kPattern
            got = self.out
            want = self.pattern[r * self.chunk:(r + 1) * self.chunk].repeat(n) + offs.to(self.pattern.dtype)
        else:
            r = self.rank
            got = self.out
            want = self.pattern[r * self.chunk:(r + 1) * self.chunk] * (n * (n + 1) // 2)
        return int((got != want).sum().item())


# torch 2.13 renamed the single-tensor collectives; older names still work elsewhere.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def measure(run, slowest, args, nbytes):
    """Median per-op time (seconds) of the slowest rank, and all samples.

    `slowest(x)` returns the largest x over the ranks; it is also the barrier before each
    sample. Ops faster than --batch-us are timed in batches of back-to-back calls (the
    same count on every rank), so the barrier's exit skew between ranks, which is tens of
    microseconds for a gloo barrier, is spread over the batch instead of added to each op.
    """
    for _ in range(args.warmup):
        run()
    # The batch size from a calibration run of back-to-back calls: a few calls right after
    # the barrier would mostly time the barrier's skew.
    calls = max(args.warmup, 20) if nbytes < args.large_bytes // 16 else args.warmup
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    per_op = slowest((time.perf_counter() - t0) / calls)
    batch = max(1, min(args.max_batch, int(args.batch_us * 1e-6 / max(per_op, 1e-9))))
    min_iters = args.min_iters_large if nbytes >= args.large_bytes else args.min_iters
    samples = []
    spent = 0.0
    prev = None
    while True:
        # One exchange per sample: the barrier before it and the previous sample's
        # slowest-rank time, none of it inside the timed region.
        took = slowest(prev if prev is not None else 0.0)
        if prev is not None:
            samples.append(took)
            spent += took * batch
        # Every rank holds the same samples, so every rank takes the same decision.
        if len(samples) >= args.iters or (spent >= args.time_budget and len(samples) >= min_iters):
            break
        t0 = time.perf_counter()
        for _ in range(batch):
            run()
        prev = (time.perf_counter() - t0) / batch
    return statistics.median(samples), samples, batch


def add_common_args(p):
    """Sweep options shared by this script and mpi_sweep.py."""
    p.add_argument("--collective", choices=COLLECTIVES, default="allreduce")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("8"))
    p.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("256M"))
    p.add_argument("--step-factor", type=int, default=4)
    p.add_argument("--no-awkward", action="store_true", help="skip the awkward counts")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="stop after this many timed samples")
    p.add_argument("--time-budget", type=float, default=1.0,
                   help="seconds of op time after which a size stops early ...")
    p.add_argument("--min-iters", type=int, default=5, help="... but not before this many")
    p.add_argument("--min-iters-large", type=int, default=10,
                   help="floor for sizes >= --large-bytes (protocol: >= 10 at 256 MiB)")
    p.add_argument("--large-bytes", type=parse_bytes, default=parse_bytes("256M"))
    p.add_argument("--batch-us", type=float, default=2000,
                   help="ops faster than this are timed in back-to-back batches of about "
                        "this length (0: one op per sample)")
    p.add_argument("--max-batch", type=int, default=1000)
    p.add_argument("--json", help="write results here (rank 0)")


def run_sweep(args, rank, n, make, slowest, total, backend, extra=None):
    """The size loop: per size, check the result against its closed form, then time it.

    make(count) -> Collective; slowest(x) -> max over ranks; total(k) -> sum over ranks.
    Writes the JSON (rank 0) that compare.py merges.
    """
    dtype = DTYPES[args.dtype]
    elsize = torch.empty(0, dtype=dtype).element_size()
    factor = bus_factor(args.collective, n)
    redop = "sum" if args.collective in ("allreduce", "reduce_scatter") else "none"
    if rank == 0:
        print(f"# ringdist-bench sweep: backend {backend}  collective {args.collective}  "
              f"dtype {args.dtype}  nranks {n}")
        print(f"# warmup {args.warmup}  samples <= {args.iters}  time budget {args.time_budget}s"
              f"  batch ~{args.batch_us:g} us  time = median over samples of the slowest rank")
        print("#")
        print(f"# {'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'time':>11} "
              f"{'algbw':>8} {'busbw':>8} {'#wrong':>7} {'batch':>6}")
        print(f"# {'(B)':>12} {'(elements)':>12} {'':>9} {'':>6} {'(us)':>11} "
              f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7} {'':>6}")
        sys.stdout.flush()
    rows = []
    for count, awkward in size_plan(args, n, elsize):
        nbytes = count * elsize
        coll = make(count)
        # Correctness first, outside the timed loop, on fresh buffers.
        coll.run()
        wrong = total(coll.wrong())
        med, samples, batch = measure(coll.run, slowest, args, nbytes)
        algbw = nbytes / med / 1e9
        row = {
            "bytes": nbytes, "count": count, "type": args.dtype, "redop": redop,
            "awkward": awkward, "time_us": med * 1e6, "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor, "wrong": wrong, "batch": batch,
            "iters": len(samples), "samples_us": [s * 1e6 for s in samples],
        }
        rows.append(row)
        if rank == 0:
            mark = "*" if awkward else " "
            print(f"{mark} {nbytes:>12} {count:>12} {SHORT_TYPE[args.dtype]:>9} {redop:>6} "
                  f"{row['time_us']:>11.2f} {algbw:>8.3f} {row['busbw_GBps']:>8.3f} "
                  f"{row['wrong']:>7} {batch:>6}")
            sys.stdout.flush()
        del coll
    if rank == 0:
        bad = sum(r["wrong"] for r in rows)
        right = [r["busbw_GBps"] for r in rows if r["wrong"] == 0]
        avg = statistics.fmean(right) if right else 0.0
        print(f"# Out of bounds values : {bad} {'OK' if bad == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {avg:.4f} GB/s   (mean over rows with #wrong == 0;"
              f" * = awkward count)")
        if args.json:
            out = {
                "machine": machine_info(),
                "backend": backend,
                "collective": args.collective,
                "dtype": args.dtype,
                "world_size": n,
                "bus_factor": factor,
                "env": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith(("RINGDIST_", "RDBENCH_"))
                        or k in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")},
                "settings": {k: getattr(args, k) for k in
                             ("warmup", "iters", "time_budget", "min_iters", "min_iters_large",
                              "batch_us", "min_bytes", "max_bytes")},
                "avg_busbw_GBps": avg,
                "rows": rows,
            }
            out.update(extra or {})
            write_json(args.json, out)


def init_backend(backend, timeout):
    """init_process_group for ringdist, gloo (any registered backend), or fake: torch's
    backend that moves no data (the dispatch floor)."""
    if backend == "ringdist":
        try:
            import torch_ringdist  # noqa: F401  registers the "ringdist" backend
        except ImportError as e:
            sys.exit(f"--backend ringdist needs torch_ringdist installed: {e}")
    elif backend == "fake":
        import importlib
        import warnings
        warnings.simplefilter("ignore")  # torch's per-call deprecation chatter on fake
        importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers it
    if backend == "fake":  # takes no rendezvous from the environment: give it the store
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timeout)
        dist.init_process_group("fake", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="gloo",
                   help="ringdist, gloo (any registered backend), or fake: torch's backend "
                        "that communicates nothing, the dispatch floor (results unchecked)")
    add_common_args(p)
    p.add_argument("--api", choices=("tensor", "list"), default="tensor",
                   help="allgather/reduce_scatter entry point: single tensor or list of chunks")
    p.add_argument("--ifname", default=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                   help="GLOO_SOCKET_IFNAME for gloo groups (the bookkeeping group too)")
    p.add_argument("--timeout", type=float, default=600, help="process group timeout, seconds")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the tensors live; cuda: GPU LOCAL_RANK %% device count, so "
                        "several ranks share a GPU when there are fewer GPUs than ranks")
    args = p.parse_args()
    if args.step_factor < 2:
        p.error("--step-factor must be >= 2")

    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    init_backend(args.backend, timeout)
    pg = dist.group.WORLD
    book = dist.new_group(backend="gloo", timeout=timeout)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # A group's first collective on a GPU decides its device paths (ringdist: whether the
        # ranks share the GPU); point-to-point alone would never reach that decision.
        dist.all_reduce(torch.zeros(1, device=device), group=pg)

    def reduce_book(x, op, kind):
        t = torch.tensor([x], dtype=kind)
        dist.all_reduce(t, op=op, group=book)
        return t.item()

    def make(count):
        coll = Collective(args.collective, count, dtype, rank, n, pg, args.api, device)
        if args.backend == "fake":
            coll.wrong = lambda: 0  # nothing is computed: only the call's cost counts
        return coll

    run_sweep(args, rank, n, make,
              slowest=lambda x: reduce_book(x, dist.ReduceOp.MAX, torch.float64),
              total=lambda k: int(reduce_book(k, dist.ReduceOp.SUM, torch.int64)),
              backend=args.backend,
              extra={"ifname": args.ifname, "device": str(device), "api": args.api,
                     "checked": args.backend != "fake",
                     # ringdist: how this host's ranks copied (chosen at init), and why
                     # (None for builds before the choice existed, e.g. in an A/B)
                     "same_host_copy": getattr(pg._get_backend(torch.device("cpu")),
                                               "same_host_copy", None)
                     if args.backend == "ringdist" else None,
                     "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None})
    dist.barrier(group=book)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
