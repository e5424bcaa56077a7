"""The pipelined staging of CUDA tensors across hosts, proven on the CPU: the engine's allreduce,
allgather and reduce-scatter through a StageGate (csrc/collectives/collectives.h) whose input is
filled while the ring runs, in the pieces the CUDA twins use (csrc/collectives/stage_pieces.h),
and whose results are taken in runs as the ring says ranges are final
(csrc/backend/testing_gated.cc). The engine's buffers start as 0xFF bytes, so a ring that read a
range before asking for it, a piece that did not hold what was asked, or a range called final
before it was, would give other bits than torch.distributed's own call, which every case compares
against."""
import pytest

pytestmark = pytest.mark.cuda

# One round (whole buffer), the ring with few and with many segments; none; fewer than ranks.
COUNTS = [0, 1, 3, 1000, 70001, (1 << 18) + 5]
OPS = [("float32", "sum"), ("bfloat16", "avg"), ("int64", "max"), ("float64", "avg")]
# Single copy off: the flat ring on one host, as between hosts. "4K": many segments.
# "hosts": two emulated hosts of two ranks, the two-level allreduce.
WORLDS = [(2, {"RINGDIST_SINGLE_COPY": "0"}),
          (3, {"RINGDIST_SINGLE_COPY": "0", "RINGDIST_SEGMENT_BYTES": "4K"}),
          (4, {"RINGDIST_SINGLE_COPY": "0", "RINGDIST_TRANSPORT": "tcp"}),
          (4, {"RINGDIST_HOST_ID": "h0,h0,h1,h1", "RINGDIST_SEGMENT_BYTES": "16K"}),
          (2, {})]


def _expected(collective, x, op):
    import torch
    import torch.distributed as dist

    ws = dist.get_world_size()
    if collective == "allreduce":
        out = x.clone()
        dist.all_reduce(out, op=getattr(dist.ReduceOp, op.upper()))
    elif collective == "all_gather":
        out = torch.empty(x.numel() * ws, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x)
    else:
        out = torch.empty(x.numel() // ws, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x, op=getattr(dist.ReduceOp, op.upper()))
    return out


def _case_gated(rank, ws, env, ring, two_level=False):
    import torch
    import torch.distributed as dist
    from torch_ringdist._C import testing

    name = dist.group.WORLD.group_name
    single_copy = not ring  # the one-host world: single copy from 32 KiB (options.h)
    for collective in ["allreduce", "all_gather", "reduce_scatter"]:
        for n in COUNTS:
            for dtype_name, op in OPS:
                dtype = getattr(torch, dtype_name)
                g = torch.Generator().manual_seed(31 * rank + n)
                # reduce_scatter: n elements per rank out, so n * ws in.
                x = (torch.randn(n * (ws if collective == "reduce_scatter" else 1),
                                 generator=g) * 100).to(dtype)
                expected = _expected(collective, x, op)
                got = torch.full_like(expected, 7)
                # A slow copy for the largest case: results must come out before the input is in.
                # The ranks enter together (the barrier), 30 ms a 64 KiB piece (0.5 s per MiB);
                # a rank that a loaded machine (4 ranks on 2 cores, load 9) schedules late may
                # still find the input in, so the case is tried up to 3 times until every rank
                # saw a result early: an engine that does not pipeline fails all three.
                delay = 30000 if n == COUNTS[-1] and op == "sum" else 0
                for _ in range(3 if delay else 1):
                    if delay:
                        dist.barrier()
                    got.fill_(7)
                    # 16 KiB pieces (64 KiB slow ones): the 4 KiB segments of the ws3 world are
                    # grouped several a piece.
                    stats = testing.gated(name, collective, x, got, op,
                                          piece_bytes=(64 if delay else 16) << 10, delay_us=delay)
                    if not delay:
                        break
                    late = torch.tensor([float(stats["produced_early"] == 0)])
                    dist.all_reduce(late, op=dist.ReduceOp.MAX)  # one decision for every rank
                    if not late.item():
                        break
                key = (collective, n, dtype_name, op, stats)
                assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), key
                in_bytes = x.numel() * x.element_size()
                block = n * x.element_size()  # one rank's block (all_gather in, reduce_scatter out)
                assert stats["bytes_planned_once"] == in_bytes, key
                # all_gather never produces the rank's own block: the device copies it.
                produced = {"allreduce": in_bytes, "all_gather": (ws - 1) * block,
                            "reduce_scatter": block}[collective]
                assert stats["bytes_produced_once"] == produced, key
                assert stats["needs"] == stats["planned"], key
                assert stats["pieces"] <= stats["planned"], key  # a range is never cut
                assert stats["copies_back"] <= stats["produced"], key
                if collective == "allreduce":
                    # The one-round path up to 1 MiB for two ranks, 64 KiB for more (options.h).
                    whole = not ring or in_bytes <= (1 << 20 if ws == 2 else 64 << 10)
                else:
                    whole = single_copy and block >= (32 << 10)
                if whole:
                    assert stats["planned"] == (1 if in_bytes else 0), key  # the whole buffer
                    continue
                if block > (256 << 10):
                    assert stats["planned"] > 1, key  # segment by segment
                    if env.get("RINGDIST_SEGMENT_BYTES") == "4K":
                        assert stats["pieces"] < stats["planned"], key  # segments grouped
                # The flat rings finish their first segments while later ones are still
                # coming in; the two-level allreduce reads all of them in the host's
                # reduce-scatter before its cross ring finishes any.
                if delay and not (two_level and collective == "allreduce"):
                    assert stats["produced_early"] > 0, key
    return True


@pytest.mark.parametrize("ws,env", WORLDS,
                         ids=["ws2-ring", "ws3-ring-4K", "ws4-tcp", "ws4-two-level", "ws2-auto"])
def test_gated_collectives_same_bits_and_pipelined(world_factory, ws, env):
    two_level = "RINGDIST_HOST_ID" in env
    ring = env.get("RINGDIST_SINGLE_COPY") == "0" or two_level
    world = world_factory(ws, env=env)
    assert world.run(_case_gated, env, ring, two_level, timeout=240) == [True] * ws
