"""Agreeing on which ranks are gone after a failure, for ``dist.shrink_group``."""
from __future__ import annotations

import atexit
import concurrent.futures
import json
import threading
import time
import weakref
from datetime import timedelta

import torch.distributed as dist

# Calls of lost_ranks per group: every member counts the same, so each round meets under its
# own store keys. Per group object, not per name: a re-created group reuses its name (the
# default group is "0" after every init_process_group) and its members count from 0 again,
# on the fresh store or prefix that init_process_group's own keys need anyway.
_ROUNDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class ExcludedError(RuntimeError):
    """This rank was excluded from its group by the others: it checked in after they decided
    it was lost, or they dropped it as the slow peer (DiLoCo's ``slow_peer="drop"``). It
    must leave the group, or join it again. ``operation``: the key of the operation whose
    check excluded it (DiLoCo: ``"round<N>"``), where known."""

    def __init__(self, message: str, operation: str | None = None):
        super().__init__(message)
        self.operation = operation


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
    decision is counted as lost and gets an :class:`ExcludedError` (it must leave).
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
    return decide(group, wait, key, settled, done)["lost"]


def decide(group=None, wait: float = 1.0, key: str | None = None, settled=None,
           done: str | None = None, ratios=None, behind: tuple[str, str] | None = None,
           heartbeat: "Heartbeat | None" = None) -> dict:
    """:func:`lost_ranks`'s decision: {"lost": ranks to drop, "slow": those of them dropped as
    the slow peer, "quiet": those dropped after one ``wait`` of silence on quiet links (below),
    "ratios": those reported (rank -> its links'), and this rank's side: "looks" (its
    check-ins), "learnt" (whether another rank's stored decision ended its looks)}. ``ratios``
    (with ``done``): a callable giving, for each of this rank's links, the rate at which it
    delivered the operation's bytes over its usual rate (None where unknown); every caller and
    every rank that marked the operation done reports its own, and a rank most of whose links,
    out or in, run at less than 1/``SLOW_FACTOR`` of their usual rate (:func:`slow_peer`) is
    dropped too. ``behind``: (the check of the operation before, that operation); ranks that
    checked in there, have not marked it done and are not here are alive and still on it (this
    rank completed it and moved on), not lost.
    ``heartbeat`` (this group's): a rank that still beats is alive (still computing: the
    decision waits for it, up to ``HEARTBEAT_PATIENCE`` times ``wait``); one whose beat has
    been still for the heartbeat's ``silent_after`` and ``wait`` more has had its wait, however
    late the check began, and so has one still for ``silent_after`` from which no TCP link of
    this rank or of a rank still beating has carried data for ``QUIET_DATA`` times ``wait``
    (:meth:`Heartbeat.quiet`: its beats are not queued behind its data). This rank, when
    dropped, gets an :class:`ExcludedError`."""
    pg, store = _group_store(group)
    rank, size = pg.rank(), pg.size()
    if key is None:
        _ROUNDS[pg] = _ROUNDS.get(pg, 0) + 1
        key = str(_ROUNDS[pg])
    prefix = _prefix(pg, key)
    decision_key = prefix + "decision"

    # Every store round trip counts (across a WAN, tens of milliseconds each): a caller checks
    # in by adding its bit to a mask, which then reads who is here in one round trip.
    if ratios is not None:  # reported before checking in: whoever decides finds it there
        _report_ratios(store, _prefix(pg, done), rank, ratios())
    probe = _probe_dead(pg)  # its round trip (the doors) alongside the check-in's
    watch = _DecisionWatch(store, decision_key, wait * HEARTBEAT_PATIENCE)
    # So is the look for ranks alive elsewhere, on clients of its own (None until made: then
    # the look takes the check's own client, between its check-ins), at the ranks not beating.
    checked = time.monotonic()
    look = _Look.start(pg, _suspects(heartbeat, pg), done, behind, checked)
    arrived = _checked_in(store, prefix, size, rank)
    start = looked = time.monotonic()
    decided, elsewhere, quiet, looks = False, set(), set(), 1
    while True:
        # Ranks this one knows dead (same host: the process; another host: refused at its
        # door) need no waiting for, nor ranks alive on another operation (elsewhere): once
        # every rank is here or accounted for, the decision is final. A rank that still beats
        # is given longer to come; one whose beat stopped, `wait` as any other (its beats
        # may only be stuck behind a congested link), counted from when its beat fell silent
        # (`still`: silent for that and `wait` more): a check opened later than that gives it
        # no longer than one opened as it fell silent. A decision stored meanwhile ends it.
        if watch.stored():
            decided = True
            break
        silence = heartbeat.silence(pg) if heartbeat is not None else {}
        beating = {r for r, s in silence.items() if s < heartbeat.silent_after}
        quiet = {r for r, s in silence.items() if heartbeat.silent_after <= s <
                 heartbeat.silent_after + wait and heartbeat.quiet(pg, r, QUIET_DATA * wait)}
        still = quiet | {r for r, s in silence.items() if s >= heartbeat.silent_after + wait}
        gone = set(probe.result()) - arrived
        away = set(range(size)) - arrived - gone - elsewhere
        if look is not None and look.done():
            elsewhere |= look.result() or set()
        elif look is None and away and time.monotonic() - looked >= _LOOK_ELSEWHERE:
            elsewhere |= _alive_elsewhere(store, pg, away, done, behind, watch.stored)
            looked = time.monotonic()
        away -= elsewhere
        patience = wait * HEARTBEAT_PATIENCE if away & beating else wait
        if not away - still or time.monotonic() - start >= patience:
            break
        decided = watch.decided()
        if decided or (settled is not None and settled()):
            break
        probe = _probe_dead(pg)  # the next look's, alongside the check-ins' round trip
        checked = time.monotonic()
        if look is not None and look.done() and away and checked - look.started >= _LOOK_ALONGSIDE:
            look = _Look.start(pg, away, done, behind, checked)
        arrived = _checked_in(store, prefix, size)
        looks += 1
    learnt = decided  # from the decision watch: another rank's decision ended the looks
    proposal = {"lost": [], "slow": [], "quiet": [], "ratios": {}}  # a stored decision stands
    if not (decided or (settled is not None and settled())):
        missing = set(range(size)) - arrived - elsewhere
        # The last look before proposing: the one that ran alongside the last check-in where it
        # asked about every rank missing (as fresh as a look now), else one now, on the look
        # clients where the group has them. Ended early by a decision stored meanwhile:
        # compare_set below returns that one.
        unsure = missing - gone
        if look is not None and not look.covers(unsure, checked):
            look = _Look.start(pg, unsure, done, behind, time.monotonic())
        found = look.result() if look is not None else None
        if found is None:
            found = _alive_elsewhere(store, pg, unsure, done, behind, watch.stored)
        missing -= found
        slow, reported = None, {}
        if ratios is not None and not missing:
            reported = _reported_ratios(store, _prefix(pg, done), size)
            slow = slow_peer(reported, size)
        proposal = {"lost": sorted(missing | {slow} - {None}),
                    "slow": [] if slow is None else [slow], "ratios": reported,
                    "quiet": sorted(missing & quiet)}
    # The first proposal stored wins; later callers get it back.
    decided = json.loads(store.compare_set(decision_key, "", json.dumps(proposal)))
    operation = done if done is not None else key
    if rank in decided["slow"]:
        raise ExcludedError(f"torch_ringdist: rank {rank}'s links delivered the operation's "
                            "bytes at a fraction of their usual rate: the other ranks dropped "
                            "it as the slow peer; it must leave or join again", operation)
    if rank in decided["lost"]:
        raise ExcludedError(f"torch_ringdist.lost_ranks: rank {rank} checked in after the other "
                            f"ranks decided that ranks {decided['lost']} are lost (more than "
                            f"{wait} s after them); this rank is excluded and must leave",
                            operation)
    for r in decided["slow"]:
        # Before this rank aborts the group: the dropped rank, which may have completed the
        # operation and moved on, learns why its next one fails (excluded()).
        store.set(_prefix(pg, "excluded") + str(r), operation)
    # This rank's side of it, for the records: its check-ins, and whether it learnt the
    # decision stored by another rank while it looked.
    return {**decided, "looks": looks, "learnt": learnt}


