"""The element arithmetic the CUDA kernels share with the CPU kernels
(csrc/reduce/elementwise.h), run on the CPU and compared bit for bit with the CPU
kernels (x86: F16C conversions, AVX2 loops) and, where torch defines the same result,
with torch itself as an independent reference.

The CUDA kernels compute every element through these functions (compiled with
-fmad=false), so passing here is what makes GPU results equal CPU results; only a GPU
run proves the launches, streams and copies. Single process, no backend.
"""
import pytest
import torch

from torch_ringdist._extension import load

pytestmark = [pytest.mark.quick, pytest.mark.cuda]

T = load().testing

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _all_half_bits():
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)


def _same_bits(x, y):
    as_int = {4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.int8}[x.element_size()]
    return torch.equal(x.contiguous().view(as_int), y.contiguous().view(as_int))


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_widen_every_half_value(fmt):
    bits = _all_half_bits()
    shared = T.widen(bits, fmt, True)
    assert _same_bits(shared, T.widen(bits, fmt, False)), "shared widen differs from the CPU kernel"
    ref = bits.view(HALF[fmt]).float()  # torch's conversion: exact for every non-NaN value
    nan = torch.isnan(ref)
    assert _same_bits(shared[~nan], ref[~nan])
    assert torch.isnan(shared[nan]).all()


def _rounding_boundaries(fmt):
    """For every half value h: h itself, the float midpoints between h and its
    neighbours, and one float ulp either side of each (where round-to-nearest-even
    decides), as float32."""
    bits = _all_half_bits()
    values = bits.view(HALF[fmt]).float()
    values = values[torch.isfinite(values)]
    up = torch.nextafter(values.to(HALF[fmt]), torch.tensor(float("inf"), dtype=HALF[fmt])).float()
    mids = ((values.double() + up.double()) / 2).float()  # exact in float32
    cands = torch.cat([values, mids])
    inf = torch.tensor(float("inf"))
    return torch.cat([cands, torch.nextafter(cands, inf), torch.nextafter(cands, -inf)])


def _strided_floats(stride, start=0):
    """Every stride-th float32 bit pattern (all exponents, NaNs and signs included)."""
    return torch.arange(start, 1 << 32, stride, dtype=torch.int64).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_narrow_matches_cpu_kernel_and_torch(fmt):
    for values in (_rounding_boundaries(fmt), _strided_floats(977), _strided_floats(977, 500)):
        shared = T.narrow(values, fmt, True)
        kernel = T.narrow(values, fmt, False)
        bad = (shared != kernel).nonzero()
        assert bad.numel() == 0, (
            f"{fmt}: shared narrow differs from the CPU kernel for {bad.numel()} values, e.g. "
            f"{values[bad[0]].view(torch.int32).tolist()} -> {shared[bad[0]].tolist()} vs "
            f"{kernel[bad[0]].tolist()}")
        ref = values.to(HALF[fmt]).view(torch.int16)  # torch: round to nearest even
        finite = ~torch.isnan(values)
        assert torch.equal(shared[finite], ref[finite])


