"""The same-GPU collectives' protocol run on the CPU (csrc/backend/testing_same_gpu.cc): the
stream-ordered signals, the leader's one fused pass over every rank's memory, the registration
cache, the scratch fallback, the set-up's verdict and the deadline watch are the code that
drives a GPU; host threads stand in for streams and shared-memory arenas for IPC-mapped
allocations. Results are compared bit for bit with dist.all_reduce, reduce_scatter_tensor,
all_gather_into_tensor, broadcast, reduce and all_to_all_single on the same inputs; point-to-point
messages with what their senders sent."""
import contextlib

import pytest

pytestmark = [pytest.mark.quick, pytest.mark.cuda]

WORLD_SIZES = [2, 3, 4]
# One round and ring combine orders (the thresholds are 64 KiB / 16 KiB by default), one
# element per rank, fewer elements than ranks, and none.
COUNTS = [0, 1, 3, 1024, 16384 + 3, (1 << 18) + 5]
OPS = [("float32", "sum"), ("float64", "avg"), ("bfloat16", "sum"), ("float16", "max"),
       ("int64", "product"), ("int32", "bxor"), ("bool", "sum")]


def _inputs(rank, n, dtype_name, seed):
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(1000 * rank + 17 * n + seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.3
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-3, 4, (n,), generator=g, dtype=dtype)


def _reference(x, op):
    import torch.distributed as dist

    out = x.clone()
    dist.all_reduce(out, op=getattr(dist.ReduceOp, op.upper()))
    return out


def _run(name, x, op="sum", **kwargs):
    """all_reduce of x in place through the protocol."""
    from torch_ringdist._C import testing

    return testing.same_gpu_host_run(name, "all_reduce", x, x, op, **kwargs)


@contextlib.contextmanager
def _fresh_group():
    """A new ringdist group's name; its same-GPU test state is dropped afterwards."""
    import torch.distributed as dist
    from torch_ringdist._C import testing

    name = dist.new_group(backend="ringdist").group_name
    try:
        yield name
    finally:
        testing.same_gpu_host_reset(name)


def _placement(rank, split):
    """The hook's arguments for the ranks' GPUs: one GPU (a leader runs everything), or two
    GPUs that reach each other (split: every rank runs its share)."""
    return {"device": rank % 2, "peer_access": True} if split else {}


def _case_bits(rank, ws, split=False):
    import torch

    with _fresh_group() as name:
        # Sizes this rank's arena (its one allocation) for the largest case.
        where = _placement(rank, split)
        _run(name, torch.zeros(max(COUNTS) + 64, dtype=torch.float64), **where)
        for i, n in enumerate(COUNTS):
            for dtype_name, op in OPS:
                x = _inputs(rank, n, dtype_name, 0)
                expected = _reference(x, op)
                # Tensors at different offsets of the lent allocation, as the caching allocator
                # hands them out: 16-byte aligned (the kernel's vector loads) or only 8.
                info = _run(name, x, op, offset=64 * i + 8 * (i % 2 + 1), **where)
                assert info["fused"] == 1, info
                assert torch.equal(x.view(torch.uint8), expected.view(torch.uint8)), (n, dtype_name, op)
        seq = info["seq"]
        assert seq == 1 + len(COUNTS) * len(OPS), info
        # One arena per rank: the leader (split: every rank) opened each peer's once.
        assert info["opens"] == (ws - 1 if rank == 0 or split else 0), info
    return True


