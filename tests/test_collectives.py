"""Correctness matrix for every collective, backend-agnostic (ringdist, or gloo for reference).

Each pytest item is one ``World.run`` call; the worker loops over element counts,
layouts, roots (and dtypes for pure data movement) and returns, per sub-case,
``(error message or None, digest of the result)``. Expected values are computed in
the worker from closed-form inputs of *all* ranks in int64/float64, never from the
backend under test. The parent asserts no sub-case failed and that digests of
results that must be identical on every rank are identical.
"""
from __future__ import annotations

import functools
import hashlib
import os
import time
import warnings
from itertools import product  # the sub-cases of a worker: first axis outermost

import pytest
import torch
import torch.distributed as dist

from harness.world import default_backend, ranks_equal

# ---------------------------------------------------------------- the matrix axes
DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16"}
INT_DTYPES = {"int8", "uint8", "int32", "int64"}
ARITH_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
BIT_OPS = ["BAND", "BOR", "BXOR"]


def ops_for(dtype: str) -> list[str]:
    if dtype in FLOAT_DTYPES:
        return ARITH_OPS
    if dtype in INT_DTYPES:
        return ARITH_OPS + BIT_OPS
    return ["SUM", "PRODUCT", "MIN", "MAX"] + BIT_OPS  # bool: AVG is an error (test_bad_input)


DTYPE_OPS = [(d, o) for d in DTYPES for o in ops_for(d)]

# (world_size, world config). A config names the segment setting and, for
# ringdist, the transport: "default"/"64" use RINGDIST_TRANSPORT=auto (shared
# memory between these same-host ranks), "tcp"/"tcp-64" force TCP. Segment
# "64" shrinks RINGDIST_SEGMENT_BYTES so that small tensors take the
# multi-segment pipeline; it is pointless with one rank.
WORLDS = [(1, "default"), (2, "default"), (3, "default"), (4, "default"),
          (2, "64"), (3, "64"), (4, "64"),
          (2, "tcp"), (3, "tcp"), (4, "tcp"), (2, "tcp-64"), (3, "tcp-64"), (4, "tcp-64"),
          (3, "hosts"), (4, "hosts"), (4, "hosts-64")]
# "hosts": ranks assigned to emulated hosts by RINGDIST_HOST_ID, alternating
# (rank r on host r % 2): shared memory inside a host, TCP across, and a ring
# whose order differs from rank order (0, 2, 1, 3), which every ring
# collective's chunk ownership must get right.
WORLD_IDS = [f"ws{w}-{s}" for w, s in WORLDS]


def segment_of(cfg: str) -> str:
    return "64" if cfg.endswith("64") else "default"


def transport_of(cfg: str) -> str:
    if cfg.startswith("hosts"):
        return "hosts"
    return "tcp" if cfg.startswith("tcp") else "auto"

SMALL_COUNTS = [0, 1, 7, 1001]      # empty, single, odd, odd & not divisible by 2/3/4
LARGE = (1 << 20) + 3               # a few MiB of float32; only with the default segment
LARGE_REDUCE_CASES = {("float32", "SUM"), ("float32", "AVG"), ("bfloat16", "SUM"),
                      ("float16", "MAX"), ("int64", "SUM"), ("uint8", "BXOR")}
LARGE_MOVE_DTYPES = {"float32", "int8"}  # large payloads for data-movement collectives


def counts_for(seg: str, large: bool) -> list[int]:
    return SMALL_COUNTS + ([LARGE] if large and segment_of(seg) == "default" else [])


def world_env(seg: str) -> dict:
    # 64-byte segments: every allreduce takes a ring (no one-round latency path), so small
    # counts run the multi-segment pipeline and chunks shorter than a segment or empty.
    env = {} if segment_of(seg) == "default" else {"RINGDIST_SEGMENT_BYTES": segment_of(seg),
                                                   "RINGDIST_SMALL_ALLREDUCE_BYTES": "0",
                                                   "RINGDIST_PAIR_ALLREDUCE_BYTES": "0"}
    if transport_of(seg) == "tcp":
        env["RINGDIST_TRANSPORT"] = "tcp"
    return env


def world_env_for(ws: int, seg: str) -> dict:
    env = world_env(seg)
    if transport_of(seg) == "hosts":
        env["RINGDIST_HOST_ID"] = ",".join(f"host{r % 2}" for r in range(ws))
    if (ws, seg) == (3, "default"):
        # Large same-host transfers through the shared-memory rings (what hosts whose kernel
        # copy measures slow use); the other one-host worlds copy straight (conftest.py).
        env["RINGDIST_SINGLE_COPY"] = "0"
    return env


def copies_straight(ws: int, seg: str) -> bool:
    """Whether this matrix world's same-host ranks copy straight between buffers."""
    return transport_of(seg) != "tcp" and world_env_for(ws, seg).get("RINGDIST_SINGLE_COPY") != "0"


def get_world(world_factory, ws: int, seg: str):
    if transport_of(seg) in ("tcp", "hosts") and default_backend() != "ringdist":
        pytest.skip("the transport dimension only exists for ringdist")
    return world_factory(ws, env=world_env_for(ws, seg))


# ------------------------------------------------------------------- gloo gaps
# Only for the gloo reference run: behaviour gloo lacks. Never consulted for ringdist.
GLOO_GAPS = {
    "int_avg": "gloo does not support ReduceOp.AVG on integer tensors",
    "uneven_all_to_all": "gloo all_to_all (list) requires equal per-peer sizes",
    # gloo handles a strided (non-dense) view as if it were contiguous memory: wrong
    # results, storage between the elements overwritten (dense transposed views are fine).
    "strided_output": "gloo writes into strided (non-dense) tensors as if contiguous",
    "strided_input_all_to_all_single": "gloo all_to_all_single rejects non-contiguous input",
    "stacked": "gloo rejects the stacked [world_size, n] form of the *_single collectives",
}


def skip_if_gloo_gap(gap: str | None) -> None:
    if gap is not None and default_backend() == "gloo":
        pytest.skip(GLOO_GAPS[gap])


def reduce_gap(dtype: str, op: str) -> str | None:
    return "int_avg" if op == "AVG" and dtype in INT_DTYPES else None


# Layout variants loop over these (dtype, op) pairs in one item: layout handling is
# independent of the op; integer AVG (a gloo gap) stays in the dense dtype x op items.
LAYOUT_DTYPE_OPS = [(d, o) for d, o in DTYPE_OPS if reduce_gap(d, o) is None]
DENSE = ["contig", "transposed"]

# torch 2.13 renamed the *_into_tensor / *_tensor collectives; use whichever exists.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ============================================================ worker-side helpers
def tdtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def rop(name: str):
    return getattr(dist.ReduceOp, name)


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    # A fresh dense copy: .contiguous() may keep odd strides on size-1 views.
    flat = torch.empty(t.numel(), dtype=t.dtype, device="cpu")
    flat.copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(flat_bytes(t).numpy().tobytes()).hexdigest()[:16]


# Per-dtype multipliers that push values past the exact range of the next narrower
# accumulator (int64 beyond 2^53, int32 beyond 2^24, float64 beyond float32, ...), so a
# reduction done in the wrong type is caught, while sums/products of up to 4 terms stay
# exact and in range.
_ADD_SCALE = {"float32": 4097, "float64": (1 << 30) + 1, "float16": 33, "bfloat16": 9,
              "int8": 5, "uint8": 5, "int32": (1 << 26) + 1, "int64": (1 << 58) + 1}
