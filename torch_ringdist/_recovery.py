"""Agreeing on which ranks are gone after a failure, for ``dist.shrink_group``."""
from __future__ import annotations

import json
import threading
import time
import weakref

import torch.distributed as dist

# Calls of lost_ranks per group: every member counts the same, so each round meets under its
# own store keys. Per group object, not per name: a re-created group reuses its name (the
# default group is "0" after every init_process_group) and its members count from 0 again,
# on the fresh store or prefix that init_process_group's own keys need anyway.
_ROUNDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def lost_ranks(group=None, wait: float = 1.0, key: str | None = None, settled=None,
               done: str | None = None) -> list[int]:
    """The ranks of ``group`` that are gone, as agreed by the ranks that call this.

    Call it on every surviving rank after an operation of the group failed (a
    peer died or was cut off: ringdist then fails the operation on every rank),
    then ``dist.shrink_group(lost)``. Every caller checks in through the group's
    store and looks which ranks it knows to be gone: on its host, by their
    process; on another host, a rank whose host refuses a connect at the
    listener the rank keeps open (its process is gone, its host is up). Once
    every rank has checked in or is known gone, the decision is made at once;
    otherwise ``wait`` seconds after a caller's arrival (a host cut off, a
    stopped process). The first rank to decide records the ranks that have not
    checked in, and every caller returns that same list (``[]`` when all did).
    ``wait`` must exceed the time a live rank may take to notice the failure
    (the compute between two of its collectives): a rank that arrives after the
    decision is counted as lost and gets a RuntimeError (it must leave).
    The store must survive the failure (torchrun's agent, or a launcher's store).

    ``key`` names the check (the same on every rank; default: the group's calls counted).
    ``settled``: a callable; once it returns True (the operation that prompted the check
    completed after all), the caller decides that no rank is lost. ``done``: ranks that
    marked the operation ``done`` (:func:`mark_done`) completed it, so they are alive: they
    count as checked in.

    Example::

        >>> try:
        ...     train_step()
        ... except dist.DistBackendError:
        ...     dist.shrink_group(torch_ringdist.lost_ranks(wait=0.5))
    """
    pg, store = _group_store(group)
    rank, size = pg.rank(), pg.size()
    if key is None:
        _ROUNDS[pg] = _ROUNDS.get(pg, 0) + 1
        key = str(_ROUNDS[pg])
    prefix = _prefix(pg, key)
    decision_key = prefix + "decision"

    # Every store round trip counts (across a WAN, tens of milliseconds each): a caller checks
    # in by adding its bit to a mask, which then reads who is here in one round trip.
    arrived = _checked_in(store, prefix, size, rank)
    deadline = time.monotonic() + wait
    decided = False
    while True:
        # Ranks this one knows dead (same host: the process; another host: refused at its
        # door) need no waiting for: once every rank has checked in or is known dead, the
        # decision is final.
        gone = set(_known_dead(pg)) - arrived
        if len(arrived) + len(gone) >= size or time.monotonic() >= deadline:
            break
        decided = store.check([decision_key])
        if decided or (settled is not None and settled()):
            break
        time.sleep(0.002)
        arrived = _checked_in(store, prefix, size)
    if decided or (settled is not None and settled()):
        proposal = []  # ignored when a decision exists: the first one stored stands
    else:
        missing = set(range(size)) - arrived
        if done is not None:  # alive after all: completed the operation, then moved on
            marked = _prefix(pg, done) + "done/"
            missing -= {r for r in missing - gone if store.check([marked + str(r)])}
        proposal = sorted(missing)
    # The first proposal stored wins; later callers get it back.
    decided = json.loads(store.compare_set(decision_key, "", json.dumps(proposal)))
    if rank in decided:
        raise RuntimeError(f"torch_ringdist.lost_ranks: rank {rank} checked in after the other "
                           f"ranks decided that ranks {decided} are lost (more than {wait} s after "
                           "them); this rank is excluded and must leave")
    return decided


# Ranks per check-in mask: their bits sum within a store counter (int64).
_MASK_BITS = 63


def _checked_in(store, prefix: str, size: int, rank: int | None = None) -> set:
    """The ranks checked in under ``prefix``, after checking ``rank`` in (when given): one
    store round trip per 63 ranks, each caller adding its bit once."""
    here = set()
    for block in _blocks(size):
        mine = rank is not None and rank // _MASK_BITS == block
        mask = store.add(prefix + f"here/{block}", 1 << (rank % _MASK_BITS) if mine else 0)
        here |= {block * _MASK_BITS + b for b in range(_MASK_BITS) if mask >> b & 1}
    return here


def _blocks(size: int) -> range:
    """The check-in masks of a group of ``size`` ranks."""
    return range((size + _MASK_BITS - 1) // _MASK_BITS)


def check_open(group, key: str) -> bool:
    """Whether another rank of ``group`` has begun the :func:`lost_ranks` check ``key`` (its
    operation timed out): this rank must then take part in it too, or be counted as lost."""
    pg, store = _group_store(group)
    return any(store.check([_prefix(pg, key) + f"here/{block}"]) for block in _blocks(pg.size()))


def mark_done(group, key: str) -> None:
    """Records in ``group``'s store that this rank completed the operation ``key``: a
    :func:`lost_ranks` check with ``done=key`` counts it as alive without its answer. The
    group is resolved here; the store round trip runs on a daemon thread (off the caller's
    path, and a store gone at exit cannot hold the process)."""
    pg, store = _group_store(group)
    threading.Thread(target=store.set, args=(_prefix(pg, key) + f"done/{pg.rank()}", b"1"),
                     name="ringdist-mark-done", daemon=True).start()


def _group_store(group):
    """The group (None: the default one) and the store it was created with."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg, dist.distributed_c10d._world.pg_map[pg][1]


def _prefix(pg, key: str) -> str:
    return f"ringdist/lost/{dist.distributed_c10d._get_process_group_name(pg)}/{key}/"


def _known_dead(pg) -> list[int]:
    """Ranks of ``pg`` whose process this rank knows to be gone (ringdist groups; same host)."""
    from torch_ringdist._collectives import ringdist_backend

    try:
        return ringdist_backend(pg)._dead_peers()
    except ValueError:  # not a ringdist group: nothing known
        return []