# Ranks per check-in mask: their bits sum within a store counter (int64).
_MASK_BITS = 63


class _DecisionWatch:
    """Whether a check's decision is stored, learnt without a store round trip per look: a
    thread waits for the key on a client of its own, and the store answers it as the key is
    set (a one-way trip after). Until that wait is in place (its client connects first), or
    where the store cannot clone its client, each look asks the store. The key is always set
    once the check ends (decide stores or reads the decision), which ends the wait."""

    def __init__(self, store, key: str, patience: float):
        self._store, self._key = store, key
        self._waiting = threading.Event()
        self._set = threading.Event()
        limit = timedelta(seconds=patience + _WATCH_SLACK_S)
        threading.Thread(target=self._run, args=(limit,), name="ringdist-decision-watch",
                         daemon=True).start()

    def _run(self, limit) -> None:
        try:
            client = self._store.clone()
            client.set_timeout(limit)
            self._waiting.set()
            client.wait([self._key])
            self._set.set()
        except Exception:  # noqa: BLE001 (no clone, store gone, or the wait ran out: ask)
            self._waiting.clear()

    def stored(self) -> bool:
        """Whether the wait saw the decision stored (no store round trip, no wait)."""
        return self._set.is_set()

    def decided(self) -> bool:
        """Whether the decision is stored, waiting up to _WATCH_LOOK_S for it (asking the
        store, then pausing that long, where no wait is in place)."""
        if self._set.is_set() or self._waiting.is_set():
            return self._set.wait(_WATCH_LOOK_S)
        if self._store.check([self._key]):
            return True
        time.sleep(_WATCH_LOOK_S)
        return False