_MINMAX_SCALE = {"float32": (1 << 20) + 1, "float64": (1 << 40) + 1, "float16": 97,
                 "bfloat16": 11, "int8": 11, "uint8": 11, "int32": (1 << 26) + 3,
                 "int64": (1 << 58) + 7}
_PROD_SCALE = {"float32": 3, "float64": 4097, "float16": 1, "bfloat16": 1,
               "int8": 1, "uint8": 1, "int32": 65, "int64": (1 << 14) + 1}


def reduce_input(op: str, dtype: str, rank: int, n: int, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contribution to a reduction: deterministic, op/dtype-aware values."""
    i = torch.arange(n, dtype=torch.int64) + salt * 7919
    dt = tdtype(dtype)
    if dtype == "bool":
        # Bit ``rank`` of the index: every combination of the ranks' bits appears.
        return ((i >> rank) & 1).to(torch.bool)
    unsigned = dtype == "uint8"
    if op in BIT_OPS:
        # Tensor arithmetic wraps mod 2^64 (Python ints would overflow int64 instead).
        x = i * -7046029254386353131 + torch.full_like(i, rank + 1) * -4658895280553007687
        x = x ^ (x >> 29)
        return x.to(dt)  # truncating cast keeps the low bits: fine for bitwise ops
    if op in ("SUM", "AVG"):
        v = (i * 3 + rank * 5) % 11 - (0 if unsigned else 5)
        return (v * _ADD_SCALE[dtype]).to(dt)
    if op == "PRODUCT":
        table = torch.tensor([1, 2, 3] if unsigned else [-2, -1, 1, 2])
        v = table[(i * 7 + rank * 3) % len(table)]
        return (v * _PROD_SCALE[dtype]).to(dt)
    if op in ("MIN", "MAX"):
        v = (i * 7 + rank * 13) % 23 - (0 if unsigned else 11)
        return (v * _MINMAX_SCALE[dtype]).to(dt)
    raise ValueError(op)


def reduce_expected(op: str, dtype: str, ranks, n: int, salt: int = 0) -> torch.Tensor:
    """Independent reference: reduce every rank's input in int64/float64."""
    wide = torch.float64 if dtype in FLOAT_DTYPES else torch.int64
    stack = torch.stack([reduce_input(op, dtype, r, n, salt).to(wide) for r in ranks])
    k = stack.shape[0]
    dt = tdtype(dtype)
    if dtype == "bool":
        s = stack.sum(0)
        logical = {"SUM": s > 0, "MAX": s > 0, "BOR": s > 0,
                   "PRODUCT": s == k, "MIN": s == k, "BAND": s == k, "BXOR": s % 2 == 1}
        return logical[op]
    if op == "SUM":
        return stack.sum(0).to(dt)
    if op == "AVG":
        if dtype in FLOAT_DTYPES:
            return stack.sum(0) / k  # stays float64: compared with a one-ulp tolerance (approx_for)
        return torch.div(stack.sum(0), k, rounding_mode="trunc").to(dt)
    if op == "PRODUCT":
        return stack.prod(0).to(dt)
    if op == "MIN":
        return stack.amin(0).to(dt) if n else torch.empty(0, dtype=dt)
    if op == "MAX":
        return stack.amax(0).to(dt) if n else torch.empty(0, dtype=dt)
    fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    return functools.reduce(fn, stack.unbind(0)).to(dt)


def mismatch(got: torch.Tensor, exp: torch.Tensor, what: str = "", approx: bool = False) -> str | None:
    """None if ``got`` equals ``exp``; else a short description.

    Exact unless ``approx``: then within one ulp of the float64 reference ``exp``
    (float AVG: dividing by world size may round either way, and half types may round
    twice). Cross-rank bitwise identity is still checked separately via digests."""
    got = got.detach().reshape(-1)
    exp = exp.reshape(-1)
    if got.numel() != exp.numel():
        return f"{what}numel {got.numel()} != expected {exp.numel()}"
    if got.numel() == 0:
        return None
    if not approx:
        bad = got != exp.to(got.dtype)  # exact (value equality: -0.0 == 0.0; inputs hold no NaN)
    else:
        g = got.double()
        tol = torch.finfo(got.dtype).eps * exp.abs() + torch.finfo(got.dtype).tiny
        bad = (g - exp).abs() > tol
    if not bool(bad.any()):
        return None
    idx = bad.nonzero().reshape(-1)
    j = int(idx[0])
    return (f"{what}{idx.numel()}/{got.numel()} elements wrong, first at [{j}]: "
            f"got {got[j].item()!r}, expected {exp[j].item()!r}")


def bytes_mismatch(got: torch.Tensor, exp: torch.Tensor, what: str = "") -> str | None:
    """Bitwise equality: for pure data movement (payloads may contain NaN bit patterns)."""
    if got.shape != exp.shape and got.numel() != exp.numel():
        return f"{what}shape {tuple(got.shape)} != expected {tuple(exp.shape)}"
    g, e = flat_bytes(got), flat_bytes(exp)
    if torch.equal(g, e):
        return None
    j = int((g != e).nonzero()[0]) // got.element_size()
    return f"{what}bytes differ, first element [{j}]: got {got.reshape(-1)[j].item()!r}, " \
           f"expected {exp.reshape(-1)[j].item()!r}"


def payload(dtype: str, rank: int, n: int, salt: int = 0) -> torch.Tensor:
    """Random bytes (any bit pattern, NaNs included) for data-movement collectives."""
    g = torch.Generator().manual_seed(((rank * 1000003 + salt) * 1009 + n) * 31 + DTYPES.index(dtype))
    dt = tdtype(dtype)
    # Drawn on the CPU, then moved to the default device (CUDA in test_cuda_collectives).
    if dtype == "bool":
        bits = torch.randint(0, 2, (n,), generator=g, device="cpu").to(torch.bool)
    else:
        size = torch.empty(0, dtype=dt).element_size()
        raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g, device="cpu")
        bits = raw.view(dt)
    return bits.to(torch.get_default_device())


# ------------------------------------------------------------------ layouts
_SENTINEL = {"bool": True}