def _case_cache(rank, ws):
    import torch

    with _fresh_group() as name:
        renewals = 70  # past the leader's 64 kept mappings
        for k in range(renewals):
            x = torch.full((1000,), float(rank + k))
            # Rank 1 lends from a fresh allocation every call (a segment freed and replaced).
            info = _run(name, x, renew=rank == 1)
            assert info["fused"] == 1
            assert torch.equal(x, torch.full((1000,), float(ws * k + ws * (ws - 1) // 2))), k
        if rank == 0:
            assert info["opens"] == renewals + (ws - 2), info
            assert info["cached"] <= 64 + 1, info  # closed all but the kept ones
        else:
            assert info["opens"] == 0 and info["cached"] == 0, info
    return True


def _case_fallbacks(rank, ws):
    import torch

    with _fresh_group() as name:
        x = _inputs(rank, 5000, "float32", 1)
        expected = _reference(x, "sum")
        # Rank 1's tensor cannot be lent (as memory from expandable segments): it goes through
        # rank 1's scratch, copied in and out on its stream; the call stays fused.
        info = _run(name, x, lend=rank != 1)
        assert info["fused"] == 1 and torch.equal(x, expected), info
        opens = info["opens"]
        x = _inputs(rank, 5000, "float32", 2)
        expected = _reference(x, "sum")
        info = _run(name, x, lend=rank != 1)
        assert info["fused"] == 1 and torch.equal(x, expected), info
        assert info["opens"] == opens, info  # the scratch stays mapped
    # Ranks on different GPUs: decided at set-up, then every call is staged.
    with _fresh_group() as name:
        for seed in range(3):
            x = _inputs(rank, 300, "float64", seed)
            expected = _reference(x, "avg")
            info = _run(name, x, "avg", device=rank % 2)
            assert info["fused"] == 0 and info["seq"] == 0, info
            assert torch.equal(x, expected)
    return True


def _refused(name):
    """The error of the next call on an aborted group (which must not run)."""
    import torch

    try:
        _run(name, torch.ones(256))
    except RuntimeError as e:
        return str(e)
    raise AssertionError("an aborted group ran another operation")


def _case_stalled_rank(rank, ws):
    import time

    import torch

    with _fresh_group() as name:
        x = torch.ones(4096)
        assert _run(name, x)["fused"] == 1
        # Rank 1's stream never signals: the leader's stream would wait forever. The watch fails
        # the group at the deadline and releases every stream (the call returns, not hangs).
        start = time.monotonic()
        info = _run(name, torch.ones(4096), stall=rank == 1, timeout_ms=1500)
        took = time.monotonic() - start
        assert info["fused"] == 1 and 1.0 < took < 15, (info, took)
        message = _refused(name)
        # Whichever rank's watch fired first is named on every rank.
        assert "GPU hand-offs of this group were aborted (rank " in message, message
        assert "found GPU operation #2 unfinished at its deadline" in message, message
    return True


def _case_other_collectives(rank, ws, split=False):
    """reduce_scatter_tensor, all_gather_into_tensor, broadcast and reduce, lent or through
    scratch, against the same collectives of the engine."""
    import torch
    import torch.distributed as dist
    from torch_ringdist._C import testing

    where = _placement(rank, split)
    with _fresh_group() as name:
        for i, n in enumerate([0, 1, 5, 1000, 70001]):
            for lend in (True, False):
                offset = 64 * i + 8 * (i % 2 + 1)
                for dtype_name, op in [("float32", "sum"), ("bfloat16", "avg"), ("int64", "max")]:
                    x = _inputs(rank, n * ws, dtype_name, i)
                    expected = torch.empty(n, dtype=x.dtype)
                    dist.reduce_scatter_tensor(expected, x, op=getattr(dist.ReduceOp, op.upper()))
                    out = torch.full_like(expected, 7)
                    info = testing.same_gpu_host_run(name, "reduce_scatter", x, out, op,
                                                     offset=offset, lend=lend, **where)
                    assert info["fused"] == 1
                    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), (n, dtype_name, op, lend)
                x = _inputs(rank, n, "float16", i)
                expected = torch.empty(n * ws, dtype=x.dtype)
                dist.all_gather_into_tensor(expected, x)
                out = torch.zeros_like(expected)
                testing.same_gpu_host_run(name, "all_gather", x, out, offset=offset, lend=lend,
                                          **where)
                assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), (n, lend)
                for root in range(ws):
                    x = _inputs(rank, n, "int32", i + root)
                    expected = x.clone()
                    dist.broadcast(expected, src=root)
                    testing.same_gpu_host_run(name, "broadcast", x, x, root=root, offset=offset,
                                              lend=lend, **where)
                    assert torch.equal(x, expected), (n, root, lend)
                    for dtype_name, op in [("float32", "sum"), ("bfloat16", "avg")]:
                        x = _inputs(rank, n, dtype_name, i + root)
                        expected = x.clone()
                        dist.reduce(expected, dst=root, op=getattr(dist.ReduceOp, op.upper()))
                        testing.same_gpu_host_run(name, "reduce", x, x, op, root=root,
                                                  offset=offset, lend=lend, **where)
                        # The root's result; the others' tensors as the engine leaves them.
                        assert torch.equal(x.view(torch.uint8), expected.view(torch.uint8)), (n, root, op)
    return True


def _case_alltoall(rank, ws, split=False):
    """all_to_all_single with uneven splits (some empty), lent or through scratch, in place,
    against the engine's; a pair of ranks that disagree on a count fails on every rank alike,
    before anything is queued."""
    import torch
    import torch.distributed as dist
    from torch_ringdist._C import testing

    where = _placement(rank, split)
    with _fresh_group() as name:
        for i, scale in enumerate([0, 1, 7, 5000]):
            # Rank s sends rank r ((s + r) % 3) * scale + r elements.
            sends = [((rank + r) % 3) * scale + r * (scale > 0) for r in range(ws)]
            receipts = [((s + rank) % 3) * scale + rank * (scale > 0) for s in range(ws)]
            for lend in (True, False):
                for dtype_name in ("float32", "bfloat16", "int64"):
                    x = _inputs(rank, sum(sends), dtype_name, i)
                    expected = torch.empty(sum(receipts), dtype=x.dtype)
                    dist.all_to_all_single(expected, x, receipts, sends)
                    out = torch.full_like(expected, 3)
                    info = testing.same_gpu_host_run(name, "all_to_all", x, out, lend=lend,
                                                     offset=8 * (i % 2 + 1), sends=sends,
                                                     receipts=receipts, **where)
                    assert info["fused"] == 1
                    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), (scale, lend, dtype_name)
        even = [6] * ws
        x = _inputs(rank, 6 * ws, "float32", 9)
        expected = torch.empty_like(x)
        dist.all_to_all_single(expected, x)
        testing.same_gpu_host_run(name, "all_to_all", x, x, sends=even, receipts=even, **where)
        assert torch.equal(x, expected)
        receipts = [2] * ws
        if rank == ws - 1:
            receipts[0] = 3
        message = f"rank 0 sends 2 elements to rank {ws - 1}, which expects 3"
        with pytest.raises(RuntimeError, match=message):
            testing.same_gpu_host_run(name, "all_to_all", torch.ones(2 * ws),
                                      torch.zeros(sum(receipts)), sends=[2] * ws,
                                      receipts=receipts, **where)
        # A failed collective aborts the group (torch's convention); later calls name why.
        with pytest.raises(RuntimeError, match=f"aborted by an earlier error: .*{message}"):
            testing.same_gpu_host_run(name, "all_to_all", torch.ones(2 * ws),
                                      torch.zeros(2 * ws), sends=[2] * ws, receipts=[2] * ws,
                                      **where)
    return True