# A decision watch waits this much longer than the check's longest patience (then its key is
# long set), and a look waits on it this long for a decision before looking around again.
_WATCH_SLACK_S = 30.0
_WATCH_LOOK_S = 0.002


# A rank that still beats is waited for this many times longer than `wait` before it counts as
# lost: it is alive, most likely still computing before its check-in.
HEARTBEAT_PATIENCE = 4
# A rank whose beat has been still for silent_after, and whose links carried no data to anyone
# still beating for QUIET_DATA times `wait`, has had its wait: a live rank's beats queue behind
# its data (a congested link), they do not stop while its data stops too; and they read as
# still for 0.4 s at most at RTT 100 ms (BEAT_INTERVAL), a retransmission timeout (0.3 s) below
# silent_after at lost_wait 1 s. A live sender's data pauses for a retransmission timeout too:
# QUIET_DATA is longer.
QUIET_DATA = 0.5
# Seconds between two beats of a rank, and between two reads of the others' beats (each a
# store round trip after the pause: at RTT 100 ms a live rank's beat reads as still for at most
# 0.4 s, two of its periods, before a retransmission or queueing delays one).
BEAT_INTERVAL = 0.1


_HEARTBEATS: "weakref.WeakSet" = weakref.WeakSet()
# A beat's store call gives up after this long: at exit, and behind a congested link, a call
# stuck on the store must not outlive the process's teardown.
_BEAT_TIMEOUT_S = 2.0


def _stop_heartbeats() -> None:
    """At exit, before Python finalizes: a beat thread inside a store call then would be
    killed there and abort the process."""
    beats = list(_HEARTBEATS)
    for beat in beats:
        beat.stop()
    for beat in beats:
        beat.join(_BEAT_TIMEOUT_S + BEAT_INTERVAL)


atexit.register(_stop_heartbeats)


