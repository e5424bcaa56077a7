#!/usr/bin/env python3
"""Measure the ceilings that busbw is stated against.

    python benchmarks/memcpy_ceiling.py --json ceiling.json

  memcpy_64MiB          one core, torch copy_ of 64 MiB (DRAM-bound): median GB/s
  memcpy_4MiB           same, 4 MiB (fits in L3)
  memcpy_64MiB_2procs   two processes copying 64 MiB at once (each on its own core): per-process
                        and summed GB/s. The sum x 2 is the DRAM traffic (read + write) the
                        machine sustains with both cores busy; an N=2 allreduce must read both
                        inputs and write both outputs once (>= 4 buffer-sizes of traffic), so
                        its busbw cannot exceed (summed GB/s x 2) / 4
  tcp_loopback_1stream  one TCP stream over 127.0.0.1, python sendall/recv_into
  tcp_loopback_2streams two streams at once, each stream's rate (what a ring step with
                        send and receive in flight together can expect)

GB/s means 1e9 bytes copied (or delivered) per second, as busbw. The tcp-send / tcp-recv
subcommands are the building blocks; netns_hosts.sh `verify` runs them in two network
namespaces to check an emulated link.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

kChunk = 4 << 20  # bytes per send/recv call: large, so python overhead per call is negligible


def memcpy_gbps(nbytes, repeats, budget_s):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)  # single-core ceiling: the backend copies on one thread per rank
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    for _ in range(3):
        dst.copy_(src)  # fault in pages and warm caches
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (len(times) < 5 or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"GBps": nbytes / med / 1e9, "bytes": nbytes, "repeats": len(times),
            "best_GBps": nbytes / min(times) / 1e9}


def tcp_recv(bind, port, timeout_s):
    """Accept one connection, read to EOF; print one JSON line with the delivered rate."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(1)
    srv.settimeout(timeout_s)
    print(json.dumps({"listening": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    conn.settimeout(timeout_s)
    buf = bytearray(kChunk)
    view = memoryview(buf)
    total = 0
    first = None
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        if first is None:
            first = time.perf_counter()  # start at the first byte: excludes connect time
        total += n
    secs = time.perf_counter() - first if first else 0.0
    conn.close()
    srv.close()
    gbps = total / secs / 1e9 if secs > 0 else 0.0
    print(json.dumps({"bytes": total, "seconds": secs, "GBps": gbps, "Gbitps": gbps * 8}),
          flush=True)


def tcp_send(to, port, seconds, timeout_s):
    """Connect (retrying until timeout) and send for `seconds`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((to, port), timeout=timeout_s)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    data = bytes(kChunk)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    sock.close()


def memcpy_parallel(procs, nbytes, repeats, budget_s):
    """`procs` processes copy for the same `budget_s` seconds (repeats large, so the time
    budget ends both); per-process and summed GB/s."""
    me = [sys.executable, os.path.abspath(__file__), "memcpy", "--bytes", str(nbytes),
          "--repeats", str(repeats), "--budget", str(budget_s)]
    runs = [subprocess.Popen(me, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    rates = [json.loads(r.communicate(timeout=budget_s + 60)[0].strip().splitlines()[-1])["GBps"]
             for r in runs]
    return {"GBps": sum(rates), "per_process_GBps": rates, "bytes": nbytes,
            "allreduce_n2_busbw_bound_GBps": sum(rates) * 2 / 4}


def tcp_loopback(streams, seconds):
    """Run `streams` receiver/sender process pairs on 127.0.0.1; per-stream GB/s."""
    me = [sys.executable, os.path.abspath(__file__)]
    limit = seconds + 30
    recvs, sends = [], []
    try:
        for _ in range(streams):
            r = subprocess.Popen(me + ["tcp-recv", "--bind", "127.0.0.1", "--port", "0",
                                       "--timeout", str(limit)], stdout=subprocess.PIPE, text=True)
            recvs.append(r)
            port = json.loads(r.stdout.readline())["listening"]
            sends.append(subprocess.Popen(me + ["tcp-send", "--to", "127.0.0.1", "--port",
                                                str(port), "--seconds", str(seconds),
                                                "--timeout", str(limit)]))
        rates = []
        for r, s in zip(recvs, sends):
            out, _ = r.communicate(timeout=limit)
            s.wait(timeout=limit)
            rates.append(json.loads(out.strip().splitlines()[-1])["GBps"])
    finally:
        for proc in recvs + sends:
            if proc.poll() is None:
                proc.kill()
    return {"GBps": statistics.fmean(rates), "per_stream_GBps": rates,
            "aggregate_GBps": sum(rates), "seconds": seconds}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("tcp-recv", help="receive one stream, print delivered rate")
    r.add_argument("--bind", default="127.0.0.1")
    r.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    r.add_argument("--timeout", type=float, default=30)
    s = sub.add_parser("tcp-send", help="send one stream for --seconds")
    s.add_argument("--to", default="127.0.0.1")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, default=2.0)
    s.add_argument("--timeout", type=float, default=30)
    m = sub.add_parser("memcpy", help="one process: memcpy GB/s as JSON (memcpy_64MiB_2procs)")
    m.add_argument("--bytes", type=int, default=64 << 20)
    m.add_argument("--repeats", type=int, default=30)
    m.add_argument("--budget", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=30, help="memcpy repeats (median taken)")
    p.add_argument("--seconds", type=float, default=2.0, help="TCP: seconds per stream")
    p.add_argument("--json", help="write the ceilings here")
    args = p.parse_args()

    if args.cmd == "tcp-recv":
        return tcp_recv(args.bind, args.port, args.timeout)
    if args.cmd == "tcp-send":
        return tcp_send(args.to, args.port, args.seconds, args.timeout)
    if args.cmd == "memcpy":
        return print(json.dumps(memcpy_gbps(args.bytes, args.repeats, args.budget)))

    c = {}
    c["memcpy_64MiB"] = dict(memcpy_gbps(64 << 20, args.repeats, 5.0),
                             what="memcpy 64 MiB, 1 core")
    c["memcpy_4MiB"] = dict(memcpy_gbps(4 << 20, args.repeats * 10, 2.0),
                            what="memcpy 4 MiB (L3), 1 core")
    c["memcpy_64MiB_2procs"] = dict(memcpy_parallel(2, 64 << 20, 1 << 30, 5.0),
                                    what="memcpy 64 MiB, 2 processes at once (summed)")
    c["tcp_loopback_1stream"] = dict(tcp_loopback(1, args.seconds), what="TCP loopback, 1 stream")
    c["tcp_loopback_2streams"] = dict(tcp_loopback(2, args.seconds),
                                      what="TCP loopback, 2 streams at once (per stream)")
    for key, v in c.items():
        print(f"{key:<24} {v['GBps']:7.2f} GB/s   {v['what']}")
    if args.json:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_common import machine_info, write_json  # same records as the sweeps
        write_json(args.json, {"machine": machine_info(), "ceilings": c})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