def _case_unmappable_memory(rank, ws):
    """The leader cannot map rank 1's memory after the records were exchanged: its call fails,
    the others' streams (already waiting) are released at once, and every later call on the
    group names the cause."""
    import torch

    with _fresh_group() as name:
        assert _run(name, torch.ones(256))["fused"] == 1
        try:
            _run(name, torch.ones(256), renew=True, vanish=rank == 1, timeout_ms=20000)
            first = None
        except RuntimeError as e:
            first = str(e)
        assert (first is not None) == (rank == 0), first  # only the leader maps
        later = _refused(name)
    cause = "rank 0 could not map another rank's memory for GPU operation #2"
    assert cause in later or rank == 0, later
    return True


MESSAGE_DTYPES = ["float32", "bfloat16", "int64", "int8"]


def _payload(sender, receiver, tag, n):
    return _inputs(sender, n, MESSAGE_DTYPES[tag % len(MESSAGE_DTYPES)], 100 * receiver + tag)


def _messages(name, sends, receives, **kwargs):
    """sends: [(peer, tag, tensor)]; receives: [(source or -1, tag, out)]; the hook's info."""
    from torch_ringdist._C import testing

    return testing.same_gpu_host_messages(
        name, [t for _, _, t in sends], [p for p, _, _ in sends], [g for _, g, _ in sends],
        [t for _, _, t in receives], [s for s, _, _ in receives], [g for _, g, _ in receives],
        **kwargs)


def _unaligned(like):
    """An output of like's shape and dtype one element past an allocation's start."""
    import torch

    return torch.full((like.numel() + 1,), 3, dtype=like.dtype)[1:]


