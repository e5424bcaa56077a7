"""The int8 and fp16 codec kernels (AVX2 or portable, whichever this CPU runs) against a
float32 reference written with torch ops, bit for bit. Single process, no backend."""
import pytest
import torch

from torch_ringdist._extension import load

BLOCK = 256


def _reference(x, codec):
    """decode(encode(x)) from the codec definition in csrc/codec/codec.h."""
    n = x.numel()
    pad = (-n) % BLOCK
    b = torch.nn.functional.pad(x, (0, pad)).view(-1, BLOCK)
    m = b.abs().amax(1, keepdim=True)
    if codec == "int8":
        inv = torch.full_like(m, 127.0) / m  # not 127.0 / m: torch computes that as 127 * (1/m)
        q = torch.clamp(torch.round(b * inv), -127, 127)
        out = torch.where(m < 1e-30, 0.0, q * (m / 127.0))  # tiny blocks encode as zeros
    else:
        s = torch.clamp(15 - torch.frexp(m).exponent, max=126).float()
        one = torch.ones_like(s)
        out = (b * torch.ldexp(one, s)).half().float() * torch.ldexp(one, -s)
    return out.view(-1)[:n]


@pytest.mark.parametrize("codec", ["int8", "fp16"])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 256 * 40 + 13])
def test_roundtrip_bitwise(codec, n):
    g = torch.Generator().manual_seed(n)
    for exponent in (-8, -3, 0, 4):
        x = torch.randn(n, generator=g) * 10.0 ** exponent
        x[::97] = 0.0
        assert torch.equal(load().codec_roundtrip(x, codec), _reference(x, codec)), exponent


@pytest.mark.parametrize("codec", ["int8", "fp16"])
def test_nonfinite_block_decodes_to_nan(codec):
    x = torch.randn(3 * BLOCK)
    x[BLOCK + 5] = float("inf")
    out = load().codec_roundtrip(x, codec)
    assert out[BLOCK:2 * BLOCK].isnan().all()
    assert torch.equal(out[:BLOCK], _reference(x[:BLOCK], codec))
    assert torch.equal(out[2 * BLOCK:], _reference(x[2 * BLOCK:], codec))
