"""The pipelined staging of CUDA tensors across hosts, proven on the CPU: the engine's allreduce
through a StageGate (csrc/collectives/collectives.h) whose buffer is filled while the ring runs,
in the pieces the CUDA twin uses (csrc/collectives/stage_pieces.h), and whose results are taken
in runs as the ring says ranges are final (csrc/backend/testing_gated.cc). The buffer starts as
0xFF bytes, so a ring that read a range before asking for it, a piece that did not hold what was
asked, or a range called final before it was, would give other bits than dist.all_reduce, which
every case compares against."""
import pytest

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


def _case_gated(rank, ws, env, ring, two_level=False):
    import torch
    import torch.distributed as dist
    from torch_ringdist._C import testing

    name = dist.group.WORLD.group_name
    for n in COUNTS:
        for dtype_name, op in OPS:
            dtype = getattr(torch, dtype_name)
            g = torch.Generator().manual_seed(31 * rank + n)
            x = (torch.randn(n, generator=g) * 100).to(dtype)
            expected = x.clone()
            dist.all_reduce(expected, op=getattr(dist.ReduceOp, op.upper()))
            got = x.clone()
            # A slow copy for the largest case: results must come out before the input is in.
            delay = 1000 if n == COUNTS[-1] else 0
            # 16 KiB pieces: the 4 KiB segments of the ws3 world are grouped four to a piece.
            stats = testing.gated_allreduce(name, got, op, piece_bytes=16 << 10, delay_us=delay)
            key = (n, dtype_name, op, stats)
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), key
            nbytes = got.numel() * got.element_size()
            assert stats["bytes_planned_once"] == nbytes, key
            assert stats["bytes_produced_once"] == nbytes, key
            assert stats["needs"] == stats["planned"], key
            assert stats["pieces"] <= stats["planned"], key  # a range is never cut
            assert stats["copies_back"] <= stats["produced"], key
            # The one-round path up to 1 MiB for two ranks, 64 KiB for more (options.h).
            if not ring or nbytes <= (1 << 20 if ws == 2 else 64 << 10):
                assert stats["planned"] == (1 if nbytes else 0), key  # the whole buffer
            else:
                assert stats["planned"] > 1, key  # segment by segment
                if env.get("RINGDIST_SEGMENT_BYTES") == "4K":
                    assert stats["pieces"] < stats["planned"], key  # segments grouped
                # The flat ring finishes its first segments while later ones are still
                # coming in; the two-level one reads all of them in the host's
                # reduce-scatter before its cross ring finishes any.
                if delay and not two_level:
                    assert stats["produced_early"] > 0, key
    return True


@pytest.mark.parametrize("ws,env", WORLDS,
                         ids=["ws2-ring", "ws3-ring-4K", "ws4-tcp", "ws4-two-level", "ws2-auto"])
def test_gated_allreduce_same_bits_and_pipelined(world_factory, ws, env):
    two_level = "RINGDIST_HOST_ID" in env
    ring = env.get("RINGDIST_SINGLE_COPY") == "0" or two_level
    world = world_factory(ws, env=env)
    assert world.run(_case_gated, env, ring, two_level, timeout=240) == [True] * ws