def _operands(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.randint(0, 2, (n,), generator=g).bool() for _ in range(2)]
    if dtype.is_floating_point:
        a, b = (torch.randn(n, generator=g, dtype=torch.float64) * 1e3 for _ in range(2))
        specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30,
                                 -1e-30, 65504.0, 3e38, -3e38, 1.0, -1.0], dtype=torch.float64)
        a[: len(specials)] = specials
        b[: len(specials)] = specials.flip(0)
        b[len(specials): 2 * len(specials)] = specials  # every special against every other
        return [a.to(dtype), b.to(dtype)]
    info = torch.iinfo(dtype)
    a, b = (torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64)
            for _ in range(2))
    edges = torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=torch.int64)
    a[: len(edges)] = edges
    b[: len(edges)] = edges.flip(0)
    return [a.to(dtype), b.to(dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_reduce_ops_match_cpu_kernels(dtype):
    # 4099 elements: vector bodies and odd tails of the CPU kernels both run.
    a, b = _operands(dtype, 4099, seed=DTYPES.index(dtype))
    checked = 0
    for op in OPS:
        try:
            kernel = T.reduce_kernel(a, b, op)
        except RuntimeError:
            with pytest.raises(RuntimeError):  # undefined for the CPU kernels: undefined here too
                T.reduce_shared(a, b, op)
            continue
        shared = T.reduce_shared(a, b, op)
        assert _same_bits(shared, kernel), f"{dtype} {op}: shared arithmetic differs from the CPU kernel"
        checked += 1
    assert checked >= (4 if dtype.is_floating_point else 7 if dtype != torch.bool else 7)


def test_reduce_shared_against_closed_forms():
    """Independent of both implementations: wrapping integer sums, NaN-propagating
    min/max, and fp16 sums rounded once from float32."""
    a = torch.tensor([127, -128, 100], dtype=torch.int8)
    b = torch.tensor([1, -1, 100], dtype=torch.int8)
    assert T.reduce_shared(a, b, "sum").tolist() == [-128, 127, -56]
    x = torch.tensor([1.0, float("nan"), 3.0])
    y = torch.tensor([float("nan"), 2.0, -5.0])
    mn = T.reduce_shared(x, y, "min")
    assert torch.isnan(mn[:2]).all() and mn[2].item() == -5.0
    h = torch.tensor([1.0, 2048.0, 65504.0], dtype=torch.float16)
    k = torch.tensor([2.0 ** -11, 1.0, 65504.0], dtype=torch.float16)
    s = T.reduce_shared(h, k, "sum")
    assert s.tolist() == (h.float() + k.float()).half().tolist()


CODECS = ["fp16", "bf16", "int8", "int4"]
BLOCK = 256


def codec_inputs(n, seed):
    """float32 values in codec blocks of very different scales, with an all-zero block, a
    block below the int8 codec's tiny threshold, huge values, and blocks holding a NaN or
    an infinity (which must decode to NaN throughout)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    blocks = (n + BLOCK - 1) // BLOCK
    scales = 10.0 ** (torch.rand(blocks, generator=g) * 10 - 5)
    x *= scales.repeat_interleave(BLOCK)[:n]
    specials = {1: 0.0, 2: 1e-35, 3: 3e38}
    for b, value in specials.items():
        if b < blocks:
            x[b * BLOCK:(b + 1) * BLOCK] *= value if value != 3e38 else 1.0
            if value == 3e38:
                x[b * BLOCK] = 3e38
    if blocks > 5:
        x[4 * BLOCK + 7] = float("nan")
        x[5 * BLOCK + 9] = float("-inf")
    return x


def nonfinite_blocks(x):
    bad = ~torch.isfinite(x)
    pad = (-len(x)) % BLOCK
    return torch.nn.functional.pad(bad, (0, pad)).view(-1, BLOCK).any(1)


def assert_same_encoding(codec, x, got, expected):
    """Equal bytes, except the payload of blocks holding a NaN or infinity (any payload
    decodes to NaN there: the scale is NaN in both)."""
    if codec == "bf16":
        assert torch.equal(got, expected)
        return
    full = 4 + {"int8": BLOCK, "int4": BLOCK // 2, "fp16": 2 * BLOCK}[codec]
    for b, bad in enumerate(nonfinite_blocks(x).tolist()):
        lo, hi = b * full, min((b + 1) * full, len(expected))
        if bad:
            assert torch.isnan(got[lo:lo + 4].view(torch.float32)).all(), f"block {b}: scale not NaN"
            assert torch.isnan(expected[lo:lo + 4].view(torch.float32)).all()
        else:
            assert torch.equal(got[lo:hi], expected[lo:hi]), f"{codec} block {b} differs"


def assert_same_decoding(x, got, expected):
    assert _same_bits(got[torch.isfinite(expected)], expected[torch.isfinite(expected)])
    assert torch.equal(torch.isnan(got), torch.isnan(expected))


@pytest.mark.parametrize("n", [1, 255, 256, 257, 4099, 65536 + 77])
@pytest.mark.parametrize("codec", CODECS)
def test_codec_block_math_matches_cpu_codecs(codec, n):
    x = codec_inputs(n, seed=n)
    cpu = T.codec_encode(x, codec, "cpu")
    shared = T.codec_encode(x, codec, "shared")
    assert_same_encoding(codec, x, shared, cpu)
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1))
    for add in (None, acc):
        expected = T.codec_decode(cpu, codec, n, "cpu", add)
        assert_same_decoding(x, T.codec_decode(cpu, codec, n, "shared", add), expected)
