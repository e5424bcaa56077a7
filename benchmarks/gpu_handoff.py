#!/usr/bin/env python3
"""How long one process's GPU work takes to hand off to another process's on the same GPU.

    python benchmarks/gpu_handoff.py --iters 2000 --json out.json

Two processes share this machine's first GPU (no MPS unless the machine runs it: reported).
Each mode runs in both at once and reports microseconds:

- `sync-alone`: rank 0 alone, a 1024-element add then `torch.cuda.synchronize()`, N times
  (rank 1 holds its context and idles): the host's wait for the GPU with nobody to share.
- `sync-both`: the same in both processes at once: what each host wait costs when the two
  contexts time-slice the GPU (the first H100 run measured 21.4 us against 274 us).
- `host-pingpong`: a ping-pong through host waits: rank 0 runs its add, synchronizes and sets a
  flag in shared host memory; rank 1 spins on it, runs its add, synchronizes, sets the other
  flag. Half the round trip is one hand-off as ringdist's device path does it today.
- `stream-pingpong-host`, `stream-pingpong-device`: the same ping-pong with no host in the loop.
  Every iteration is queued up front behind a gate: rank 0 waits on the GPU
  (`cuStreamWaitValue32`, GEQ) for rank 1's counter to reach i, runs its add and writes its own
  counter i (`cuStreamWriteValue32`); rank 1 the mirror image. The counters live in host memory
  registered with both contexts (`cuMemHostRegister`), or in rank 0's device memory opened by
  rank 1 through CUDA IPC. The gate opens once both have queued a batch; the time from the gate
  to the last write, over 2 x iterations, is H, the one-way hand-off between the processes'
  streams. Both counters must end at the iteration count (checked: the ping-pong really ran).

The driver entry points come from libcuda through ctypes (a benchmark; the library reaches them
through cudaGetDriverEntryPoint). Queued work waits behind a gate, so a batch is limited
(--batch) and a watchdog opens the gate after 10 s if a queue filled up first; such a result
is marked invalid.
"""
import argparse
import ctypes
import mmap
import os
import tempfile
import subprocess
import sys
import threading
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import machine_info, write_json  # noqa: E402

MODES = ("sync-alone", "sync-both", "host-pingpong", "stream-pingpong-host",
         "stream-pingpong-device")
PAGE = 4096
# uint32 slots in the shared page, 64 bytes apart: the gate, rank 0's and rank 1's counters.
GATE, COUNTER = 0, (16, 32)
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP = 0x1, 0x2


class Driver:
    """The four driver calls the stream ping-pong needs, on the current context."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self.wait = lib.cuStreamWaitValue32_v2
        self.write = lib.cuStreamWriteValue32_v2
        self.register = lib.cuMemHostRegister_v2
        self.device_pointer = lib.cuMemHostGetDevicePointer_v2
        for fn in (self.wait, self.write):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        self.register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        self.device_pointer.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p,
                                        ctypes.c_uint]

    @staticmethod
    def check(result, what):
        if result != 0:
            raise RuntimeError(f"gpu_handoff: {what} failed with CUresult {result}")

    def host_counters(self, page):
        """The shared page (an mmap) registered with this context: its device address."""
        host = ctypes.addressof(ctypes.c_char.from_buffer(page))
        self.check(self.register(host, PAGE, CU_MEMHOSTREGISTER_PORTABLE |
                                 CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
        dptr = ctypes.c_uint64()
        self.check(self.device_pointer(ctypes.byref(dptr), host, 0), "cuMemHostGetDevicePointer")
        return dptr.value


def map_page(path):
    """The page both ranks share (a file in /dev/shm), mapped here."""
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), PAGE)


def stream_pingpong(rank, args, host, page, counters, barrier, driver, x):
    """One process's side of the queued ping-pong; returns (us per hand-off, valid). `page`:
    the shared host page's device address (the gate, and the counters unless `counters`)."""
    stream = torch.cuda.current_stream()
    handle = ctypes.c_void_p(stream.cuda_stream)
    gate = page + 4 * GATE
    base = page if counters is None else counters
    mine, theirs = base + 4 * COUNTER[rank], base + 4 * COUNTER[1 - rank]
    total, valid, done = 0.0, True, 0
    while done < args.iters:
        n = min(args.batch, args.iters - done)
        barrier.wait()
        if rank == 0:
            host[GATE] = 0
        barrier.wait()
        # If a full queue blocks this thread before the gate opens, open it anyway (invalid).
        fired = []

        def open_gate():
            fired.append(True)
            host[GATE] = 0xFFFFFFFF

        watchdog = threading.Timer(10.0, open_gate)
        watchdog.start()
        driver.check(driver.wait(handle, gate, done + 1, CU_STREAM_WAIT_VALUE_GEQ), "wait (gate)")
        for i in range(done + 1, done + n + 1):
            if rank == 1:  # rank 1 answers: it waits for rank 0's i first
                driver.check(driver.wait(handle, theirs, i, CU_STREAM_WAIT_VALUE_GEQ), "wait")
            x.add_(1.0)
            driver.check(driver.write(handle, mine, i, 0), "write")
            if rank == 0:  # rank 0 waits for the answer before its next iteration
                driver.check(driver.wait(handle, theirs, i, CU_STREAM_WAIT_VALUE_GEQ), "wait")
        barrier.wait()  # both queued: open the gate
        start = time.perf_counter()
        if rank == 0:
            host[GATE] = done + 1
        stream.synchronize()
        total += time.perf_counter() - start
        watchdog.cancel()
        valid = valid and not fired
        done += n
    return total / (2 * args.iters) * 1e6, valid