def _case_messages(rank, ws, split=False):
    """Every rank sends every other rank messages of several sizes and dtypes; receivers take
    them in reverse tag order, by source or from any source, into unaligned outputs. The data
    lands late on the senders' streams; no receiver reads it early, no sender is done before
    its receiver took the data, and every byte arrives."""
    import torch

    where = {"device": rank % 2, "peer_access": True} if split else {}
    sizes = [0, 1, 7, 1000, 70001]
    with _fresh_group() as name:
        peers = [r for r in range(ws) if r != rank]
        sends = [(p, tag, _payload(rank, p, tag, n))
                 for p in peers for tag, n in enumerate(sizes)]
        receives, expected = [], []
        for s in peers:
            for tag in reversed(range(len(sizes))):
                want = _payload(s, rank, tag, sizes[tag])
                # Half of them from any source: the lowest rank with that tag left.
                receives.append((-1 if (s + tag) % 2 else s, tag, _unaligned(want)))
                expected.append(want)
        # Any-source receives take the lowest sender first: order them as the hook matches.
        info = _messages(name, sends, receives, **where)
        assert info["waiting_senders"] == len(peers), info
        for (source, tag, got), want in zip(receives, expected):
            assert source == -1 or torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (source, tag)
        # Any-source: compare as multisets per tag (each peer's payload arrives exactly once).
        for tag in range(len(sizes)):
            got = sorted(bytes(t.view(torch.uint8).tolist()) for s, g, t in receives if g == tag)
            want = sorted(bytes(_payload(s, rank, tag, sizes[tag]).view(torch.uint8).tolist())
                          for s in peers)
            assert got == want, tag
        # One allocation per sender, mapped once by each receiver.
        assert info["message_opens"] == len(peers), info
        # More messages to one peer than it has slots, taken in order: the later ones wait on
        # their sender's stream for the earlier to be taken.
        many = 40
        if rank == 0:
            info = _messages(name, [(1, t, _payload(0, 1, t, 100 + t)) for t in range(many)], [],
                             **where)
            assert info["waiting_senders"] == 1, info
        elif rank == 1:
            outs = [torch.zeros(100 + t, dtype=_payload(0, 1, t, 1).dtype) for t in range(many)]
            _messages(name, [], [(0, t, o) for t, o in enumerate(outs)], **where)
            for t, o in enumerate(outs):
                assert torch.equal(o.view(torch.uint8), _payload(0, 1, t, 100 + t).view(torch.uint8)), t
        else:
            _messages(name, [], [], **where)
    return True


def _refused_message(name, ws):
    """The error of the next message on an aborted group (which must not be sent)."""
    import torch
    import torch.distributed as dist

    try:
        _messages(name, [((dist.get_rank() + 1) % ws, 0, torch.ones(8))], [])
    except RuntimeError as e:
        return str(e)
    raise AssertionError("an aborted group sent another message")


def _case_message_failures(rank, ws):
    """A send nobody receives fails the group at its deadline instead of hanging its stream;
    a receive of another size fails and releases the sender at once. Every later call names
    the cause."""
    import time

    import torch
    import torch.distributed as dist

    with _fresh_group() as name:
        start = time.monotonic()
        sends = [(1, 5, torch.ones(64))] if rank == 0 else []
        info = _messages(name, sends, [], timeout_ms=1500)
        took = time.monotonic() - start
        assert 1.0 < took < 15 or rank != 0, (info, took)
        dist.barrier()  # every rank past the abort
        message = _refused_message(name, ws)
        assert "GPU message #1 (send or receive) unfinished at its deadline" in message, message
    with _fresh_group() as name:
        sends = [(1, 0, torch.ones(64))] if rank == 0 else []
        receives = [(0, 0, torch.zeros(65))] if rank == 1 else []
        try:
            _messages(name, sends, receives, timeout_ms=20000)
            first = None
        except RuntimeError as e:
            first = str(e)
        mismatch = "rank 1 expects 260 bytes of float32 from rank 0, which sent 256 bytes"
        if rank == 1:
            assert mismatch in first, first
        else:
            assert first is None, first
            # Named by the aborted hand-offs, or by the group's first error when this rank's
            # call met rank 1's closed links first.
            later = _refused_message(name, ws)
            assert "rank 1 received GPU message #1 with another size or type" in later or (
                mismatch in later), later
    return True


