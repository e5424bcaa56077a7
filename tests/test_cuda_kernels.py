"""The GPU reduce kernels (csrc/gpu/cuda/reduce.cu) against the CPU kernels, bit for bit, for
every dtype and op, on awkward sizes. NaN results compare equal whatever their payload:
the GPU returns its one canonical NaN where x86 passes an operand's NaN on (IEEE 754
leaves the payload open); measured on an H100 that is the only difference. Needs a CUDA build of ringdist and a GPU; skipped
otherwise (CI compiles the CUDA sources but has no GPU: tests/test_shared_arithmetic.py
covers the shared element arithmetic there).
"""
import pytest
import torch

from torch_ringdist._extension import load

from test_shared_arithmetic import DTYPES, OPS, _operands, _same_bits

_C = load()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (_C.cuda_compiled() and torch.cuda.is_available()),
                       reason="needs ringdist built with CUDA (TORCH_RINGDIST_CUDA=1) and a GPU"),
]
T = _C.testing


def _same_bits_or_both_nan(got, expected):
    if not got.is_floating_point():
        return _same_bits(got, expected)
    nan = torch.isnan(expected)
    return torch.equal(torch.isnan(got), nan) and _same_bits(got[~nan], expected[~nan])


@pytest.mark.parametrize("n", [1, 255, 4099, (1 << 20) + 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_cuda_reduce_matches_cpu_kernel(dtype, n):
    a, b = _operands(dtype, max(n, 24), seed=n)
    a, b = a[:n].contiguous(), b[:n].contiguous()
    for op in OPS:
        try:
            expected = T.reduce_kernel(a, b, op)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                T.cuda_reduce(a.cuda(), b.cuda(), op)
            continue
        got = T.cuda_reduce(a.cuda(), b.cuda(), op).cpu()
        assert _same_bits_or_both_nan(got, expected), f"{dtype} {op} n={n}: GPU differs from the CPU kernel"


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_cuda_divide_matches_cpu_kernel(dtype):
    x, _ = _operands(dtype, 4099, seed=7)
    for divisor in (2, 3, 7):
        expected = T.divide_kernel(x, divisor)
        assert _same_bits_or_both_nan(T.cuda_divide(x.cuda(), divisor).cpu(), expected), (dtype, divisor)


def test_cuda_reduce_runs_on_the_current_stream():
    """Queued behind earlier work on the caller's stream, as torch ops are."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.full((1 << 22,), 2.0, device="cuda")
        a.mul_(3.0)  # on s; the kernel must see its result
        out = T.cuda_reduce(a, a, "sum")
    s.synchronize()
    assert torch.equal(out.cpu(), torch.full((1 << 22,), 12.0))


from test_shared_arithmetic import CODECS, assert_same_decoding, assert_same_encoding, codec_inputs  # noqa: E402


@pytest.mark.parametrize("n", [1, 255, 256, 257, 4099, (1 << 20) + 77])
@pytest.mark.parametrize("codec", CODECS)
def test_cuda_codecs_match_cpu_codecs(codec, n):
    x = codec_inputs(n, seed=n)
    cpu = T.codec_encode(x, codec, "cpu")
    gpu = T.codec_encode(x.cuda(), codec, "cuda").cpu()
    assert_same_encoding(codec, x, gpu, cpu)
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1))
    for add in (None, acc):
        expected = T.codec_decode(cpu, codec, n, "cpu", add)
        got = T.codec_decode(cpu.cuda(), codec, n, "cuda", None if add is None else add.cuda())
        assert_same_decoding(x, got.cpu(), expected)


@pytest.mark.parametrize("codec", CODECS)
def test_cuda_codecs_on_unaligned_views(codec):
    """Values or encodings off their kernels' alignment take the thread-per-element kernels;
    aligned full blocks take the warp-per-block (bf16: 8-per-thread) kernels: both give the
    CPU kernels' bytes."""
    n = 4099
    x = codec_inputs(n + 3, seed=5)
    for start in (1, 2, 3):
        values = x[start:start + n]
        cpu = T.codec_encode(values.contiguous(), codec, "cpu")
        gpu = T.codec_encode(x.cuda()[start:start + n], codec, "cuda").cpu()
        assert_same_encoding(codec, values, gpu, cpu)
        padded = torch.zeros(cpu.numel() + 3, dtype=torch.uint8)
        padded[start:start + cpu.numel()] = cpu
        got = T.codec_decode(padded.cuda()[start:start + cpu.numel()], codec, n, "cuda", None)
        assert_same_decoding(values, got.cpu(), T.codec_decode(cpu, codec, n, "cpu", None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_cuda_reduce_on_unaligned_views(dtype):
    """Views that start off a 16-byte boundary take the element-wise kernel; the aligned
    bulk and its tail take the vector kernel: both must give the CPU kernel's bits."""
    a, b = _operands(dtype, 4099, seed=11)
    for start in (1, 3, 8):
        x, y = a[start:].contiguous(), b[start:].contiguous()
        got = T.cuda_reduce(a.cuda()[start:], b.cuda()[start:], "sum").cpu()
        assert _same_bits_or_both_nan(got, T.reduce_kernel(x, y, "sum")), (dtype, start)


# ------------------------------------------------ top-k (csrc/gpu/cuda/topk.cu)
def _topk_cases():
    from test_topk_ops import KINDS
    for kind in sorted(KINDS):
        for n in (1, 4095, 4097, 100003, (1 << 22) + 5):
            yield kind, n


@pytest.mark.parametrize("kind,n", list(_topk_cases()))
def test_cuda_topk_select_matches_cpu_kernel(kind, n):
    from test_topk_ops import KINDS
    import math

    grad = KINDS[kind](n, n)
    for k in sorted({0, 1, max(1, math.ceil(0.01 * n)), n // 3, n}):
        for with_residual in (False, True):
            residual = KINDS[kind](n, n + 1) * 0.5 if with_residual else None
            cpu_res = residual.clone() if with_residual else None
            expected = torch.empty(2 * k)
            _C.topk_select(grad, cpu_res, k, expected)
            gpu_res = residual.cuda() if with_residual else None
            got = torch.empty(2 * k, device="cuda")
            _C.topk_select(grad.cuda(), gpu_res, k, got)
            where = f"{kind} n={n} k={k} residual={with_residual}"
            assert torch.equal(got.cpu().view(torch.int32), expected.view(torch.int32)), where
            if with_residual:
                # Residuals are sums: NaN + NaN is the GPU's canonical NaN (as for the reduce kernels)
                assert _same_bits_or_both_nan(gpu_res.cpu(), cpu_res), where


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_cuda_topk_scatter_matches_cpu_kernel(world):
    n, k = 100003, 1001
    g = torch.Generator().manual_seed(world)
    parts = []
    for _ in range(world):
        idx = torch.sort(torch.randperm(n, generator=g)[:k]).values.to(torch.int32)
        parts.append(torch.cat([torch.randn(k, generator=g), idx.view(torch.float32)]))
    gathered = torch.cat(parts)
    expected = torch.empty(n)
    _C.topk_scatter(gathered, world, k, expected)
    got = torch.full((n,), 5.0, device="cuda")
    _C.topk_scatter(gathered.cuda(), world, k, got)
    assert torch.equal(got.cpu().view(torch.int32), expected.view(torch.int32))
    bad = gathered.clone()
    bad[(world - 1) * 2 * k + k + 7] = torch.tensor([n + 3], dtype=torch.int32).view(torch.float32)
    with pytest.raises(RuntimeError, match=f"rank {world - 1} sent index {n + 3}"):
        _C.topk_scatter(bad.cuda(), world, k, got)


def test_cuda_topk_select_runs_on_the_current_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros(1 << 22, device="cuda")
        x[12345] = 1.0  # on s; the selection must see it
        packed = torch.empty(2, device="cuda")
        _C.topk_select(x, None, 1, packed)
    s.synchronize()
    assert packed[1:].cpu().view(torch.int32).item() == 12345 and packed[0].item() == 1.0