class Heartbeat:
    """This rank's beat in its group's store every BEAT_INTERVAL seconds, and the other ranks'
    beats read at the same pace, on two daemon threads with a store client each (one round
    trip per beat, and one per read, side by side): a rank whose beat has not moved for
    ``silent_after`` seconds may be silent (a stopped process, a host cut off) although it may
    not have failed anything, or its beats stuck behind a congested link: reason to check who
    is alive, not proof. Each beat carries how long this rank's TCP links to each rank have
    carried no data from it (:meth:`quiet`): a live rank whose beats queue still sends data.
    ``group_of`` gives the group to beat in (it may change: a shrink, a re-formed default
    group) or raises once there is none; the threads end when ``alive`` returns False."""

    def __init__(self, group_of, silent_after: float, alive):
        self.silent_after = silent_after
        self._group_of, self._alive = group_of, alive
        self._lock = threading.Lock()
        self._watched = None  # the group whose beats _moved and _reports hold
        self._moved = {}  # rank -> (its count, time.monotonic() it was seen to change)
        self._reports = {}  # rank -> its links' quiet milliseconds by rank, as last read
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(step,), daemon=True,
                                          name=f"ringdist-heartbeat-{step.__name__[1:]}")
                         for step in (self._beat, self._read)]
        for thread in self._threads:
            thread.start()
        _HEARTBEATS.add(self)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def view(self, group) -> tuple[set, set]:
        """(silent, beating) ranks of ``group`` as last read; both empty for another group."""
        silence = self.silence(group)
        silent = {r for r, s in silence.items() if s >= self.silent_after}
        return silent, set(silence) - silent

    def silence(self, group) -> dict:
        """rank -> seconds since its beat was last seen to move, for the other ranks of
        ``group`` as last read; {} for another group."""
        pg = _group_store(group)[0]
        now = time.monotonic()
        with self._lock:
            if self._watched is not pg:
                return {}
            return {r: now - t for r, (_, t) in self._moved.items()}

    def quiet(self, group, rank: int, seconds: float) -> bool:
        """Whether no data from ``rank`` reached this rank, nor any rank of ``group`` that still
        beats, over their TCP links for ``seconds`` (each as it last reported, which only makes
        the answer later). False where any of them has no TCP link to it (shared memory)."""
        pg = _group_store(group)[0]
        own = _link_quiet_ms(pg)
        silence = self.silence(pg)
        with self._lock:
            if self._watched is not pg:
                return False
            views = [own] + [self._reports.get(r, []) for r, s in silence.items()
                             if r != rank and s < self.silent_after]
        return all(rank < len(v) and v[rank] >= 1000 * seconds for v in views)

    def _run(self, step) -> None:
        client = None  # this thread's store client and beat keys, for the group client["pg"]
        while self._alive() and not self._stop.is_set():
            try:
                pg = _group_store(self._group_of())[0]
                if client is None or client["pg"] is not pg:
                    client = self._connect(pg)
                step(pg, client)
            except Exception:  # noqa: BLE001 (no group now, or its store gone: beat later)
                pass
            self._stop.wait(BEAT_INTERVAL)

    @staticmethod
    def _connect(pg) -> dict:
        shared = _group_store(pg)[1]
        store = own_client(shared)
        if store is not shared:  # bounded here only: the shared client is the caller's
            store.set_timeout(timedelta(seconds=_BEAT_TIMEOUT_S))
        return {"pg": pg, "store": store, "ready": False, "count": 0,
                "keys": [_prefix(pg, "beat/") + str(r) for r in range(pg.size())]}

    @staticmethod
    def _beat(pg, client) -> None:
        """One beat: its count and this rank's links' quiet milliseconds (one round trip)."""
        client["count"] += 1
        quiet = ",".join(str(ms) for ms in _link_quiet_ms(pg))
        client["store"].set(client["keys"][pg.rank()], f"{client['count']} {quiet}")

    def _read(self, pg, client) -> None:
        """The others' beats (one round trip; two until every rank beat once: multi_get would
        wait for a missing key)."""
        store, keys = client["store"], client["keys"]
        client["ready"] = client["ready"] or store.check(keys)
        if not client["ready"]:
            return
        # A count that moved was set before the store served this read, so (one-way trips alike)
        # its rank beat no later than the read was sent: the time its beat is last seen moving.
        asked = time.monotonic()
        values = [v.decode() if isinstance(v, bytes) else v for v in store.multi_get(keys)]
        with self._lock:
            if self._watched is not pg:
                self._watched, self._moved, self._reports = pg, {}, {}
            for r, value in enumerate(values):
                if r == pg.rank():
                    continue
                count, _, quiet = value.partition(" ")
                if self._moved.get(r, (None,))[0] != count:
                    self._moved[r] = (count, asked)
                self._reports[r] = [int(ms) for ms in quiet.split(",") if ms]