class Slot:
    """A tensor of ``n`` logical elements in a given memory layout.

    contig:     plain 1-D tensor.
    strided:    every other element of a 2n buffer; the gaps hold a sentinel that must
                survive the collective (catches backends writing a contiguous copy over
                the user's storage).
    transposed: a 2-D transposed view (only for counts with a non-trivial factorization).
    """

    def __init__(self, layout: str, n: int, dtype: str):
        dt = tdtype(dtype)
        self.layout, self.n = layout, n
        if layout == "contig":
            self.base = torch.empty(n, dtype=dt)
            self.t = self.base
        elif layout == "strided":
            self.base = torch.full((n, 2), _SENTINEL.get(dtype, 77), dtype=dt)
            self.t = self.base[:, 0]
        elif layout == "transposed":
            a = factor(n)
            self.base = torch.empty(a, n // a, dtype=dt)
            self.t = self.base.t()
        else:
            raise ValueError(layout)
        if n > 1 and layout != "contig":
            assert not self.t.is_contiguous()

    def fill(self, values: torch.Tensor) -> "Slot":
        self.t.copy_(values.reshape(self.t.shape))
        return self

    def values(self) -> torch.Tensor:
        """The logical elements (row-major over the view's shape)."""
        return self.t.reshape(-1)

    def damage(self) -> str | None:
        if self.layout == "strided":
            gap = self.base[:, 1]
            if self.n and not bool((gap == _SENTINEL.get(str(gap.dtype)[6:], 77)).all()):
                return "storage between the strided elements was overwritten"
        return None


def factor(n: int) -> int:
    for a in range(2, int(n ** 0.5) + 1):
        if n % a == 0:
            return a
    return 0


def layouts_for(n: int, layouts) -> list[str]:
    return [lay for lay in layouts if lay != "transposed" or factor(n)]


def approx_for(op: str, dtype: str) -> bool:
    return op == "AVG" and dtype in FLOAT_DTYPES


def check_slot(slot: Slot, exp: torch.Tensor, what: str, exact_bytes: bool = False, approx: bool = False):
    if exact_bytes:
        err = bytes_mismatch(slot.values(), exp, what + ": ")
    else:
        err = mismatch(slot.values(), exp, what + ": ", approx)
    return err or (slot.damage() and f"{what}: {slot.damage()}")


# ==================================================== reductions: worker functions
def _case_all_reduce(rank, ws, cases, counts, layouts, async_op=False):
    out = {}
    for (dtype, op), n in product(cases, counts):
        exp = reduce_expected(op, dtype, range(ws), n)
        for lay in layouts_for(n, layouts):
            slot = Slot(lay, n, dtype).fill(reduce_input(op, dtype, rank, n))
            work = dist.all_reduce(slot.t, op=rop(op), async_op=async_op)
            if async_op:
                work.wait()
            key = f"{dtype},{op},n={n},{lay}"
            out[key] = (check_slot(slot, exp, key, approx=approx_for(op, dtype)), digest(slot.values()))
    return out


def _case_reduce(rank, ws, cases, counts, layouts):
    out = {}
    for (dtype, op), root, n in product(cases, range(ws), counts):
        exp = reduce_expected(op, dtype, range(ws), n) if rank == root else None
        for lay in layouts_for(n, layouts):
            slot = Slot(lay, n, dtype).fill(reduce_input(op, dtype, rank, n))
            dist.reduce(slot.t, dst=root, op=rop(op))
            # Only the root's result is defined; other ranks report that they ran.
            key = f"{dtype},{op},root={root},n={n},{lay}"
            out[key] = check_slot(slot, exp, key, approx=approx_for(op, dtype)) if rank == root else None
    return out


def _case_reduce_scatter(rank, ws, cases, counts, variant):
    """Chunk j of rank r's input is reduce_input(..., salt=j); rank j receives chunk j."""
    out = {}
    for (dtype, op), n in product(cases, counts):
        exp = reduce_expected(op, dtype, range(ws), n, salt=rank)
        chunks = [reduce_input(op, dtype, rank, n, salt=j) for j in range(ws)]
        key = f"{dtype},{op},n={n},{variant}"
        if variant == "list":
            res = Slot("contig", n, dtype)
            dist.reduce_scatter(res.t, [c.clone() for c in chunks], op=rop(op))
        elif variant == "list_strided":
            res = Slot("strided", n, dtype)
            ins = [Slot("strided", n, dtype).fill(c).t for c in chunks]
            dist.reduce_scatter(res.t, ins, op=rop(op))
        elif variant == "tensor":
            res = Slot("contig", n, dtype)
            reduce_scatter_single(res.t, torch.cat(chunks), op=rop(op))
        elif variant == "tensor_stacked":
            # Input shaped [world_size, n] instead of concatenated.
            res = Slot("contig", n, dtype)
            reduce_scatter_single(res.t, torch.stack(chunks), op=rop(op))
        elif variant == "tensor_strided":
            res = Slot("strided", n, dtype)
            src = Slot("strided", ws * n, dtype).fill(torch.cat(chunks))
            reduce_scatter_single(res.t, src.t, op=rop(op))
        else:
            raise ValueError(variant)
        out[key] = check_slot(res, exp, key, approx=approx_for(op, dtype))
    return out


def _case_all_reduce_coalesced(rank, ws, dtype, op, sizes):
    warnings.simplefilter("ignore", FutureWarning)  # deprecated but still the public API
    ts = [reduce_input(op, dtype, rank, n, salt=k) for k, n in enumerate(sizes)]
    dist.all_reduce_coalesced(ts, op=rop(op))
    out = {}
    for k, (n, t) in enumerate(zip(sizes, ts)):
        key = f"tensor{k}(n={n})"
        exp = reduce_expected(op, dtype, range(ws), n, salt=k)
        out[key] = (mismatch(t, exp, key + ": ", approx_for(op, dtype)), digest(t))
    return out


# Signed zeros, infinities and NaNs with a different payload on every rank: every pair of them
# meets in some element. MIN/MAX keep the first of two NaNs and, of +0.0/-0.0, the second
# operand, so they only come out alike on every rank if every rank combines in rank order.
SPECIAL_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3FC00000, 0xC0000000]


