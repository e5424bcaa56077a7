"""Flight recorder: 3 ranks record a few ops (checked live with torch_ringdist.trace()), then
rank 1 calls all_reduce with 7 elements where the others pass 8. Every rank dumps its trace to
RINGDIST_TRACE_DUMP=DIR/rank_. Usage: trace_desync.py DIR; each rank writes what it saw to
DIR/result<rank>.json (one file each: lines printed by 3 processes could interleave)."""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 3


def run(rank, port, outdir):
    os.environ["RINGDIST_TRACE_DUMP"] = os.path.join(outdir, "rank_")
    os.environ["RINGDIST_TRACE_BUFFER"] = "6"
    import torch_ringdist

    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    out = torch.empty(3 * 5)
    dist.all_gather_into_tensor(out, torch.ones(5))
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(2), src=0)
    dist.barrier()
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    live = torch_ringdist.trace()["entries"]
    result = {"rank": rank, "live": [{k: e[k] for k in ("profiling_name", "collective_seq_id",
                                                        "p2p_seq_id", "input_sizes", "output_sizes",
                                                        "state", "is_p2p")} for e in live]}
    try:
        dist.all_reduce(torch.ones(7 if rank == 1 else 8))
        result["error"] = None
    except Exception as e:  # noqa: BLE001 (reported)
        result["error"] = str(e).splitlines()[0][:300]
    with open(os.path.join(outdir, f"result{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)


if __name__ == "__main__":
    store = dist.TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run, args=(r, store.port, sys.argv[1])) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        if p.is_alive():
            p.kill()