def _link_quiet_ms(pg) -> list[int]:
    """Per rank of ``pg``: milliseconds since data from it last reached this rank over TCP, -1
    where unknown (not a ringdist group, shared memory)."""
    from torch_ringdist._collectives import ringdist_backend

    try:
        return list(ringdist_backend(pg)._link_quiet_ms())
    except (ValueError, RuntimeError):  # not ringdist, or the group is gone
        return [-1] * pg.size()


# Seconds between two looks, during a check, for the ranks alive on another operation: on the
# check's own client (between its check-ins), and on the look clients (alongside them: across a
# WAN one with every check-in, on a LAN no more than 20 a second).
_LOOK_ELSEWHERE = 0.25
_LOOK_ALONGSIDE = 0.05


def _alive_elsewhere(store, pg, ranks: set, done: str | None,
                     behind: tuple[str, str] | None, decided=None) -> set:
    """Those of ``ranks`` alive on another operation than the check's: they marked the
    operation ``done`` (completed it, then moved on), or checked in at ``behind``'s check of
    the operation before and have not marked that one done (they are still on it). Store round
    trips: one, one more for ``behind``, and a third where some checked in there.
    ``decided``: a callable; once it returns True the check is decided, and the look ends
    between two round trips with what it found."""
    alive = _marked_done(store, pg, done, ranks) if done is not None else set()
    if ranks - alive and not (decided is not None and decided()):
        alive |= _behind(store, pg, ranks - alive, behind, decided)
    return alive


def _behind(store, pg, ranks: set, behind: tuple[str, str] | None, decided=None) -> set:
    """Those of ``ranks`` that checked in at ``behind``'s check and have not marked its
    operation done: still on it (one store round trip, two where some checked in there)."""
    if behind is None or not ranks:
        return set()
    check, operation = behind
    still = _checked_in(store, _prefix(pg, check), pg.size()) & ranks
    # One that checked in there and then completed that operation has moved on: it is not
    # behind, and its absence here counts.
    if not still or (decided is not None and decided()):
        return set()
    return still - _marked_done(store, pg, operation, still)


def _suspects(heartbeat: "Heartbeat | None", pg) -> set:
    """The ranks of ``pg`` other than this one not seen beating (all others, without beats)."""
    others = set(range(pg.size())) - {pg.rank()}
    silence = heartbeat.silence(pg) if heartbeat is not None else {}
    return others - {r for r, s in silence.items() if s < heartbeat.silent_after}


class _Look:
    """A look for ranks alive elsewhere (_alive_elsewhere) on a group's look clients, its two
    parts side by side (one round trip, mostly), alongside a check's check-in: the operation's
    done marks on one client, the operation behind on the other."""

    def __init__(self, ranks: set, started: float, parts: list):
        self.ranks, self.started, self._parts = ranks, started, parts

    @classmethod
    def start(cls, pg, ranks: set, done: str | None, behind, started: float) -> "_Look | None":
        """The look begun at ``started`` (a time.monotonic()), or None where the group has no
        look clients made yet (ready_to_shrink makes them)."""
        with _LOOK_CLIENTS_LOCK:
            clients = _LOOK_CLIENTS.get(pg)
        if not clients:
            return None
        ranks = set(ranks)
        marked = (lambda: _marked_done(clients[0], pg, done, ranks)) if done is not None else set
        parts = [_LOOKS.submit(marked), _LOOKS.submit(_behind, clients[1], pg, ranks, behind)]
        return cls(ranks, started, parts)

    def done(self) -> bool:
        return all(part.done() for part in self._parts)

    def result(self) -> set | None:
        """The ranks found alive elsewhere (waiting for the parts); None where a part failed
        (then the check looks on its own client)."""
        found = set()
        for part in self._parts:
            try:
                found |= part.result()
            except Exception:  # noqa: BLE001 (a store error on a look client)
                return None
        return found & self.ranks

    def covers(self, ranks: set, since: float) -> bool:
        """Whether this look asked about every one of ``ranks`` and began at ``since`` or later."""
        return self.started >= since and ranks <= self.ranks