def special_inputs(rank: int, ws: int, dtype: str) -> torch.Tensor:
    k = len(SPECIAL_BITS) + 2
    bits = torch.tensor(SPECIAL_BITS + [0x7FC00011 + rank, 0xFFC00022 + rank], dtype=torch.int64)
    values = bits.to(torch.int32).view(torch.float32)  # int32 wraps the high patterns
    digit = (torch.arange(k ** ws) // k ** rank) % k  # element i: this rank's value is digit r of i
    return values[digit].to(getattr(torch, dtype))


def special_expected(op: str, ws: int, dtype: str) -> torch.Tensor:
    combine = {"SUM": torch.add, "PRODUCT": torch.mul,
               "MIN": lambda a, b: torch.where((a < b) | a.isnan(), a, b),
               "MAX": lambda a, b: torch.where((a > b) | a.isnan(), a, b)}[op]
    acc = special_inputs(0, ws, dtype)
    for r in range(1, ws):  # rank order, one rounding per step (as the kernels)
        acc = combine(acc.float(), special_inputs(r, ws, dtype).float()).to(acc.dtype)
    return acc


def _case_special_values(rank, ws):
    out = {}
    for dtype, op in product(["float32", "float64", "bfloat16", "float16"], ["SUM", "PRODUCT", "MIN", "MAX"]):
        key = f"{dtype}/{op}"
        t = special_inputs(rank, ws, dtype)
        dist.all_reduce(t, op=rop(op))
        exp = special_expected(op, ws, dtype)
        same = (t == exp) | (t.isnan() & exp.isnan())
        same &= (torch.signbit(t) == torch.signbit(exp)) | exp.isnan()
        bad = (~same).nonzero().flatten()[:4].tolist()
        err = f"{key}: elements {bad}: got {t[bad].tolist()}, want {exp[bad].tolist()}" if bad else None
        out[key] = (err, digest(t))
    return out


# ============================================== data movement: worker functions
def _case_broadcast(rank, ws, dtypes, counts, layouts):
    out = {}
    for dtype, n, root in product(dtypes, counts, range(ws)):
        exp = payload(dtype, root, n)
        for lay in layouts_for(n, layouts):
            # Non-roots start from their own (different) bytes.
            slot = Slot(lay, n, dtype).fill(payload(dtype, rank, n))
            dist.broadcast(slot.t, src=root)
            key = f"{dtype},n={n},root={root},{lay}"
            out[key] = check_slot(slot, exp, key, exact_bytes=True)
    return out


def _case_all_gather(rank, ws, dtypes, counts, variant):
    out = {}
    for dtype, n in product(dtypes, counts):
        exp = [payload(dtype, r, n) for r in range(ws)]
        key = f"{dtype},n={n}"
        mine = payload(dtype, rank, n)
        errs = []
        if variant == "list":
            outs = [Slot("contig", n, dtype) for _ in range(ws)]
            dist.all_gather([s.t for s in outs], mine)
        elif variant == "list_strided":
            # Strided input and strided output slots.
            outs = [Slot("strided", n, dtype) for _ in range(ws)]
            dist.all_gather([s.t for s in outs], Slot("strided", n, dtype).fill(mine).t)
        elif variant in ("tensor", "tensor_stacked", "tensor_strided_input"):
            shape = (ws, n) if variant == "tensor_stacked" else (ws * n,)
            res = torch.empty(shape, dtype=tdtype(dtype))
            src = Slot("strided", n, dtype).fill(mine).t if variant == "tensor_strided_input" else mine
            all_gather_single(res, src)
            errs.append(bytes_mismatch(res.reshape(-1), torch.cat(exp), key + ": "))
            outs = []
        elif variant == "tensor_in_place":
            # FSDP2's form: the input is this rank's block of the output.
            res = torch.empty(ws * n, dtype=tdtype(dtype))
            res.view(torch.uint8).fill_(0xA5)  # blocks not yet received
            res[rank * n:(rank + 1) * n] = mine
            all_gather_single(res, res[rank * n:(rank + 1) * n])
            errs.append(bytes_mismatch(res, torch.cat(exp), key + ": "))
            outs = []
        else:
            raise ValueError(variant)
        errs += [check_slot(s, exp[r], f"{key} from rank {r}", exact_bytes=True)
                 for r, s in enumerate(outs)]
        out[key] = next((e for e in errs if e), None)
    return out


def _case_gather(rank, ws, dtypes, counts, layout):
    out = {}
    for dtype, n, root in product(dtypes, counts, range(ws)):
        src = Slot(layout, n, dtype).fill(payload(dtype, rank, n))
        slots = [Slot(layout, n, dtype) for _ in range(ws)] if rank == root else None
        dist.gather(src.t, [s.t for s in slots] if slots else None, dst=root)
        key = f"{dtype},n={n},root={root}"
        errs = [check_slot(s, payload(dtype, r, n), f"{key} from rank {r}", True)
                for r, s in enumerate(slots or [])]
        errs.append(check_slot(src, payload(dtype, rank, n), key + " (input modified)", True))
        out[key] = next((e for e in errs if e), None)
    return out


def _case_scatter(rank, ws, dtypes, counts, layout):
    out = {}
    for dtype, n, root in product(dtypes, counts, range(ws)):
        # Root sends chunk r (payload salted by the destination) to rank r.
        chunks = [Slot(layout, n, dtype).fill(payload(dtype, root, n, salt=1 + r))
                  for r in range(ws)] if rank == root else None
        res = Slot(layout, n, dtype).fill(payload(dtype, rank, n))
        dist.scatter(res.t, [c.t for c in chunks] if chunks else None, src=root)
        key = f"{dtype},n={n},root={root}"
        out[key] = check_slot(res, payload(dtype, root, n, salt=1 + rank), key, True)
    return out


def a2a_size(src: int, dst: int, base: int) -> int:
    """Uneven per-peer sizes, zero included (base=0 makes some pairs empty)."""
    return (src * 3 + dst * 2 + base) % 5 + (base // 5) * 5


def _case_all_to_all(rank, ws, dtypes, bases, uneven):
    """all_to_all (list). Rank s sends payload(s, n, salt=d) of size a2a_size(s, d) to d."""
    out = {}
    for dtype, base in product(dtypes, bases):
        size = (lambda s, d: a2a_size(s, d, base)) if uneven else (lambda s, d: base)
        ins = [payload(dtype, rank, size(rank, d), salt=d) for d in range(ws)]
        outs = [torch.empty(size(s, rank), dtype=tdtype(dtype)) for s in range(ws)]
        dist.all_to_all(outs, ins)
        key = f"{dtype},base={base}"
        errs = [bytes_mismatch(outs[s], payload(dtype, s, size(s, rank), salt=rank),
                               f"{key} from rank {s}: ") for s in range(ws)]
        out[key] = next((e for e in errs if e), None)
    return out


def _case_all_to_all_single(rank, ws, dtypes, bases, variant):
    """all_to_all_single: even (no split sizes) or uneven input/output split sizes."""
    out = {}
    for dtype, base in product(dtypes, bases):
        if variant == "even":
            size = lambda s, d: base  # noqa: E731
        else:
            size = lambda s, d: a2a_size(s, d, base)  # noqa: E731
        in_splits = [size(rank, d) for d in range(ws)]
        out_splits = [size(s, rank) for s in range(ws)]
        src = torch.cat([payload(dtype, rank, size(rank, d), salt=d) for d in range(ws)])
        exp = torch.cat([payload(dtype, s, size(s, rank), salt=rank) for s in range(ws)])
        in_slot = Slot("strided" if variant == "noncontig_input" else "contig", src.numel(), dtype).fill(src)
        res = Slot("strided" if variant == "noncontig_output" else "contig", exp.numel(), dtype)
        if variant == "even":
            dist.all_to_all_single(res.t, in_slot.t)
        else:
            dist.all_to_all_single(res.t, in_slot.t, out_splits, in_splits)
        key = f"{dtype},base={base}"
        out[key] = check_slot(res, exp, key, exact_bytes=True)
    return out


# ================================================== misc: worker functions
def _case_send_recv(rank, ws, dtypes, counts):
    out = {}
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype, n in product(dtypes, counts):
        key = f"{dtype},n={n}"
        # Blocking ring, ordered by rank parity so it cannot deadlock.
        mine = payload(dtype, rank, n, salt=5)
        got = torch.empty(n, dtype=tdtype(dtype))
        if rank % 2 == 0:
            dist.send(mine, dst=nxt, tag=5)
            dist.recv(got, src=prv, tag=5)
        else:
            dist.recv(got, src=prv, tag=5)
            dist.send(mine, dst=nxt, tag=5)
        errs = [bytes_mismatch(got, payload(dtype, prv, n, salt=5), key + " blocking: ")]
        # Two tagged messages on the same pair, received in the opposite order:
        # the tag, not arrival order, must decide which buffer gets which message.
        a, b = payload(dtype, rank, n, salt=11), payload(dtype, rank, n, salt=12)
        ra, rb = torch.empty_like(a), torch.empty_like(b)
        sends = [dist.isend(a, dst=nxt, tag=11), dist.isend(b, dst=nxt, tag=12)]
        recvs = [dist.irecv(rb, src=prv, tag=12), dist.irecv(ra, src=prv, tag=11)]
        for w in recvs + sends:
            w.wait()
        errs.append(bytes_mismatch(ra, payload(dtype, prv, n, salt=11), key + " tag 11: "))
        errs.append(bytes_mismatch(rb, payload(dtype, prv, n, salt=12), key + " tag 12: "))
        out[key] = next((e for e in errs if e), None)
    return out


def _case_recv_any(rank, ws, n):
    """Receives from any source (src=None): the sender each returns, and its bytes."""
    out = {}
    for root in range(ws):
        others = [r for r in range(ws) if r != root]
        # Every other rank sends to root at once; root takes them in whatever order they come.
        if rank == root:
            got = {}
            for _ in others:
                buf = torch.empty(n, dtype=torch.int64)
                src = dist.recv(buf, tag=21)
                got.setdefault(src, []).append(buf)
            ok = sorted(got) == others and all(
                len(got[s]) == 1 and torch.equal(got[s][0], payload("int64", s, n, salt=21))
                for s in others)
            out[f"root={root} gather"] = None if ok else f"senders {sorted(got)}, expected {others}"
        else:
            dist.send(payload("int64", rank, n, salt=21), dst=root, tag=21)
        # Posted before a collective that the sender joins before sending.
        sender = (root + 1) % ws
        x = torch.full((5,), float(rank + 1))
        if rank == root:
            buf = torch.empty(n, dtype=torch.int64)
            work = dist.irecv(buf, tag=22)
            dist.all_reduce(x)
            work.wait()
            src = work._source_rank()
            ok = src == sender and torch.equal(buf, payload("int64", sender, n, salt=22))
            out[f"root={root} across all_reduce"] = None if ok else f"source {src}, expected {sender}"
        else:
            dist.all_reduce(x)
            if rank == sender:
                dist.send(payload("int64", rank, n, salt=22), dst=root, tag=22)
        expect = ws * (ws + 1) / 2
        out[f"root={root} all_reduce"] = None if bool((x == expect).all()) else f"all_reduce gave {x}"
        # A message already pulled in by a receive waiting for another tag.
        if rank == root:
            later = torch.empty(n, dtype=torch.int64)
            first = dist.irecv(later, src=sender, tag=31)
            buf = torch.empty(n, dtype=torch.int64)
            src = dist.recv(buf, tag=32)
            first.wait()
            ok = (src == sender and torch.equal(buf, payload("int64", sender, n, salt=32))
                  and torch.equal(later, payload("int64", sender, n, salt=31)))
            out[f"root={root} held message"] = None if ok else f"source {src}, buffers wrong"
        elif rank == sender:
            dist.send(payload("int64", rank, n, salt=32), dst=root, tag=32)
            dist.send(payload("int64", rank, n, salt=31), dst=root, tag=31)
        # A blocking receive of the later tag first: the earlier message is held and the
        # receive still gets its own (it used to wait for another receive to read on); then a
        # collective through the links, whose bytes no header read may take.
        y = torch.full((1 << 16,), float(rank + 1))
        if rank == root:
            second, first = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
            dist.recv(second, src=sender, tag=42)
            dist.recv(first, src=sender, tag=41)
            ok = (torch.equal(second, payload("int64", sender, n, salt=42))
                  and torch.equal(first, payload("int64", sender, n, salt=41)))
            out[f"root={root} later tag first"] = None if ok else "buffers wrong"
        elif rank == sender:
            dist.send(payload("int64", rank, n, salt=41), dst=root, tag=41)
            dist.send(payload("int64", rank, n, salt=42), dst=root, tag=42)
        dist.all_reduce(y)
        ok = bool((y == ws * (ws + 1) / 2).all())
        out[f"root={root} all_reduce after"] = None if ok else f"all_reduce gave {y[:3]}"
    return out


def _case_barrier(rank, ws, tmpdir, rounds):
    """A rotating late rank; after the barrier every rank must see everyone's marker."""
    out = {}
    for k in range(rounds):
        late = k % ws
        if rank == late:
            time.sleep(0.15)
        open(os.path.join(tmpdir, f"round{k}-rank{rank}"), "w").close()
        if k % 2:
            dist.barrier(async_op=True).wait()
        else:
            dist.barrier()
        missing = [r for r in range(ws) if not os.path.exists(os.path.join(tmpdir, f"round{k}-rank{r}"))]
        out[f"round{k}(late rank {late})"] = f"passed the barrier before ranks {missing} arrived" if missing else None
    return out


def make_obj(rank: int, tag: str = ""):
    # Pickled sizes differ a lot per rank, so the object collectives' size exchange matters.
    return {"rank": rank, "tag": tag, "ints": list(range(rank * 37)), "s": "x" * (rank * 1000 + 1),
            "t": torch.arange(rank + 1)}


def same_obj(a, b) -> bool:
    return (a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor)
                                         else a[k] == b[k] for k in a))