def _case_device_message_matching(rank, ws):
    """A device message (the record a same-GPU send passes through the host) is matched by tag
    and source like any message: by a receive already waiting, arriving before its receive, from
    any source, and mixed with bytes on the same tag; a receive that cannot take one, or expects
    another size, fails naming both ranks."""
    import time

    import torch
    import torch.distributed as dist
    from torch_ringdist._C import testing

    def send(name, tag, index, nbytes=256):
        testing.p2p_device_message(name, True, 1, tag, nbytes, index)

    def recv(name, peer, tag, nbytes=256, takes_device=True):
        return testing.p2p_device_message(name, False, peer, tag, nbytes,
                                          takes_device=takes_device)

    out = []
    with _fresh_group() as name:
        if rank == 0:
            time.sleep(0.2)  # rank 1's receive waits first
            send(name, 1, 7)
            send(name, 2, 8)
            send(name, 3, 9)
            send(name, 4, 10)
            group = dist.distributed_c10d._resolve_process_group(name)
            dist.send(torch.full((64,), 1.0), 1, group=group, tag=5)
            send(name, 5, 11)
        elif rank == 1:
            out.append(recv(name, 0, 1))
            time.sleep(0.2)  # tags 2 and 3 arrive before their receives
            out.append(recv(name, 0, 2))
            out.append(recv(name, 0, 3))
            out.append(recv(name, -1, 4))
            out.append(recv(name, 0, 5))  # bytes, then a device message, on one tag
            out.append(recv(name, 0, 5))
        dist.barrier()
    if rank == 1:
        device = [(g["device"], g.get("index"), g["source"]) for g in out]
        assert device == [(1, 7, 0), (1, 8, 0), (1, 9, 0), (1, 10, 0), (0, None, 0), (1, 11, 0)], out
        # 64 float32 ones: bytes 0, 0, 0x80, 0x3f each.
        assert out[4]["byte_sum"] == 64 * (0x80 + 0x3F), out[4]
    errors = {}
    for case, (tag, nbytes, takes_device) in {"host": (6, 256, False), "size": (7, 260, True)}.items():
        with _fresh_group() as name:
            if rank == 0:
                send(name, tag, 1)
            elif rank == 1:
                with pytest.raises(RuntimeError) as caught:
                    recv(name, 0, tag, nbytes, takes_device)
                errors[case] = str(caught.value)
            dist.barrier()
    if rank == 1:
        assert "rank 1 receives into host memory from rank 0 (tag 6), which sent GPU memory" in \
            errors["host"], errors
        assert "expects 260 bytes of float32 from rank 0 with tag 7 but rank 0 sent 256 bytes" in \
            errors["size"], errors
    return True


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_same_bits_as_the_host_path(world_factory, ws):
    assert world_factory(ws).run(_case_bits) == [True] * ws


@pytest.mark.parametrize("ws", [2, 4])
def test_split_over_two_gpus_same_bits(world_factory, ws):
    """Ranks on two GPUs that reach each other: every rank runs its share of each collective."""
    world = world_factory(ws)
    assert world.run(_case_bits, True) == [True] * ws
    assert world.run(_case_other_collectives, True, timeout=120) == [True] * ws
    assert world.run(_case_alltoall, True) == [True] * ws


@pytest.mark.parametrize("ws", [2, 4])
def test_reduce_scatter_all_gather_broadcast_reduce_alltoall(world_factory, ws):
    world = world_factory(ws)
    assert world.run(_case_other_collectives, timeout=120) == [True] * ws
    assert world.run(_case_alltoall) == [True] * ws


@pytest.mark.parametrize("ws", [2, 3])
def test_cache_and_fallbacks(world_factory, ws):
    world = world_factory(ws)
    assert world.run(_case_cache) == [True] * ws
    assert world.run(_case_fallbacks) == [True] * ws


@pytest.mark.parametrize("ws", [2, 3])
def test_messages(world_factory, ws):
    world = world_factory(ws)
    assert world.run(_case_messages) == [True] * ws
    assert world.run(_case_messages, True) == [True] * ws  # split over two GPUs
    assert world.run(_case_message_failures, timeout=120) == [True] * ws


def test_device_messages_match_like_bytes(world_factory):
    assert world_factory(2).run(_case_device_message_matching, timeout=120) == [True] * 2


def test_a_stalled_rank_fails_the_group_instead_of_hanging(world_factory):
    assert world_factory(3).run(_case_stalled_rank, timeout=120) == [True] * 3


def test_unmappable_memory_fails_the_call_and_releases_the_others(world_factory):
    assert world_factory(3).run(_case_unmappable_memory, timeout=120) == [True] * 3
