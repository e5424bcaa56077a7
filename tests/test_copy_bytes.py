"""The engine's large copy (copyBytes: memmove in 256 KiB pieces, csrc/common/cpu.h) against
torch's own copy of the same regions: sizes around the piece size, and overlapping regions in
both directions (the destination after the source must copy its last piece first)."""
import pytest
import torch

from torch_ringdist._extension import load

pytestmark = pytest.mark.quick

T = load().testing
PIECE = 256 << 10


@pytest.mark.parametrize("nbytes", [0, 1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 77])
@pytest.mark.parametrize("shift", [-(PIECE + 5), -4096, -1, 1, 4096, PIECE + 5, 5 * PIECE])
def test_copy_bytes_matches_reference(nbytes, shift):
    gen = torch.Generator().manual_seed(nbytes * 31 + shift)
    size = nbytes + abs(shift) + 2 * PIECE
    buf = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    src = PIECE if shift >= 0 else PIECE + abs(shift)
    dst = src + shift
    want = buf.clone()
    want[dst:dst + nbytes] = buf[src:src + nbytes].clone()  # the source as it was
    T.copy_bytes(buf, dst, src, nbytes)
    assert torch.equal(buf, want)


def test_copy_bytes_rejects_regions_outside_the_tensor():
    with pytest.raises(RuntimeError, match="inside the tensor"):
        T.copy_bytes(torch.zeros(16, dtype=torch.uint8), 8, 0, 9)