def _case_objects(rank, ws):
    out = {}
    got = [None] * ws
    dist.all_gather_object(got, make_obj(rank, "ag"))
    out["all_gather_object"] = None if all(same_obj(got[r], make_obj(r, "ag")) for r in range(ws)) \
        else f"got {[g['rank'] if isinstance(g, dict) else g for g in got]}"
    for root in range(ws):
        lst = [make_obj(root, "b"), f"tail-{root}"] if rank == root else [None, None]
        dist.broadcast_object_list(lst, src=root)
        ok = same_obj(lst[0], make_obj(root, "b")) and lst[1] == f"tail-{root}"
        out[f"broadcast_object_list root={root}"] = None if ok else f"got {lst[1]!r}"

        gl = [None] * ws if rank == root else None
        dist.gather_object(make_obj(rank, "g"), gl, dst=root)
        ok = rank != root or all(same_obj(gl[r], make_obj(r, "g")) for r in range(ws))
        out[f"gather_object root={root}"] = None if ok else "wrong gathered objects"

        res = [None]
        dist.scatter_object_list(res, [make_obj(r, f"s{root}") for r in range(ws)] if rank == root else None,
                                 src=root)
        ok = isinstance(res[0], dict) and same_obj(res[0], make_obj(rank, f"s{root}"))
        out[f"scatter_object_list root={root}"] = None if ok else "wrong scattered object"
    return out


def _case_setup(rank, ws):
    return {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "segment_env": os.environ.get("RINGDIST_SEGMENT_BYTES"), "threads": torch.get_num_threads(),
            "transports": _transports(), "allreduce_rings": _allreduce_rings(),
            "single_copy": _single_copy_host()}


def _ringdist_backend():
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def _transports():
    if dist.get_backend() != "ringdist":
        return None
    return sorted(set(_ringdist_backend().transports) - {"self"})


def _allreduce_rings():
    return _ringdist_backend().allreduce_rings if dist.get_backend() == "ringdist" else None


def _single_copy_host():
    return _ringdist_backend().same_host_copy["single_copy"] if dist.get_backend() == "ringdist" else None


# ====================================== single copy (one host): worker functions
# float32 counts around the single-copy limit: under and at 32 KiB, an odd count past 512 KiB
# (broadcast parts of unequal length), and 1 MiB.
SINGLE_COPY_COUNTS = [8191, 8192, 131073, 262144]
# (collective, variant) pairs of _case_single_copy.
SINGLE_COPY_OPS = [("broadcast", "roots"), ("all_gather", "list"), ("all_gather", "tensor_in_place"),
                   ("reduce_scatter", "tensor")]


