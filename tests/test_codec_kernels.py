"""The int8, int4 and fp16 codec kernels (AVX2 or portable, whichever this CPU runs) against a
float32 reference written with torch ops, bit for bit. Single process, no backend."""
import pytest
import torch

from torch_ringdist._extension import load

pytestmark = pytest.mark.quick

BLOCK = 256
LEVELS = {"int8": 127.0, "int4": 7.0}


def _reference(x, codec):
    """decode(encode(x)) from the codec definition in csrc/codec/codec.h."""
    n = x.numel()
    pad = (-n) % BLOCK
    b = torch.nn.functional.pad(x, (0, pad)).view(-1, BLOCK)
    m = b.abs().amax(1, keepdim=True)
    if codec in LEVELS:
        levels = LEVELS[codec]
        inv = torch.full_like(m, levels) / m  # not levels / m: torch computes that as levels * (1/m)
        q = torch.clamp(torch.round(b * inv), -levels, levels)
        out = torch.where(m < 1e-30, 0.0, q * (m / levels))  # tiny blocks encode as zeros
    else:
        s = torch.clamp(15 - torch.frexp(m).exponent, max=126).float()
        one = torch.ones_like(s)
        out = (b * torch.ldexp(one, s)).half().float() * torch.ldexp(one, -s)
    return out.view(-1)[:n]


@pytest.mark.parametrize("codec", ["int8", "int4", "fp16"])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 256 * 40 + 13])
def test_roundtrip_bitwise(codec, n):
    g = torch.Generator().manual_seed(n)
    for exponent in (-8, -3, 0, 4):
        x = torch.randn(n, generator=g) * 10.0 ** exponent
        x[::97] = 0.0
        assert torch.equal(load().codec_roundtrip(x, codec), _reference(x, codec)), exponent


@pytest.mark.parametrize("codec", ["int8", "int4", "fp16"])
def test_nonfinite_block_decodes_to_nan(codec):
    x = torch.randn(3 * BLOCK)
    x[BLOCK + 5] = float("inf")
    out = load().codec_roundtrip(x, codec)
    assert out[BLOCK:2 * BLOCK].isnan().all()
    assert torch.equal(out[:BLOCK], _reference(x[:BLOCK], codec))
    assert torch.equal(out[2 * BLOCK:], _reference(x[2 * BLOCK:], codec))