# Store clients per group for the looks alongside its checks (_Look): made on a thread by
# ready_to_shrink, kept while the group lives. Two, one per part of a look.
_LOOK_CLIENTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOOK_CLIENTS_LOCK = threading.Lock()
_LOOKS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="ringdist-look")


def _make_look_clients(pg, store) -> None:
    """Makes ``pg``'s look clients on a thread of its own, unless they are made or being made."""
    with _LOOK_CLIENTS_LOCK:
        if pg in _LOOK_CLIENTS:
            return
        _LOOK_CLIENTS[pg] = []  # being made

    def make():
        try:
            clients = [store.clone() for _ in range(2)]
        except Exception:  # noqa: BLE001 (cannot clone, or the store is gone: looks take turns)
            return
        with _LOOK_CLIENTS_LOCK:
            if pg in _LOOK_CLIENTS:
                _LOOK_CLIENTS[pg] = clients

    threading.Thread(target=make, name="ringdist-look-clients", daemon=True).start()


def _done_key(pg, operation: str) -> str:
    """The list of ranks that marked ``operation`` done, one per line."""
    return _prefix(pg, operation) + "done"


def _marked_done(store, pg, operation: str, ranks: set) -> set:
    """Those of ``ranks`` that marked ``operation`` done (mark_done): one round trip."""
    return {int(r) for r in _read_lines(store, _done_key(pg, operation))} & set(ranks)


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


def mark_done(group, key: str, ratios: list | None = None) -> None:
    """Records in ``group``'s store that this rank completed the operation ``key``: a
    :func:`lost_ranks` check with ``done=key`` counts it as alive without its answer, and
    takes ``ratios`` (:func:`decide`) as its report. The group is resolved here; the store
    round trips run on a daemon thread (off the caller's path, and a store gone at exit
    cannot hold the process)."""
    pg, store = _group_store(group)
    prefix, rank = _prefix(pg, key), pg.rank()

    def mark():
        if ratios is not None:
            _report_ratios(store, prefix, rank, ratios)
        store.append(_done_key(pg, key), f"{rank}\n")

    threading.Thread(target=mark, name="ringdist-mark-done", daemon=True).start()


def excluded(group) -> str | None:
    """The operation whose check dropped this rank of ``group`` as the slow peer
    (:func:`decide`), or None."""
    pg, store = _group_store(group)
    key = _prefix(pg, "excluded") + str(pg.rank())
    if not store.check([key]):
        return None
    value = store.get(key)
    return value.decode() if isinstance(value, bytes) else value


# A link is slow when it delivers at less than 1/SLOW_FACTOR of its own usual rate, and a rank
# is the slow peer when most of the links it sends on, or most of the links to it, are. A link
# at a tenth of its rate measured at 0.04-0.22 of its usual rate on a round of a few hundred
# KB per link at 100 ms (the round trips weigh as much as the bytes), the other links at the
# same check at 0.33-0.94 (the slow host holds their round back too; once 0.329, under the
# line: a rank needs most of its links slow, and the one with the most goes first).
SLOW_FACTOR = 3.0