def _group_with_env(ws, env):
    """A new group of all ws ranks, created while this rank's environment has `env` set (a
    backend reads its RINGDIST_* settings when it is created)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return dist.new_group(list(range(ws)))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _single_copy_bytes(group=None):
    import torch_ringdist
    return sum(s["single_copy_bytes"] for s in torch_ringdist.stats(group).values())


def _case_single_copy(rank, ws, counts, group_env=None):
    """Broadcast (every root), allgather (list, in place) and reduce-scatter of `counts` float32
    elements per rank; per size and op, the bytes this rank copied to or from peers' memory. With
    group_env, the ops run on a new group created while this rank's environment has
    group_env[rank] set."""
    import torch_ringdist
    group = None if group_env is None else _group_with_env(ws, group_env[rank])
    out = {}
    for n in counts:
        for name, variant in SINGLE_COPY_OPS:
            torch_ringdist.reset_stats(group)
            if group is not None:
                res = _case_group_copy(rank, ws, n, name, group)
            elif name == "broadcast":
                res = _case_broadcast(rank, ws, ["float32"], [n], ["contig"])
            elif name == "all_gather":
                res = _case_all_gather(rank, ws, ["float32"], [n], variant)
            else:
                res = _case_reduce_scatter(rank, ws, [("float32", "SUM")], [n], variant)
            key = f"{name}/{variant}/n={n}"
            out.update({f"{key}/{k}": v for k, v in res.items()})
            out[f"{key}/read"] = _single_copy_bytes(group)
    return out


SPECIAL_DTYPES = ["float32", "float64", "bfloat16", "float16"]
SPECIAL_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
# Per-rank bytes of the single-copy-vs-ring cases (+7 elements: not whole pieces).
SINGLE_VS_RING_SIZES = {"all_reduce": [256 << 10, 1 << 20], "reduce_scatter": [40 << 10, 300 << 10]}


def _case_single_copy_vs_ring(rank, ws, collectives):
    """Allreduces (256 KiB, under the two-rank one-round limit, and just over 1 MiB) and
    reduce-scatters (about 40 and 300 KiB per rank) of tiled special values (signed zeros,
    infinities, per-rank NaN payloads), on a group that copies straight between the ranks'
    buffers and on one with single copy off (the one-round path or the ring): the bytes must be
    equal. Also returns the bytes each group copied to or from peers' memory per collective."""
    import torch_ringdist
    groups = {name: _group_with_env(ws, env)
              for name, env in (("single", {"RINGDIST_SINGLE_COPY": "1"}),
                                ("ring", {"RINGDIST_SINGLE_COPY_BYTES": "0"}))}
    out = {}
    for collective in collectives:
        for group in groups.values():
            torch_ringdist.reset_stats(group)
        for size, dtype, op in product(SINGLE_VS_RING_SIZES[collective], SPECIAL_DTYPES, SPECIAL_OPS):
            base = special_inputs(rank, ws, dtype)
            count = size // base.element_size() + 7
            total = count * (ws if collective == "reduce_scatter" else 1)
            x = base.repeat(total // base.numel() + 1)[:total]
            got = {}
            for name, group in groups.items():
                if collective == "all_reduce":
                    t = x.clone()
                    dist.all_reduce(t, op=rop(op), group=group)
                else:
                    t = torch.empty(count, dtype=x.dtype)
                    dist.reduce_scatter_tensor(t, x, op=rop(op), group=group)
                got[name] = t.view(torch.uint8)
            bad = (got["single"] != got["ring"]).nonzero().flatten()[:4].tolist()
            out[f"{collective}/{size}/{dtype}/{op}"] = (
                f"bytes {bad} differ without single copy" if bad else None)
        for name, group in groups.items():
            out[f"copied/{collective}/{name}"] = _single_copy_bytes(group)
    return out


def _case_group_copy(rank, ws, n, name, group):
    """One broadcast per root, one allgather or one reduce-scatter on `group`, checked against
    closed forms."""
    out = {}
    if name == "broadcast":
        for root in range(ws):
            t = torch.full((n,), float(rank))
            dist.broadcast(t, src=root, group=group)
            out[f"root={root}"] = None if bool((t == root).all()) else f"root {root}: {t[:4]}"
    elif name == "reduce_scatter":
        # Rank r's block j holds r + 10 j: rank j receives the sum over r, ws (ws-1)/2 + 10 j ws.
        res = torch.empty(n)
        src = torch.arange(ws, dtype=torch.float32).repeat_interleave(n) * 10 + rank
        dist.reduce_scatter_tensor(res, src, group=group)
        exp = ws * (ws - 1) / 2 + 10 * rank * ws
        out["reduced"] = None if bool((res == exp).all()) else f"got {res[:4]}, expected {exp}"
    else:
        res = torch.empty(n * ws)
        dist.all_gather_into_tensor(res, torch.full((n,), float(rank)), group=group)
        exp = torch.arange(ws, dtype=torch.float32).repeat_interleave(n)
        out["gathered"] = None if torch.equal(res, exp) else f"got {res[::n].tolist()}"
    return out


# ================================================================ parent side
def assert_cases(results, check_digests: bool = True) -> int:
    """Fail with every failing sub-case; check cross-rank digests. Returns #sub-cases."""
    failures = []
    for r, res in enumerate(results):
        assert res, f"rank {r} ran no sub-cases"  # a test must never pass vacuously
        for key, val in res.items():
            err = val[0] if isinstance(val, tuple) else val
            if err:
                failures.append(f"rank {r}: {err}")
    assert not failures, f"{len(failures)} failing sub-case(s):\n" + "\n".join(failures[:30])
    if check_digests and isinstance(next(iter(results[0].values())), tuple):
        ranks_equal([{k: v[1] for k, v in res.items()} for res in results], "result bytes")
    return len(results[0])


# The quick check's worlds: shared memory at two ranks; three ranks on two emulated hosts
# (shared memory within a host, TCP across, a ring out of rank order).
QUICK_WORLDS = {(2, "default"), (3, "hosts")}
world_params = pytest.mark.parametrize(
    "ws,seg", [pytest.param(w, s, marks=pytest.mark.quick if (w, s) in QUICK_WORLDS else ())
               for w, s in WORLDS], ids=WORLD_IDS)
dtype_op_params = pytest.mark.parametrize("dtype,op", DTYPE_OPS, ids=[f"{d}-{o}" for d, o in DTYPE_OPS])


@world_params
def test_world_setup(world_factory, ws, seg):
    """The matrix really runs on the backend and segment size it claims to."""
    res = get_world(world_factory, ws, seg).run(_case_setup)
    for rank, info in enumerate(res):
        expected_transports = expected_rings = single_copy = None
        if default_backend() == "ringdist":
            same_host = [p for p in range(ws) if transport_of(seg) != "hosts" or p % 2 == rank % 2]
            single_copy = copies_straight(ws, seg) and len(same_host) > 1
            # Two emulated hosts of two ranks each (ring order 0, 2, 1, 3): large allreduces
            # go two-level, [our host's ranks, the ranks at our position on each host].
            uniform_hosts = transport_of(seg) == "hosts" and ws % 2 == 0
            expected_rings = [[rank % 2, rank % 2 + 2], [rank // 2 * 2, rank // 2 * 2 + 1]] \
                if uniform_hosts else []
            # Same-host ranks: shared memory unless TCP is forced.
            if transport_of(seg) == "hosts":  # shm to same-host peers (same r % 2), tcp to others
                expected_transports = sorted({"shm" if p % 2 == rank % 2 else "tcp"
                                              for p in range(ws) if p != rank})
            else:
                expected_transports = [] if ws == 1 else ["tcp" if transport_of(seg) == "tcp" else "shm"]
        seg_env = None if segment_of(seg) == "default" else segment_of(seg)
        assert info == {"backend": default_backend(), "rank": rank, "world_size": ws,
                        "segment_env": seg_env, "threads": 1,
                        "transports": expected_transports, "allreduce_rings": expected_rings,
                        "single_copy": single_copy}, info


# -------------------------------------------------------------------- reductions
@dtype_op_params
@world_params
def test_all_reduce(world_factory, ws, seg, dtype, op):
    skip_if_gloo_gap(reduce_gap(dtype, op))
    counts = counts_for(seg, (dtype, op) in LARGE_REDUCE_CASES)
    res = get_world(world_factory, ws, seg).run(_case_all_reduce, [(dtype, op)], counts, DENSE)
    assert_cases(res)


@world_params
def test_all_reduce_strided(world_factory, ws, seg):
    skip_if_gloo_gap("strided_output")
    res = get_world(world_factory, ws, seg).run(
        _case_all_reduce, LAYOUT_DTYPE_OPS, SMALL_COUNTS, ["strided"])
    assert_cases(res)


@pytest.mark.parametrize("layouts", [DENSE, ["strided"]], ids=["dense", "strided"])
@world_params
def test_all_reduce_async(world_factory, ws, seg, layouts):
    skip_if_gloo_gap("strided_output" if "strided" in layouts else None)
    cases = [("float32", "SUM"), ("int64", "MAX"), ("bool", "BOR"), ("bfloat16", "AVG")]
    res = get_world(world_factory, ws, seg).run(
        _case_all_reduce, cases, counts_for(seg, True), layouts, async_op=True)
    assert_cases(res)


@pytest.mark.parametrize("ws,seg", [(2, "default"), (3, "default"), (2, "tcp")],
                         ids=["ws2-default", "ws3-default", "ws2-tcp"])
def test_all_reduce_special_values(world_factory, ws, seg):
    """Small allreduces (the one-round paths) of signed zeros, infinities and NaNs give the
    rank-order result, bit for bit the same on every rank."""
    if default_backend() != "ringdist":
        pytest.skip("the rank-order contract is ringdist's")
    assert_cases(get_world(world_factory, ws, seg).run(_case_special_values))


def test_all_reduce_larger_than_ring(world_factory):
    """One-round allreduces (up to 512 KiB) larger than a 4 KiB shared-memory ring: each rank
    must take the peer's data while its own send still waits for room. (Single copy off: it
    would take the larger ones.)"""
    world = world_factory(2, env={"RINGDIST_SHM_RING_BYTES": "4096", "RINGDIST_SINGLE_COPY_BYTES": "0"})
    cases = [("float32", "SUM"), ("bfloat16", "AVG"), ("int64", "MAX"), ("float64", "MIN")]
    assert_cases(world.run(_case_all_reduce, cases, [1000, 5000, 8192, 65536], DENSE))


@dtype_op_params
@world_params
def test_reduce(world_factory, ws, seg, dtype, op):
    skip_if_gloo_gap(reduce_gap(dtype, op))
    counts = counts_for(seg, (dtype, op) == ("float32", "SUM"))
    res = get_world(world_factory, ws, seg).run(_case_reduce, [(dtype, op)], counts, DENSE)
    assert_cases(res, check_digests=False)


@world_params
def test_reduce_strided(world_factory, ws, seg):
    skip_if_gloo_gap("strided_output")
    res = get_world(world_factory, ws, seg).run(_case_reduce, LAYOUT_DTYPE_OPS, SMALL_COUNTS, ["strided"])
    assert_cases(res, check_digests=False)


@dtype_op_params
@world_params
def test_reduce_scatter(world_factory, ws, seg, dtype, op):
    skip_if_gloo_gap(reduce_gap(dtype, op))
    w = get_world(world_factory, ws, seg)
    counts = counts_for(seg, (dtype, op) in LARGE_REDUCE_CASES)
    for variant in ["list", "tensor"]:
        assert_cases(w.run(_case_reduce_scatter, [(dtype, op)], counts, variant), check_digests=False)


@pytest.mark.parametrize("variant", ["list_strided", "tensor_strided", "tensor_stacked"])
@world_params
def test_reduce_scatter_layouts(world_factory, ws, seg, variant):
    skip_if_gloo_gap("stacked" if variant == "tensor_stacked" else "strided_output")
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_reduce_scatter, LAYOUT_DTYPE_OPS, SMALL_COUNTS, variant), check_digests=False)


@dtype_op_params
@world_params
def test_all_reduce_coalesced(world_factory, ws, seg, dtype, op):
    skip_if_gloo_gap(reduce_gap(dtype, op))
    res = get_world(world_factory, ws, seg).run(_case_all_reduce_coalesced, dtype, op, [7, 1, 0, 1001, 3])
    assert_cases(res)


# ---------------------------------------------------------------- data movement
@pytest.mark.parametrize("layouts", [DENSE, ["strided"]], ids=["dense", "strided"])
@world_params
def test_broadcast(world_factory, ws, seg, layouts):
    skip_if_gloo_gap("strided_output" if "strided" in layouts else None)
    res = get_world(world_factory, ws, seg).run(_case_broadcast, DTYPES, SMALL_COUNTS, layouts)
    assert_cases(res, check_digests=False)
    if segment_of(seg) == "default" and layouts == DENSE:
        res = get_world(world_factory, ws, seg).run(
            _case_broadcast, sorted(LARGE_MOVE_DTYPES), [LARGE], ["contig"])
        assert_cases(res, check_digests=False)


@pytest.mark.parametrize("variant", ["list", "list_strided", "tensor", "tensor_stacked",
                                     "tensor_strided_input", "tensor_in_place"])
@world_params
def test_all_gather(world_factory, ws, seg, variant):
    skip_if_gloo_gap("stacked" if variant == "tensor_stacked" else None)
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_all_gather, DTYPES, SMALL_COUNTS, variant), check_digests=False)
    if variant in ("list", "tensor", "tensor_in_place") and segment_of(seg) == "default":
        assert_cases(w.run(_case_all_gather, ["float32"], [LARGE], variant), check_digests=False)