def rank_main(rank, args, page_path, barrier, queue, results):
    torch.cuda.set_device(0)
    torch.cuda.set_stream(torch.cuda.Stream())  # one stream of our own for every mode
    shared = map_page(page_path)
    host = memoryview(shared).cast("I")
    x = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    driver = Driver()
    page = driver.host_counters(shared)
    out = {}
    for mode in args.modes:
        barrier.wait()
        if mode in ("sync-alone", "sync-both"):
            if rank == 1 and mode == "sync-alone":
                barrier.wait()
                continue
            start = time.perf_counter()
            for _ in range(args.iters):
                x.add_(1.0)
                torch.cuda.synchronize()
            out[mode] = (time.perf_counter() - start) / args.iters * 1e6
            if mode == "sync-alone":
                barrier.wait()
        elif mode == "host-pingpong":
            host[COUNTER[0]] = host[COUNTER[1]] = 0
            barrier.wait()
            start = time.perf_counter()
            for i in range(1, args.iters + 1):
                if rank == 1:
                    while host[COUNTER[0]] < i:
                        pass
                x.add_(1.0)
                torch.cuda.synchronize()
                host[COUNTER[rank]] = i
                if rank == 0:
                    while host[COUNTER[1]] < i:
                        pass
            out[mode] = (time.perf_counter() - start) / (2 * args.iters) * 1e6
        else:
            device = mode == "stream-pingpong-device"
            counters = None
            keep = None
            if device:  # rank 0's device memory, opened by rank 1 through CUDA IPC
                if rank == 0:
                    keep = torch.zeros(64, dtype=torch.int32, device="cuda")
                    queue.put(keep)
                else:
                    keep = queue.get()
                counters = keep.data_ptr()
            host[COUNTER[0]] = host[COUNTER[1]] = 0
            if keep is not None:
                keep.zero_()
                torch.cuda.synchronize()
            us, valid = stream_pingpong(rank, args, host, page, counters, barrier, driver, x)
            final = keep[[COUNTER[0], COUNTER[1]]].tolist() if device else \
                [host[COUNTER[0]], host[COUNTER[1]]]
            out[mode] = us
            out[mode + "/valid"] = valid and final == [args.iters, args.iters]
            out[mode + "/final_counters"] = final
            barrier.wait()  # rank 1 is done with rank 0's memory
    results.put((rank, out))


def mps_running():
    try:
        r = subprocess.run(["pgrep", "-f", "nvidia-cuda-mps"], capture_output=True, timeout=10)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--batch", type=int, default=200, help="ping-pong iterations queued per gate")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_handoff: no CUDA device here; nothing measured")
        return 0
    fd, page_path = tempfile.mkstemp(prefix="gpu_handoff_", dir="/dev/shm")
    os.write(fd, bytes(PAGE))
    os.close(fd)
    try:
        ctx = mp.get_context("spawn")
        barrier, queue, results = ctx.Barrier(2, timeout=args.timeout), ctx.Queue(), ctx.Queue()
        # Daemons: a rank stuck in the driver must not keep this process from exiting.
        procs = [ctx.Process(target=rank_main, args=(r, args, page_path, barrier, queue, results),
                             daemon=True) for r in range(2)]
        for proc in procs:
            proc.start()
        got = dict(results.get(timeout=args.timeout) for _ in procs)
        for proc in procs:
            proc.join(30)
    finally:
        os.unlink(page_path)
    summary = {"gpu": torch.cuda.get_device_name(0), "mps": mps_running(), "iters": args.iters,
               "rank0_us": got[0], "rank1_us": got[1]}
    for mode in args.modes:
        print(f"{mode:<24} rank 0 {got[0].get(mode, float('nan')):9.2f} us   "
              f"rank 1 {got[1].get(mode, float('nan')):9.2f} us"
              + ("" if got[0].get(mode + "/valid", True) else "   INVALID"), flush=True)
    if args.json:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "results": summary})
    bad = [m for m in args.modes if not got[0].get(m + "/valid", True)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
