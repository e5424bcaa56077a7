"""Rank 0 of a 2-rank group whose rank 1 is the fuzzer in tests/test_wire_fuzzing.py.

Runs under the AddressSanitizer build. For each case it joins a fresh group (a
store prefix per case), issues receives and collectives that read what the fake
rank 1 sends, and records the error each raises. A memory error aborts the
process with an ASan report, which the test turns into a failure.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    host, port, cases = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = dist.TCPStore(host, port, 2, is_master=False, timeout=datetime.timedelta(seconds=60))
    for case in range(cases):
        prefixed = dist.PrefixStore(f"case{case}", store)
        outcome = "ok"
        try:
            dist.init_process_group("ringdist", rank=0, world_size=2, store=prefixed,
                                    timeout=datetime.timedelta(seconds=3))
        except Exception as exc:  # noqa: BLE001 - a rejected handshake is a valid outcome
            print(f"CASE {case} init error: {str(exc).splitlines()[0][:200]}", flush=True)
            store.add(f"case{case}/done", 1)
            continue
        works = []
        try:
            a, b = torch.empty(3, dtype=torch.float32), torch.empty(17, dtype=torch.int64)
            # Every third case receives from any source (peeks at the raw stream first).
            src = None if case % 3 == 0 else 1
            recvs = [lambda: dist.irecv(a, src, tag=7), lambda: dist.irecv(b, 1, tag=case % 5)]
            collectives = [lambda: dist.all_reduce(torch.ones(33), async_op=True),
                           lambda: dist.broadcast(torch.empty(9), src=1, async_op=True)]
            # Odd cases read collective headers first, even ones point-to-point headers.
            for issue in (collectives + recvs if case % 2 else recvs + collectives):
                works.append(issue())
            for w in works:
                w.wait()
        except Exception as exc:  # noqa: BLE001 - clean errors are the expected outcome
            outcome = str(exc).splitlines()[0][:200]
        print(f"CASE {case} {outcome}", flush=True)
        dist.destroy_process_group()
        store.add(f"case{case}/done", 1)
    print("ALL CASES DONE", flush=True)


if __name__ == "__main__":
    main()