# ---------------------------------------------------------------- single copy
def _expected_reads(ws, n, name, readable=True):
    """Bytes a rank copies to or from peers' memory in one _case_single_copy step (0: the
    rings). Allgather: it reads each peer's block; reduce-scatter: its own block of each peer's
    input. Broadcast from each root in turn: as a
    reader at distance k from the root it reads all but part k of ws parts (the root writes
    that one), as the root it writes parts 1..ws-1: (ws - 1) buffers in all."""
    nbytes = 4 * n
    if not readable or nbytes < 32768:
        return 0
    return (ws - 1) * nbytes


@pytest.mark.parametrize("ws,seg", [(2, "default"), (3, "default"), (4, "default"), (2, "tcp"),
                                    (4, "hosts")],
                         ids=["ws2", "ws3", "ws4", "ws2-tcp", "ws4-hosts"])
def test_single_copy(world_factory, ws, seg):
    """Broadcast, allgather and reduce-scatter around the single-copy limit give the closed-form
    bytes, and each rank copied exactly the bytes the rules say to or from its peers' memory: on
    one host from 32 KiB (per rank), never over TCP or across hosts."""
    if default_backend() != "ringdist":
        pytest.skip("single copy is ringdist's")
    w = get_world(world_factory, ws, seg) if copies_straight(ws, seg) or transport_of(seg) != "auto" \
        else world_factory(ws, env=dict(world_env_for(ws, seg), RINGDIST_SINGLE_COPY="1"))
    res = w.run(_case_single_copy, SINGLE_COPY_COUNTS)
    readable = transport_of(seg) == "auto"
    reads = [{k: r.pop(k) for k in list(r) if k.endswith("/read")} for r in res]
    assert_cases(res, check_digests=False)
    for rank, got in enumerate(reads):
        want = {f"{name}/{variant}/n={n}/read": _expected_reads(ws, n, name, readable)
                for n in SINGLE_COPY_COUNTS for name, variant in SINGLE_COPY_OPS}
        assert got == want, f"rank {rank}"


