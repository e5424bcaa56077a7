"""Multiple process groups and concurrent async work.

Groups created in a case are destroyed at its end, so long-lived worlds do not
accumulate backends (and the destroy path gets exercised too).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from test_collectives import (WORLD_IDS, WORLDS, get_world, mismatch, payload, bytes_mismatch,
                              reduce_expected, reduce_input, rop)

DEFAULT_WORLDS = [1, 2, 3, 4]


def _check_allreduce(group, members, rank, dtype, op, n, salt, what):
    """all_reduce on ``group``; expected = reduction over ``members`` (global ranks)."""
    t = reduce_input(op, dtype, rank, n, salt)
    dist.all_reduce(t, op=rop(op), group=group)
    return mismatch(t, reduce_expected(op, dtype, members, n, salt), f"{what}: ")


def _check_all_gather(group, members, rank, n, what):
    outs = [torch.empty(n, dtype=torch.int32) for _ in members]
    dist.all_gather(outs, payload("int32", rank, n, salt=3), group=group)
    # Output order is the group-rank order, i.e. sorted global ranks.
    errs = [bytes_mismatch(o, payload("int32", m, n, salt=3), f"{what} from rank {m}: ")
            for o, m in zip(outs, sorted(members))]
    return next((e for e in errs if e), None)


def _group_ops(group, members, rank, tag):
    errs = [
        _check_allreduce(group, members, rank, "float32", "SUM", 1001, 1, f"{tag} all_reduce f32 SUM"),
        _check_allreduce(group, members, rank, "int64", "MAX", 7, 2, f"{tag} all_reduce i64 MAX"),
        _check_allreduce(group, members, rank, "int32", "BXOR", 33, 3, f"{tag} all_reduce i32 BXOR"),
        _check_all_gather(group, members, rank, 5, f"{tag} all_gather"),
    ]
    root = max(members)  # a global rank that is not group rank 0 in general
    t = payload("float64", rank, 9)
    dist.broadcast(t, src=root, group=group)
    errs.append(bytes_mismatch(t, payload("float64", root, 9), f"{tag} broadcast from {root}: "))
    return [e for e in errs if e]


def _case_new_group_all(rank, ws):
    g = dist.new_group(list(range(ws)))
    errs = _group_ops(g, list(range(ws)), rank, "new_group(all)")
    errs += _group_ops(None, list(range(ws)), rank, "default group after new_group")
    dist.destroy_process_group(g)
    return errs


def subsets(ws):
    # Proper subsets incl. a singleton, a non-contiguous pair, and one without rank 0.
    cands = [[ws - 1], [0, ws - 1], list(range(1, ws, 2)), [r for r in range(ws) if r != 1]]
    out = []
    for c in cands:
        if c and len(c) < ws and c not in out:
            out.append(c)
    return out


def _case_new_group_subset(rank, ws):
    errs = []
    groups = [(dist.new_group(s), s) for s in subsets(ws)]  # every rank creates every group
    for i, (g, members) in enumerate(groups):
        if rank in members:
            errs += _group_ops(g, members, rank, f"subset {members}")
        # Interleave with the default group between subgroup uses.
        e = _check_allreduce(None, range(ws), rank, "float32", "SUM", 17, 10 + i, f"world after subset {members}")
        errs += [e] if e else []
    for g, members in groups:
        if rank in members:
            dist.destroy_process_group(g)
    return errs


def _case_same_members_interleaved(rank, ws, cross_order):
    """Two groups over the same ranks; async ops alternate between them.

    With ``cross_order`` the *issue order across the two groups* differs by rank parity
    (legal: each group is an independent communicator), so a backend that mixes the
    groups' traffic, or serialises all groups through one queue, fails or hangs here.
    """
    g1, g2 = dist.new_group(list(range(ws))), dist.new_group(list(range(ws)))
    pending = []
    for k in range(6):
        n = 1 + 211 * k
        a = reduce_input("SUM", "float32", rank, n, salt=100 + k)
        b = reduce_input("MAX", "int64", rank, n, salt=200 + k)
        first_g1 = (k % 2 == 0) if not cross_order else (rank % 2 == 0)
        if first_g1:
            wa = dist.all_reduce(a, op=dist.ReduceOp.SUM, group=g1, async_op=True)
            wb = dist.all_reduce(b, op=dist.ReduceOp.MAX, group=g2, async_op=True)
        else:
            wb = dist.all_reduce(b, op=dist.ReduceOp.MAX, group=g2, async_op=True)
            wa = dist.all_reduce(a, op=dist.ReduceOp.SUM, group=g1, async_op=True)
        pending.append((k, n, a, wa, b, wb))
    errs = []
    for k, n, a, wa, b, wb in pending:
        wa.wait()
        wb.wait()
        errs.append(mismatch(a, reduce_expected("SUM", "float32", range(ws), n, 100 + k), f"g1 op {k}: "))
        errs.append(mismatch(b, reduce_expected("MAX", "int64", range(ws), n, 200 + k), f"g2 op {k}: "))
    dist.destroy_process_group(g1)
    dist.destroy_process_group(g2)
    return [e for e in errs if e]


def _case_new_subgroups(rank, ws):
    group_size = 2 if ws % 2 == 0 else 1
    cur, subgroups = dist.new_subgroups(group_size=group_size)
    members = list(range(rank - rank % group_size, rank - rank % group_size + group_size))
    errs = []
    if dist.get_process_group_ranks(cur) != members:
        errs.append(f"new_subgroups gave ranks {dist.get_process_group_ranks(cur)}, expected {members}")
    errs += _group_ops(cur, members, rank, f"new_subgroups({group_size})")
    for g in subgroups:
        dist.destroy_process_group(g)
    return errs


def _case_subgroups_by_enumeration(rank, ws):
    # Uneven split: even ranks vs odd ranks (sizes differ for odd world sizes).
    parts = [list(range(0, ws, 2)), list(range(1, ws, 2))]
    cur, subgroups = dist.new_subgroups_by_enumeration([p for p in parts if p])
    members = parts[rank % 2]
    errs = _group_ops(cur, members, rank, f"enumerated subgroup {members}")
    for g in subgroups:
        dist.destroy_process_group(g)
    return errs


ASYNC_SIZES = [0, 1, 7, 1001, 4099, 65537, 3, 250, 1 << 18, 17, 5, 999, 12345, 2, 64, 63, 65, 100003, 31, 8]


def _case_many_async(rank, ws):
    """20 async all_reduces of different sizes/dtypes/ops in flight, waited in reverse order."""
    kinds = [("float32", "SUM"), ("int64", "MAX"), ("bfloat16", "SUM"), ("int32", "PRODUCT"), ("float64", "MIN")]
    ops = []
    for k, n in enumerate(ASYNC_SIZES):
        dtype, op = kinds[k % len(kinds)]
        t = reduce_input(op, dtype, rank, n, salt=k)
        ops.append((k, n, dtype, op, t, dist.all_reduce(t, op=rop(op), async_op=True)))
    errs = []
    for k, n, dtype, op, t, w in reversed(ops):
        w.wait()
        errs.append(mismatch(t, reduce_expected(op, dtype, range(ws), n, salt=k), f"op {k} ({dtype} {op} n={n}): "))
    return [e for e in errs if e]


def _case_async_two_groups(rank, ws):
    """Async ops alternating between the default group and a second group, mixed kinds."""
    g = dist.new_group(list(range(ws)))
    work = []
    for k in range(10):
        n = 50 * k + 3
        grp = None if k % 2 else g
        t = reduce_input("SUM", "float32", rank, n, salt=300 + k)
        work.append(("all_reduce", k, n, t, dist.all_reduce(t, group=grp, async_op=True)))
        outs = [torch.empty(n, dtype=torch.int8) for _ in range(ws)]
        work.append(("all_gather", k, n, outs,
                     dist.all_gather(outs, payload("int8", rank, n, salt=k), group=grp, async_op=True)))
    errs = []
    order = work[1::2] + work[0::2]  # waits in a different order than issued
    for kind, k, n, res, w in order:
        w.wait()
        if kind == "all_reduce":
            errs.append(mismatch(res, reduce_expected("SUM", "float32", range(ws), n, 300 + k), f"all_reduce {k}: "))
        else:
            errs += [bytes_mismatch(res[r], payload("int8", r, n, salt=k), f"all_gather {k} from {r}: ")
                     for r in range(ws)]
    dist.destroy_process_group(g)
    return [e for e in errs if e]


def _assert_no_errors(results):
    failures = [f"rank {r}: {e}" for r, errs in enumerate(results) for e in errs]
    assert not failures, "\n".join(failures[:30])


ws_params = pytest.mark.parametrize("ws", DEFAULT_WORLDS, ids=lambda w: f"ws{w}")


@ws_params
def test_new_group_all_ranks(world_factory, ws):
    _assert_no_errors(world_factory(ws).run(_case_new_group_all))


@pytest.mark.parametrize("ws", [2, 3, 4], ids=lambda w: f"ws{w}")
def test_new_group_subset(world_factory, ws):
    _assert_no_errors(world_factory(ws).run(_case_new_group_subset))


@pytest.mark.parametrize("cross_order", [False, True], ids=["same_order", "rank_dependent_order"])
@ws_params
def test_same_members_interleaved(world_factory, ws, cross_order):
    _assert_no_errors(world_factory(ws).run(_case_same_members_interleaved, cross_order))


@ws_params
def test_new_subgroups(world_factory, ws):
    _assert_no_errors(world_factory(ws).run(_case_new_subgroups))


@ws_params
def test_new_subgroups_by_enumeration(world_factory, ws):
    _assert_no_errors(world_factory(ws).run(_case_subgroups_by_enumeration))


@pytest.mark.parametrize("ws,seg", WORLDS, ids=WORLD_IDS)
def test_many_async_reverse_wait(world_factory, ws, seg):
    _assert_no_errors(get_world(world_factory, ws, seg).run(_case_many_async))


@ws_params
def test_async_two_groups_interleaved(world_factory, ws):
    _assert_no_errors(world_factory(ws).run(_case_async_two_groups))