def slow_peer(ratios: dict, size: int) -> int | None:
    """The rank of a group of ``size`` that the ratios reported (``ratios[r][q]``: the rate of
    the link from r to q in this operation over its usual rate; None where not known; the
    ranks that reported) name as the slow peer, or None. Needs three ranks or more: between
    two, either end of the link could be the slow one. Of several, the one with the most slow
    links, then the slowest."""
    if size < 3:
        return None

    def ratio(r, q):
        return ratios[r][q] if r in ratios and q < len(ratios[r]) else None

    worst, worst_key = None, None
    for p in range(size):
        others = [r for r in range(size) if r != p]
        for links in ([ratio(p, q) for q in others], [ratio(r, p) for r in others]):
            slow = sorted(v for v in links if v is not None and v < 1.0 / SLOW_FACTOR)
            if 2 * len(slow) > len(others):
                key = (len(slow), -slow[len(slow) // 2])
                if worst_key is None or key > worst_key:
                    worst, worst_key = p, key
    return worst


def _report_ratios(store, prefix: str, rank: int, ratios: list) -> None:
    """Appends this rank's links' ratios to the operation's reports (one round trip)."""
    store.append(prefix + "ratios", json.dumps({"rank": rank, "ratios": ratios}) + "\n")


def _read_lines(store, key: str) -> list[str]:
    """The lines appended to ``key`` (one round trip): none where nobody appended, the key then
    created empty (a get would wait for it)."""
    text = store.compare_set(key, "", "")
    text = text.decode() if isinstance(text, bytes) else text
    return [line for line in text.splitlines() if line]


def _reported_ratios(store, prefix: str, size: int) -> dict:
    """rank -> its links' reported ratios, for the ranks that reported (one round trip)."""
    reports = [json.loads(line) for line in _read_lines(store, prefix + "ratios")]
    return {r["rank"]: r["ratios"] for r in reports if 0 <= r["rank"] < size}


def ready_to_shrink(group, keep_links: bool = False) -> None:
    """Readies what the next ``dist.shrink_group`` of ``group`` needs, off the caller's path: a
    client of its store (_registration.keep_spare_client), and for the checks of who is alive
    (decide) the group's look clients. ``keep_links``: an error then leaves this rank's sealed
    TCP links open, so the shrink after it keeps them warm (a fresh connection across a WAN
    starts slowly), where it would close them all; only for callers whose ranks learn of a
    failure from a check of who is alive (:func:`check_open`), as a peer waiting on this rank
    no longer fails at once."""
    from torch_ringdist._collectives import ringdist_backend
    from torch_ringdist._registration import keep_spare_client

    pg, store = _group_store(group)
    keep_spare_client(store)
    _make_look_clients(pg, store)
    if keep_links:
        try:
            ringdist_backend(pg)._keep_links_on_error()
        except ValueError:  # not a ringdist group: its error closes what it closes
            pass


def own_client(store):
    """A client of ``store`` for the calling thread alone (``store.clone()``, or one made ahead
    by keep_spare_client): a TCPStore client serves one call at a time, so a thread that waits
    on the store holds back every other call on a shared one. The store itself where it cannot
    clone its client."""
    from torch_ringdist._registration import take_spare_client

    spare = take_spare_client(store)
    if spare is not None:
        return spare
    try:
        return store.clone()
    except (AttributeError, RuntimeError):
        return store


def _group_store(group):
    """The group (None: the default one) and the store it was created with."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg, dist.distributed_c10d._world.pg_map[pg][1]


def _prefix(pg, key: str) -> str:
    return f"ringdist/lost/{dist.distributed_c10d._get_process_group_name(pg)}/{key}/"


_PROBES = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="ringdist-probe")


def _probe_dead(pg) -> "concurrent.futures.Future":
    """_known_dead(pg), on a thread: its answer in a round trip's time, while the caller's
    store round trips run."""
    return _PROBES.submit(_known_dead, pg)


def _known_dead(pg) -> list[int]:
    """Ranks of ``pg`` whose process this rank knows to be gone (ringdist groups; same host)."""
    from torch_ringdist._collectives import ringdist_backend

    try:
        return ringdist_backend(pg)._dead_peers()
    except ValueError:  # not a ringdist group: nothing known
        return []

