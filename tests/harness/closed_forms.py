"""Inputs whose reductions have closed forms, for the collective tests that run with a reported
round trip (test_ring_in_flight, test_cross_host_routes), and the test-build check they share."""
import pytest
import torch


def require_test_build():
    """torch_ringdist._C.testing, or a skip where the build has no test hooks."""
    from torch_ringdist import _C
    if not hasattr(_C, "testing"):
        pytest.skip("needs a test build (TORCH_RINGDIST_TESTING=1)")
    return _C.testing


def values(rank, count, dtype):
    """Small integers, exact in every dtype (bf16 has 8 bits of mantissa): rank + 1 + i % 7."""
    return (torch.arange(count, dtype=torch.int64) % 7 + rank + 1).to(dtype)


def expected(ws, count, op):
    """The reduction over ws ranks of values(), in float64: "sum", "avg" or "max"."""
    if op == "max":  # the last rank's values
        return (torch.arange(count, dtype=torch.int64) % 7 + ws).to(torch.float64)
    total = ws * (torch.arange(count, dtype=torch.int64) % 7) + ws * (ws + 1) // 2
    return total.to(torch.float64) / (ws if op == "avg" else 1)
