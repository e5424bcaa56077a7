"""Small allreduces on one host through the board (Communicator::publish, boardAllreduce in
csrc/collectives/allreduce.cc): each rank publishes its header and data in its own shared area
and reduces every rank's straight from the areas. Checked against the one-round path, which
buffers past the board take (elements are reduced in the same rank order whatever the buffer's
length, so a prefix's bits must equal a board allreduce of that prefix), with a peer that comes
late (the waiter sleeps and is woken), and with a root that runs ahead through broadcasts (an
area's entry is not overwritten while a peer may still read it)."""
import pytest

pytestmark = pytest.mark.quick

BOARD_BYTES = 4 << 10  # kBoardDataBytes
DTYPE_OPS = [("float32", "SUM"), ("float32", "AVG"), ("bfloat16", "SUM"), ("float16", "MAX"),
             ("float64", "PRODUCT"), ("int32", "BXOR"), ("int64", "MIN"), ("uint8", "SUM")]


def _values(rank, n, dtype):
    import torch

    g = torch.Generator().manual_seed(1009 * rank + n)
    x = torch.randn(n, generator=g) * 10
    if dtype.is_floating_point:
        return x.to(dtype)
    return x.round().to(torch.int64).to(dtype)


def _case_board(rank, ws):
    import time

    import torch
    import torch.distributed as dist
    import torch_ringdist

    out = {}
    # 1. A board allreduce of a prefix equals the same prefix of a one-round allreduce.
    for dtype_name, op_name in DTYPE_OPS:
        dtype = getattr(torch, dtype_name)
        op = getattr(dist.ReduceOp, op_name)
        limit = BOARD_BYTES // dtype.itemsize
        big = _values(rank, 2 * limit + 5, dtype)  # past the board: the one-round path
        for n in (1, 7, 1000, limit):
            small = big[:n].clone()
            dist.all_reduce(small, op=op)
            whole = big.clone()
            dist.all_reduce(whole, op=op)
            same = torch.equal(small.view(torch.uint8), whole[:n].contiguous().view(torch.uint8))
            out[f"{dtype_name} {op_name} n={n}"] = same
    # 2. A late peer: the others wait past their spin and sleep; the last one's publication
    #    wakes them, well before their sleep's 50 ms slice ends (CLOCK_MONOTONIC is the
    #    host's, so the ranks' clocks compare). Three times: a wake left to the slice would
    #    pass once by chance, hardly three times.
    late = ws - 1
    torch_ringdist.reset_stats()
    for attempt in range(3):
        if rank == late:
            time.sleep(0.12)
        x = torch.full((3,), float(rank + 1))
        arrived = time.monotonic()
        dist.all_reduce(x)
        returned = time.monotonic()
        when = torch.tensor([arrived if rank == late else 0.0], dtype=torch.float64)
        dist.all_reduce(when)  # the late rank's arrival, on every rank
        out[f"late peer sum {attempt}"] = x.tolist() == [ws * (ws + 1) / 2] * 3
        out[f"woken promptly {attempt}"] = (rank == late or returned - when.item() < 0.03,
                                            returned - when.item())
    # Each of those waits went to sleep (torch_ringdist.stats()'s "sleeps").
    sleeps = torch_ringdist.stats()["allreduce"]["sleeps"]
    out["slept while late"] = (rank == late or sleeps >= 3, sleeps)
    # 3. A root that runs ahead: broadcasts from rank 0 complete there without the others, so
    #    rank 0 may publish several operations ahead; every result must still be right.
    if rank != 0:
        time.sleep(0.1)
    for i in range(6):
        b = torch.full((5,), float(i) if rank == 0 else -1.0)
        dist.broadcast(b, src=0)
        y = torch.full((9,), float(rank + i))
        dist.all_reduce(y)
        out[f"run ahead {i}"] = b.tolist() == [float(i)] * 5 and y.tolist() == [
            float(sum(r + i for r in range(ws)))] * 9
    return out


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_board_allreduce(world_factory, ws):
    results = world_factory(ws).run(_case_board, timeout=240)
    for rank, out in enumerate(results):
        assert len(out) > 30, out  # every case ran
        failed = [(key, ok) for key, ok in out.items() if not (ok[0] if isinstance(ok, tuple) else ok)]
        assert not failed, f"rank {rank}: {failed}"