@pytest.mark.parametrize("ws", [2, 3])
def test_single_copy_matches_ring(world_factory, ws):
    """The single-copy allreduce and reduce-scatter combine each element in the order of the path
    they replace (two-rank allreduce up to the one-round limit: rank order; otherwise the ring's
    chain), so their bytes equal that path's for every dtype and op, NaN payloads and signed zeros
    included (and so the GPU path's, which follows the same orders). Allreduce: each chunk's
    owner reads it from every peer and writes the result back; reduce-scatter: each rank reads
    its block of each peer's input."""
    if default_backend() != "ringdist":
        pytest.skip("single copy is ringdist's")
    collectives = ["all_reduce", "reduce_scatter"]
    res = world_factory(ws).run(_case_single_copy_vs_ring, collectives)
    copied = [{k: r.pop(k) for k in list(r) if k.startswith("copied/")} for r in res]
    assert_cases(res, check_digests=False)
    elem = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
    for collective in collectives:
        # Bytes per rank and call: (size // elem + 7) elements.
        payload = len(SPECIAL_OPS) * sum((size // elem[d] + 7) * elem[d]
                                         for size in SINGLE_VS_RING_SIZES[collective]
                                         for d in SPECIAL_DTYPES)
        for rank, got in enumerate(copied):
            assert got[f"copied/{collective}/ring"] == 0, (rank, got)
            if collective == "reduce_scatter":
                assert got[f"copied/{collective}/single"] == (ws - 1) * payload, (rank, got)
        if collective == "all_reduce":
            # Each chunk is read from and written back into the ws-1 peers by its owner.
            total = sum(got[f"copied/{collective}/single"] for got in copied)
            assert total == 2 * (ws - 1) * payload, copied


def test_single_copy_off_on_one_rank(world_factory):
    """One rank with RINGDIST_SINGLE_COPY_BYTES=0: the whole host agrees at connect time to
    use the rings (no rank reads, results exact); the same world's next group, with single
    copy on everywhere, reads."""
    if default_backend() != "ringdist":
        pytest.skip("single copy is ringdist's")
    w = world_factory(3)
    counts = [262144]
    off = w.run(_case_single_copy, counts, [{}, {"RINGDIST_SINGLE_COPY_BYTES": "0"}, {}])
    on = w.run(_case_single_copy, counts, [{}, {}, {}])
    for res, readable in ((off, False), (on, True)):
        reads = [{k: r.pop(k) for k in list(r) if k.endswith("/read")} for r in res]
        assert_cases(res, check_digests=False)
        for rank, got in enumerate(reads):
            assert got == {f"{name}/{variant}/n=262144/read": _expected_reads(3, 262144, name, readable)
                           for name, variant in SINGLE_COPY_OPS}, \
                f"rank {rank}, single copy {'on' if readable else 'off on rank 1'}"


def _case_copy_probe(rank, ws, group_env):
    """On a group created with group_env[rank] in this rank's environment: how the host copies
    (same_host_copy), and the bytes this rank copied from peers' memory in a 256 KiB-per-rank
    allgather, whose result is checked against its closed form."""
    import torch_ringdist
    group = _group_with_env(ws, group_env[rank])
    backend = group._get_backend(torch.device("cpu"))
    n = 65536
    x = torch.full((n,), float(rank + 1))
    out = torch.empty(n * ws)
    torch_ringdist.reset_stats(group)
    dist.all_gather_into_tensor(out, x, group=group)
    want = torch.arange(1, ws + 1, dtype=torch.float32).repeat_interleave(n)
    return {"copy": backend.same_host_copy, "read": _single_copy_bytes(group),
            "exact": bool(torch.equal(out, want))}


def test_copy_probe(world_factory):
    """RINGDIST_SINGLE_COPY=auto: at connect time the host's ranks time a kernel copy from a
    peer against the rings' two memcpys and every rank takes the same decision, the one the
    rule gives for the figures they all report, which the collectives then follow (an allgather
    reads peers' memory exactly when single copy was chosen). RINGDIST_SINGLE_COPY=1 on one
    rank skips the measurement and turns it on for the host."""
    if default_backend() != "ringdist":
        pytest.skip("single copy is ringdist's")
    w = world_factory(3)
    measured = w.run(_case_copy_probe, [{"RINGDIST_SINGLE_COPY": "auto"}] * 3)
    copy = measured[0]["copy"]
    assert all(r["copy"]["single_copy"] == copy["single_copy"] for r in measured), measured
    assert all(r["copy"]["probe_kernel_us"] == copy["probe_kernel_us"] and
               r["copy"]["probe_rings_us"] == copy["probe_rings_us"] for r in measured), measured
    assert copy["probe_kernel_us"] > 0 and copy["probe_rings_us"] > 0, copy
    # The rule: the rings only when the kernel copy is x1.2 slower than their two memcpys.
    assert copy["single_copy"] == (copy["probe_kernel_us"] <= 1.2 * copy["probe_rings_us"]), copy
    assert "measured at connect" in copy["why"], copy
    for rank, r in enumerate(measured):
        assert r["exact"], rank
        assert r["read"] == (2 * 65536 * 4 if copy["single_copy"] else 0), (rank, r)
    forced = w.run(_case_copy_probe, [{"RINGDIST_SINGLE_COPY": "auto"},
                                      {"RINGDIST_SINGLE_COPY": "1"},
                                      {"RINGDIST_SINGLE_COPY": "auto"}])
    for rank, r in enumerate(forced):
        assert r["copy"] == {"single_copy": True, "why": "single copy: RINGDIST_SINGLE_COPY=1 on rank 1",
                             "probe_kernel_us": 0.0, "probe_rings_us": 0.0}, (rank, r)
        assert r["exact"] and r["read"] == 2 * 65536 * 4, (rank, r)


@pytest.mark.parametrize("layout", ["contig", "strided"])
@world_params
def test_gather(world_factory, ws, seg, layout):
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_gather, DTYPES, SMALL_COUNTS, layout), check_digests=False)


@pytest.mark.parametrize("layout", ["contig", "strided"])
@world_params
def test_scatter(world_factory, ws, seg, layout):
    skip_if_gloo_gap("strided_output" if layout == "strided" else None)
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_scatter, DTYPES, SMALL_COUNTS, layout), check_digests=False)


# base: 0 gives per-peer sizes 0..4 (empties included); 1000 gives ~1000-element chunks.
A2A_BASES = [0, 3, 1000]


@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
@world_params
def test_all_to_all(world_factory, ws, seg, uneven):
    skip_if_gloo_gap("uneven_all_to_all" if uneven else None)
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_all_to_all, DTYPES, A2A_BASES, uneven), check_digests=False)


@pytest.mark.parametrize("variant", ["even", "uneven", "noncontig_input", "noncontig_output"])
@world_params
def test_all_to_all_single(world_factory, ws, seg, variant):
    skip_if_gloo_gap({"noncontig_input": "strided_input_all_to_all_single",
                      "noncontig_output": "strided_output"}.get(variant))
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_all_to_all_single, DTYPES, A2A_BASES, variant), check_digests=False)


# ------------------------------------------------------------------------ misc
P2P_WORLDS = [w for w in WORLDS if w[0] > 1]  # a rank cannot send to itself


@pytest.mark.parametrize("ws,seg", P2P_WORLDS, ids=[f"ws{w}-{s}" for w, s in P2P_WORLDS])
def test_send_recv(world_factory, ws, seg):
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_send_recv, DTYPES, SMALL_COUNTS), check_digests=False)
    assert_cases(w.run(_case_recv_any, 1001), check_digests=False)
    if segment_of(seg) == "default":
        assert_cases(w.run(_case_send_recv, ["float32"], [LARGE]), check_digests=False)


@world_params
def test_barrier(world_factory, ws, seg, tmp_path):
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_barrier, str(tmp_path), rounds=max(2, ws)), check_digests=False)


@world_params
def test_object_collectives(world_factory, ws, seg):
    w = get_world(world_factory, ws, seg)
    assert_cases(w.run(_case_objects), check_digests=False)
