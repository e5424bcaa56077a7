"""The fused top-k kernels behind the topk hook (torch_ringdist._C.topk_select / topk_scatter),
and the GPU's radix select rehearsed on the host through the arithmetic it shares with the
CPU kernels (csrc/topk/topk_math.h), against those kernels.

Single process, no backend. References: a stable descending torch.sort of the
magnitudes (ties to the lower index; NaN largest, as torch.topk), torch.topk's
value set, and index_add_ in rank order.
"""
import math

import pytest
import torch

from torch_ringdist._extension import load

pytestmark = pytest.mark.quick

SIZES = (1, 2, 7, 63, 64, 65, 1000, 4099, 40000, 100003)


def _select(grad, residual, k):
    packed = torch.empty(2 * k, dtype=torch.float32)
    load().topk_select(grad, residual, k, packed)
    return packed[:k], packed[k:].view(torch.int32).to(torch.int64)


def _reference(x, k):
    """Indices of the k largest |x|, ties to the lower index, ascending."""
    order = torch.sort(x.abs(), descending=True, stable=True).indices
    return torch.sort(order[:k]).values


def _data(n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct magnitudes: ties decide most of the cut
        return torch.randint(-3, 4, (n,), generator=g).float()
    return torch.randn(n, generator=g)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["randn", "ties"])
def test_select_matches_reference(n, kind):
    grad = _data(n, n, kind)
    for k in sorted({0, 1, max(1, math.ceil(0.01 * n)), n // 3, n - 1, n}):
        for with_residual in (False, True):
            residual = _data(n, n + 1, kind) * 0.5 if with_residual else None
            x = grad + residual if with_residual else grad.clone()  # float32, as the kernel
            grad_before = grad.clone()
            values, idx = _select(grad, residual, k)
            assert torch.equal(grad, grad_before), "grad must stay unchanged"
            ref = _reference(x, k)
            assert torch.equal(idx, ref), (n, k, kind, with_residual)
            assert torch.equal(values, x[ref])
            if k:  # same magnitudes as torch.topk picks
                top = torch.topk(x.abs(), k).values
                assert torch.equal(torch.sort(values.abs()).values, torch.sort(top).values)
            if with_residual:
                expect = x.clone()
                expect[ref] = 0
                assert torch.equal(residual, expect), "residual = x with the sent entries zeroed"


def test_select_when_the_sample_misjudges_the_cut():
    n = 1 << 17
    k = n // 100
    # Sampled positions (multiples of 64) small, the rest large: threshold too low.
    low = torch.ones(n)
    low[::64] = 0.001
    # Sampled positions large, the rest small: threshold too high, must retry.
    high = torch.full((n,), 0.001)
    high[::64] = 1.0
    high[1::64] = torch.linspace(0.01, 0.5, n // 64)
    for x in (low, high, torch.zeros(n)):
        _, idx = _select(x, None, k)
        assert torch.equal(idx, _reference(x, k))


def test_select_nan_and_inf_rank_first():
    x = torch.randn(5000)
    x[[10, 4000]] = float("nan")
    x[[20, 30]] = float("inf")
    x[40] = -float("inf")
    values, idx = _select(x, None, 5)
    assert idx.tolist() == [10, 20, 30, 40, 4000]
    assert values[[1, 2]].tolist() == [float("inf")] * 2 and values[3].item() == -float("inf")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(1, 1), (10, 3), (4099, 41), (70001, 700)])
def test_scatter_matches_index_add(world, n, k):
    g = torch.Generator().manual_seed(world * n)
    parts = []
    for _ in range(world):  # overlapping index sets across ranks
        idx = torch.sort(torch.randperm(n, generator=g)[:k]).values.to(torch.int32)
        parts.append(torch.cat([torch.randn(k, generator=g), idx.view(torch.float32)]))
    gathered = torch.cat(parts)
    out = torch.full((n,), 123.0)  # every entry must be overwritten
    load().topk_scatter(gathered, world, k, out)
    ref = torch.zeros(n)
    for p in parts:
        ref.index_add_(0, p[k:].view(torch.int32).long(), p[:k] / world)
    assert torch.equal(out, ref)
    exact = torch.zeros(n, dtype=torch.float64)
    for p in parts:
        exact.index_add_(0, p[k:].view(torch.int32).long(), p[:k].double())
    assert torch.allclose(out.double(), exact / world, rtol=1e-6, atol=1e-7)


def test_scatter_rejects_bad_index_and_shapes():
    parts = torch.cat([torch.ones(2), torch.tensor([0, 10], dtype=torch.int32).view(torch.float32)])
    with pytest.raises(RuntimeError, match="index 10"):
        load().topk_scatter(parts, 1, 2, torch.empty(10))
    with pytest.raises(RuntimeError, match="want 2 x k"):
        load().topk_scatter(parts, 2, 2, torch.empty(10))
    with pytest.raises(RuntimeError, match="want 2k"):
        load().topk_select(torch.ones(10), None, 3, torch.empty(5))


# ------------------------------------------------ the GPU algorithm, rehearsed on the host
def _radix_select(grad, residual, k, tile):
    packed = torch.empty(2 * k, dtype=torch.float32)
    load().testing.topk_radix_select(grad, residual, k, packed, tile)
    return packed


def _close_keys(n, seed):
    """Magnitudes that share their high digits and differ in the last radix pass's bits."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.full((n,), 0x3F800000, dtype=torch.int32) + torch.randint(0, 600, (n,), generator=g,
                                                                            dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    return (bits | sign).view(torch.float32)


def _special(n, seed):
    x = _data(n, seed, "randn")
    x[::7] = 0.0
    x[1::11] = -0.0
    x[2::13] = float("inf")
    x[3::17] = -float("inf")
    x[4::19] = float("nan")
    x[5::23] = 1e-40  # subnormal
    return x


KINDS = {
    "randn": lambda n, seed: _data(n, seed, "randn"),
    "ties": lambda n, seed: _data(n, seed, "ties"),
    "zeros": lambda n, seed: torch.zeros(n),
    "close_keys": _close_keys,
    "special": _special,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("n", [1, 7, 64, 4095, 4096, 4097, 40000, 100003])
def test_radix_select_rehearsal_matches_cpu_kernel(kind, n):
    """Same values, indices and residual bits as topk_select, for any tile width."""
    grad = KINDS[kind](n, n)
    for k in sorted(v for v in {0, 1, 2, max(1, math.ceil(0.01 * n)), n // 3, n - 1, n} if v <= n):
        for with_residual in (False, True):
            residual = KINDS[kind](n, n + 1) * 0.5 if with_residual else None
            expected_res = residual.clone() if with_residual else None
            expected = torch.empty(2 * k)
            load().topk_select(grad, expected_res, k, expected)
            for tile in (1, 7, 4096):
                res = residual.clone() if with_residual else None
                got = _radix_select(grad, res, k, tile)
                where = f"{kind} n={n} k={k} residual={with_residual} tile={tile}"
                assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), where
                if with_residual:
                    assert torch.equal(res.view(torch.int32), expected_res.view(torch.int32)), where


def test_radix_select_takes_the_lowest_indices_of_a_tie_across_tiles():
    x = torch.ones(10000)
    x[[3, 5000, 9999]] = 2.0
    k = 503  # 3 above the cut, then the 500 lowest indices of the 9997 equal ones
    packed = _radix_select(x, None, k, 64)
    idx = packed[k:].view(torch.int32).tolist()
    assert idx == sorted([3, 5000, 9999] + [i for i in range(10000) if i not in (3, 5000, 9999)][:500])
