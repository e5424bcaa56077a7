"""DiLoCo on a plain module, without DDP: :class:`DiLoCoOptimizer` wraps the inner optimizer and
runs the rounds of :class:`~torch_ringdist.hooks.diloco.DiLoCoState` from its ``step()``; with a
``store`` it admits processes that join the running job (:meth:`DiLoCoOptimizer.join`).

Not a DDP hook: the round's arithmetic, its schedule and the recovery after a lost rank are
the state's (``hooks/diloco.py``); this module holds only what the optimizer adds: averaging
the gradients before ``start_step`` without DDP, the first rank's parameters on every rank at a
fresh start, checkpoints of both optimizers, and joining.
"""

import concurrent.futures
import json
import logging
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_ringdist._collectives import ringdist_backend
from torch_ringdist._recovery import ExcludedError, own_client
from torch_ringdist._registration import adopting, connect_ahead, keep_spare_client
from torch_ringdist.hooks.compress import compressed_bucket
from torch_ringdist.hooks.diloco import DiLoCoState, _gather, _new_flat, _scatter, _sent_since

logger = logging.getLogger(__name__)

_JOIN = "ringdist/diloco/join/"
# What a joiner takes from rank 0 besides the options and tensors.
_SHARED_COUNTERS = ("iteration", "averaged_at", "rounds", "shrinks", "admitted", "generation")


def _generation_store(store, generation: int):
    """The store prefix of generation ``generation`` of the job's default group."""
    return dist.PrefixStore(f"{_JOIN}generation/{generation}/", store)


def _connect_generation(store, generation: int, rank: int, world_size: int, timeout: float):
    """Starts connecting this rank's backend of generation ``generation`` (every rank of it
    calls this): a future backend for _form_generation. Over a client of the store of its own:
    a TCPStore client serves one call at a time, and the caller's waits (a joiner's for the
    period's end) must not hold the connect's back."""
    backend_store = dist.PrefixStore("backend/", _generation_store(own_client(store), generation))
    return connect_ahead(backend_store, rank, world_size, timedelta(seconds=timeout))


def _form_generation(store, invite: dict, connecting, timeout: float) -> None:
    """Leaves the current default group (if any) and makes the backend ``connecting``
    (_connect_generation) the default group: generation ``invite["generation"]`` of the job,
    as ``invite["rank"]`` of ``invite["world_size"]``."""
    if dist.is_initialized():
        # At a period's end every rank finished the same operations: no goodbye to wait for.
        ringdist_backend(None, "torch_ringdist.hooks.DiLoCoOptimizer")._close_without_waiting()
        dist.destroy_process_group()
    with adopting(connecting):
        dist.init_process_group("ringdist", store=_generation_store(store, invite["generation"]),
                                rank=invite["rank"], world_size=invite["world_size"],
                                timeout=timedelta(seconds=timeout))


def _discard(connecting) -> None:
    """Closes a backend connected ahead that no group will take, once its connect ends."""
    def close(future):
        if future.exception() is None:
            future.result()._close_without_waiting()

    connecting.add_done_callback(close)


def _round_of(operation: str | None) -> int | None:
    """The round (numbered from 1, as state.rounds counts them once done) a DiLoCo check's
    operation key "roundN" names: the exchange that N rounds preceded."""
    if operation is None or not operation.startswith("round"):
        return None
    return int(operation[len("round"):].split(".")[0]) + 1


def _confirm_held(members: int) -> None:
    """After the state's transfer: each joiner (the ranks from `members` on) tells every member
    that it holds the state, and the members wait for every joiner's word. A send completes once
    the kernel holds its bytes, so without it the members would train on while a joiner still
    receives, and the next round would wait for that joiner. One one-way trip, where a barrier
    takes one per doubling of the group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank >= members:
        works = [dist.isend(torch.ones(1, dtype=torch.uint8), dst=m, tag=_HELD_TAG)
                 for m in range(members)]
    else:
        works = [dist.irecv(torch.empty(1, dtype=torch.uint8), src=j, tag=_HELD_TAG)
                 for j in range(members, world)]
    for work in works:
        work.wait()


def _serving_member(joiner: int, members: int) -> int:
    """The member that sends joiner rank ``joiner`` the state: in turn across the joiners, so
    several joiners load several members' links."""
    return (joiner - members) % members


# Tags of the point-to-point transfers of a join: the state sent ahead, the round's average, a
# joiner's word that it holds the state.
_AHEAD_TAG, _AVERAGE_TAG, _HELD_TAG = 1, 2, 3


class _Ahead:
    """theta_global and the outer momentum as they were at the start of the admitting period,
    sent (a member) or received (a joiner) over the next generation's backend as soon as it
    is connected, while the period trains; the joiner then needs only the period's round's
    average to take the outer step every member takes. Posted once: from the connect's
    thread when it completes, or by the admission, whichever comes first."""

    def __init__(self, tensors: list, peers: list, send: bool):
        self.tensors, self.peers, self.send = tensors, peers, send
        self._works = None
        self._lock = threading.Lock()

    def post(self, backend) -> list:
        with self._lock:
            if self._works is None:
                op = backend.send if self.send else backend.recv
                self._works = [op([t], peer, _AHEAD_TAG) for peer in self.peers
                               for t in self.tensors]
            return self._works

    def post_when_connected(self, connecting) -> None:
        connecting.add_done_callback(
            lambda future: future.exception() is None and self.post(future.result()))


class _Admission:
    """What a period's start agreed on (DiLoCoOptimizer._count_joiners)."""

    def __init__(self, joiners: int, shrinks: int):
        self.joiners = joiners
        self.shrinks = shrinks  # the group's shrinks then: another one leaves the joiners out
        self.connecting = None  # the next generation's backend, connecting
        self.ahead = None  # an _Ahead, when the state is sent ahead


class DiLoCoOptimizer:
    """DiLoCo on a plain module, without DDP (no gradient buckets, no hook): wraps the inner
    optimizer, and ``step()`` runs the inner step and then, when due, the round of
    :class:`DiLoCoState` (same options, same arithmetic). The training loop stays
    ``opt.zero_grad(); loss.backward(); opt.step()``.

    A fresh run (no ``state``) starts every rank from the parameters of the group's first rank,
    as DDP's constructor does. Before ``start_step`` each step first averages the gradients
    over the group (plain, or in ``codec``). ``state_dict()`` holds the inner optimizer's state
    and the DiLoCo state (pickled by ``torch.save``); ``load_state_dict`` resumes both.

    Joining (``store``): a process started later, or restarted, joins the running job with
    :meth:`join`. At the start of every period the ranks agree through the store on the join
    requests made until then; when there are some, the joiners are invited and every rank
    connects the group's next generation, with the joiners as its last ranks (over a fresh
    prefix of the store), while the period trains; right after the period's round it replaces
    the default group (``destroy_process_group``, and ``init_process_group`` takes the
    connected backend). The joiners get the options and counters through the store, and from
    one of the other ranks theta_global and the outer momentum (``send_ahead``: as they were
    at the period's start, sent while the period trains, and after the round the round's
    average, from which they take the outer step the members took); they start from
    theta_global with zero residuals and a fresh inner optimizer. Re-split the data over
    ``dist.get_world_size()`` after it. A rank lost in that period leaves the joiners out: they
    ask again. Needs the default group and ``overlap="none"``; the store must outlive every
    rank (a launcher's or torchrun's), and joiners reach it by address. A rank the others
    excluded (dropped as the slow peer with ``slow_peer="drop"``, or counted as lost for
    answering too late) leaves the group in the ``step()`` that finds out and joins again the
    same way ``rejoin_after`` seconds later; that ``step()`` returns with ``state.iteration``
    the job's step count.

    Args:
        module: the model (its parameters that require gradients take part).
        optimizer: the inner optimizer over them (e.g. AdamW).
        process_group: group (None: the default group).
        state: a :class:`DiLoCoState` to resume (then no options).
        store: a ``dist.Store`` every rank and joiner reaches: admits joiners (above).
        join_timeout: seconds the re-formed group's creation may take.
        rejoin_after: with a store, seconds an excluded rank waits before it asks to join
            again (default 30): its state comes over its own link, and the members wait for it
            at the admission, so asking while the link is still slow costs them what dropping
            it saved.
        send_ahead: send each joiner theta_global and the momentum of the period's start
            while the period trains, and after the round only the round's average (one
            fragment, not plain averaging; every rank the same). It pays where the period
            lasts longer than the state takes on a joiner's link; on a shorter one the state
            is still on its way at the period's end, and the average follows it.
        **options: :class:`DiLoCoState`'s options.

    Example::

        >>> opt = torch_ringdist.hooks.DiLoCoOptimizer(model, torch.optim.AdamW(model.parameters()),
        ...                                            period=50, codec="int8")
    """

    def __init__(self, module, optimizer, process_group=None, state=None, store=None,
                 join_timeout: float = 60.0, send_ahead: bool = False, rejoin_after: float = 30.0,
                 **options):
        what = "torch_ringdist.hooks.DiLoCoOptimizer"
        if state is not None and options:
            raise ValueError(f"{what}: pass either a state or options")
        self.module = module
        self.optimizer = optimizer
        self.process_group = process_group
        self.store = store
        self.join_timeout = join_timeout
        self._joining = None  # with a store: the join requests this period's end answers
        self.send_ahead = send_ahead
        self.rejoin_after = float(rejoin_after)
        # Each time the others excluded this rank and it joined again: {"iteration" it was
        # excluded at, "round": the round (numbered as state.rounds counts) whose check
        # excluded it: its own results from that round on were not the job's (None where
        # unknown), "rejoined_at" (the job's iteration), "seconds" away}.
        self.rejoins = []
        # Each admission here: {"joiners", "world_size" after it, "seconds" it took, its phases
        # "form_s" (the new group) and "state_s" (theta_global and momentum to joiners), what
        # each link carried meanwhile ("state_links") and "ahead" (whether this rank sent the
        # state ahead)}.
        self.admissions = []
        if state is None:
            state = DiLoCoState(process_group=process_group, **options)
            self._broadcast_parameters()
        if store is not None and (process_group is not None or state.overlap != "none"):
            raise ValueError(f"{what}: joining (store=) needs the default group and "
                             f"overlap='none', got process_group={process_group!r}, "
                             f"overlap={state.overlap!r}")
        state.process_group = process_group
        self.state = state
        state.bind_module(module)

    @classmethod
    def join(cls, module, optimizer, store, timeout: float = 300.0, join_timeout: float = 60.0):
        """Joins a running job whose DiLoCoOptimizer has this ``store``: asks to be admitted,
        waits (up to ``timeout`` seconds) for the end of the period after its request was
        counted (the next period's start), joins the re-formed default group
        (``init_process_group``; none may be initialised here) and receives the job's options,
        counters, theta_global and outer momentum. Returns the optimizer; ``state.iteration``
        is the job's step count.

        Example::

            >>> opt = DiLoCoOptimizer.join(model, torch.optim.AdamW(model.parameters()), store)
            >>> for step in range(opt.state.iteration, total): ...
        """
        what = "torch_ringdist.hooks.DiLoCoOptimizer.join"
        deadline = time.monotonic() + timeout
        while True:  # a request left out (the group shrank in that period) asks again
            keep_spare_client(store)  # for the connect, made while the request waits
            ticket = store.add(_JOIN + "requests", 1) - 1
            key = _JOIN + f"invite/{ticket}"
            try:
                store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except Exception as exc:  # noqa: BLE001 (the store's timeout error, re-raised)
                raise RuntimeError(f"{what}: join request {ticket} not admitted within "
                                   f"{timeout} s (is the job running with store=?): {exc}") from exc
            invite = json.loads(store.get(key))
            generation = invite["generation"]
            state = DiLoCoState(**invite["options"])
            opt = cls(module, optimizer, state=state, store=store, join_timeout=join_timeout,
                      send_ahead=invite["send_ahead"],  # as every member, once admitted
                      rejoin_after=invite.get("rejoin_after", 30.0))
            connecting = _connect_generation(store, generation, invite["rank"],
                                             invite["world_size"], join_timeout)
            ahead = opt._receive_ahead(invite, connecting)
            # The members write the counters once the period's round ended.
            header_key = _JOIN + f"header/{generation}"
            try:
                store.wait([header_key], timedelta(seconds=max(deadline - time.monotonic(),
                                                               0.001)))
            except Exception as exc:  # noqa: BLE001
                _discard(connecting)
                raise RuntimeError(f"{what}: invited into generation {generation}, but its "
                                   f"period did not end within {timeout} s of the request: "
                                   f"{exc}") from exc
            header = json.loads(store.get(header_key))
            if not header.get("left_out"):
                break
            _discard(connecting)
            logger.warning("%s: request %s was left out (the group shrank in that period); "
                           "asking again", what, ticket)
        _form_generation(store, invite, connecting, join_timeout)
        for k, v in header["counters"].items():
            setattr(state, k, v)
        opt._share_state(invite["members"], header, ahead)
        return opt

    @torch.no_grad()
    def _receive_ahead(self, invite: dict, connecting):
        """A joiner invited with the state sent ahead: its buffers (theta_global, the momentum
        of the fragments that have one), received from its member once connected."""
        state = self.state
        if not invite["ahead"]:
            return None
        state._set_anchor()  # allocated here, received ahead
        tensors = [state.anchor[0]]
        for f in invite["momentum"]:
            tensors.append(state.momentum_buffers.setdefault(f, torch.zeros_like(tensors[0])))
        members = invite["members"]
        ahead = _Ahead(tensors, [_serving_member(invite["rank"], members)], send=False)
        ahead.post_when_connected(connecting)
        return ahead

    def _count_joiners(self) -> "concurrent.futures.Future":
        """At a period's start: starts agreeing on how many join requests the period's end
        admits: one answer for every rank, through the store (the first rank's count), not a
        collective: a peer that went silent must not hang the others here; the round's exchange
        drops it (exchange_timeout). With some, the first rank invites the joiners, every rank
        starts connecting the group's next generation, and each member that serves a joiner
        sends it the state as it is now once connected (_Ahead). All on a thread of its own, so
        its store and network round trips overlap the period's training; requests made later
        wait for the next period. The future: an _Admission."""
        state = self.state
        key = f"{_JOIN}count/{state.generation}/{state.iteration}"
        rank, world, generation = dist.get_rank(), dist.get_world_size(), state.generation + 1
        admitted = state.admitted
        admission = _Admission(0, state.shrinks)
        ahead = self._can_send_ahead()
        future = concurrent.futures.Future()
        keep_spare_client(self.store)  # for a connect: this period's, if ready by then, or the next

        def count():
            try:
                seen = str(self.store.add(_JOIN + "requests", 0))
                joiners = int(self.store.compare_set(key, "", seen)) - admitted
                if joiners > 0:
                    admission.joiners = joiners
                    if rank == 0:
                        invite = {"generation": generation, "world_size": world + joiners,
                                  "members": world, "ahead": ahead,
                                  "send_ahead": self.send_ahead,
                                  "rejoin_after": self.rejoin_after,
                                  "options": {k: getattr(state, k) for k in state._options},
                                  "momentum": sorted(state.momentum_buffers)}
                        for i in range(joiners):
                            self.store.set(_JOIN + f"invite/{admitted + i}",
                                           json.dumps({**invite, "rank": world + i}))
                    admission.connecting = _connect_generation(self.store, generation, rank,
                                                               world + joiners, self.join_timeout)
                    served = [j for j in range(world, world + joiners)
                              if _serving_member(j, world) == rank]
                    if ahead and served:
                        admission.ahead = _Ahead(self._snapshot(), served, send=True)
                        admission.ahead.post_when_connected(admission.connecting)
                future.set_result(admission)
            except Exception as exc:  # noqa: BLE001 (raised on the training thread, in result())
                future.set_exception(exc)

        threading.Thread(target=count, name="ringdist-join-count", daemon=True).start()
        return future

    def _can_send_ahead(self) -> bool:
        """Whether a joiner can finish from the state sent ahead with the round's average alone
        (one fragment, an anchor, not plain averaging), and send_ahead asks for it."""
        state = self.state
        return self.send_ahead and state.anchor is not None and state.fragments == 1 and \
            not state._plain_average()

    @torch.no_grad()
    def _snapshot(self) -> list:
        """Copies of theta_global and the outer momentum as they are, to send ahead."""
        state = self.state
        return [state.anchor[0].clone()] + [state.momentum_buffers[f].clone()
                                            for f in sorted(state.momentum_buffers)]

    def _admit_joiners(self, admission: _Admission) -> None:
        """At the end of a period: when join requests were counted at its start, makes the
        generation connected since the default group (the joiners its last ranks) and shares
        the state with them. When the round shrank the group instead, the joiners invited are
        left out (their invites name ranks that changed): told so through the store, they ask
        again."""
        state = self.state
        kept, state.kept_averages = state.kept_averages, None
        if admission.joiners <= 0:
            return
        # These requests are answered, admitted or left out, and the generation is used.
        state.admitted += admission.joiners
        generation = state.generation = state.generation + 1
        if state.shrinks != admission.shrinks:  # the joiners' invites name ranks that changed
            _discard(admission.connecting)
            self.store.compare_set(_JOIN + f"header/{generation}", "",
                                   json.dumps({"left_out": True}))
            logger.warning("diloco: the group shrank in the period that was to admit %s "
                           "joiner(s); they are left out and ask again", admission.joiners)
            return
        start = time.monotonic()
        rank, world = dist.get_rank(), dist.get_world_size()
        if rank == 0:
            # The counters travel through the store (JSON: the store is not trusted with
            # pickles), so the new group carries only the tensors.
            header = {"counters": {k: getattr(state, k) for k in _SHARED_COUNTERS},
                      "anchor": state.anchor is not None,
                      "momentum": sorted(state.momentum_buffers)}
            self.store.set(_JOIN + f"header/{generation}", json.dumps(header))
        _form_generation(self.store, {"generation": generation, "rank": rank,
                                      "world_size": world + admission.joiners},
                         admission.connecting, self.join_timeout)
        formed = time.monotonic()
        state.process_group = self.process_group = None
        sends = state._link_sends()  # the new default group's
        self._share_state(world, None, admission.ahead, kept)
        seconds = time.monotonic() - start
        links = _sent_since(sends, state._link_sends())
        self.admissions.append({"joiners": admission.joiners, "world_size": dist.get_world_size(),
                                "seconds": seconds, "form_s": formed - start,
                                "state_s": start + seconds - formed, "state_links": links,
                                "ahead": admission.ahead is not None})
        logger.warning("diloco: admitted %s joiner(s); the group has %s ranks (%.0f ms%s)",
                       admission.joiners, dist.get_world_size(), seconds * 1000,
                       ", the state sent ahead" if admission.ahead is not None else "")

    @torch.no_grad()
    def _share_state(self, members: int, header: dict | None, ahead: _Ahead | None,
                     kept: dict | None = None) -> None:
        """theta_global and the outer momentum from the group's first `members` ranks (which
        hold the same) to the joiners (the ranks after them), each joiner's from one member
        (_serving_member): new connections from several members into one joiner's link start
        up against each other, which took longer than one. Sent ahead (`ahead`): the state of
        the period's start is on its way, and the round's average (`kept`, a member's) follows
        it; the joiner takes the outer step the members took. Else the state itself. Joiners
        (`header`: what the members wrote after the round) start from theta_global."""
        state = self.state
        rank = dist.get_rank()
        joining = rank >= members
        if ahead is not None:
            works = list(ahead.post(ringdist_backend(None, "torch_ringdist.hooks.DiLoCoOptimizer")))
            if joining:
                average = state._work_buffer(0).resize_as_(state.anchor[0])
                works.append(dist.irecv(average, src=_serving_member(rank, members),
                                        tag=_AVERAGE_TAG))
            else:
                works.extend(dist.isend(kept[0], dst=j, tag=_AVERAGE_TAG) for j in ahead.peers)
            for work in works:
                work.wait()
            if joining:
                state._outer_step(0, state._fragment_tensors(0), average)
        else:
            self._send_state(members, header)
        _confirm_held(members)

    def _send_state(self, members: int, header: dict | None) -> None:
        """The state itself, after the round (see _share_state)."""
        state = self.state
        rank, world = dist.get_rank(), dist.get_world_size()
        joining = rank >= members
        if joining and state.anchor is None and header["anchor"]:
            state._set_anchor()  # allocated here, received below
        momentum = header["momentum"] if joining else sorted(state.momentum_buffers)
        works, received = [], []
        for f in range(state.fragments):
            tensors = state._fragment_tensors(f)
            if state.anchor is not None:
                theta = state.anchor[f]
            elif joining:  # plain averaging: the parameters are the average
                theta = state._work_buffer(f).resize_(sum(t.numel() for t in tensors))
            else:
                theta = _gather(tensors, state._work_buffer(f))
            buffers = [theta]
            if f in momentum:
                buf = state.momentum_buffers.get(f)
                if buf is None:
                    buf = state.momentum_buffers[f] = torch.zeros_like(theta)
                buffers.append(buf)
            for buf in buffers:
                if joining:
                    works.append(dist.irecv(buf, src=_serving_member(rank, members)))
                else:
                    works.extend(dist.isend(buf, dst=j) for j in range(members, world)
                                 if _serving_member(j, members) == rank)
            if joining:
                received.append((theta, tensors))
        for work in works:
            work.wait()
        for theta, tensors in received:
            _scatter(theta, tensors)

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return
        group = self.process_group
        source = dist.get_global_rank(group, 0) if group is not None else 0
        flat = _gather(params, _new_flat(torch.float64))
        dist.broadcast(flat, src=source, group=group)
        _scatter(flat, params)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        state = self.state
        if state.iteration < state.start_step:
            self._average_gradients()
        if self.store is not None and self._joining is None:
            self._joining = self._count_joiners()  # requests made until now join at period end
        loss = self.optimizer.step(closure)
        state.iteration += 1
        local = state.iteration - state.start_step
        admission = None
        if self._joining is not None and local > 0 and local % state.period == 0:
            admission = self._joining.result(timeout=self.join_timeout)  # its snapshot taken
            if admission.ahead is not None:
                state.kept_averages = {}  # the joiners take the round's average
        try:
            state.after_step()
        except ExcludedError as exc:
            if self.store is None:
                raise
            self._rejoin(exc)
            return loss
        if admission is not None:
            self._admit_joiners(admission)
            self._joining = self._count_joiners()  # for the next period's end
        return loss

    def _rejoin(self, reason: ExcludedError) -> None:
        """The others excluded this rank (dropped as the slow peer, or counted as lost): it
        leaves its group and, rejoin_after seconds later, joins the job again as a new process
        does (join), keeping its inner optimizer."""
        start, dropped_at = time.monotonic(), self.state.iteration
        joining, self._joining = self._joining, None
        if joining is not None:  # a generation this rank was connecting as a member
            joining.add_done_callback(lambda f: f.exception() is None and
                                      f.result().connecting is not None and
                                      _discard(f.result().connecting))
        ringdist_backend(None, "torch_ringdist.hooks.DiLoCoOptimizer")._close_without_waiting()
        dist.destroy_process_group()
        logger.warning("diloco: excluded at step %s (%s); asking to join again in %.1f s",
                       dropped_at, reason, self.rejoin_after)
        time.sleep(self.rejoin_after)
        fresh = DiLoCoOptimizer.join(self.module, self.optimizer, self.store,
                                     join_timeout=self.join_timeout)
        self.state, self.send_ahead = fresh.state, fresh.send_ahead
        self.rejoins.append({"iteration": dropped_at, "round": _round_of(reason.operation),
                             "rejoined_at": self.state.iteration,
                             "seconds": time.monotonic() - start})

    @torch.no_grad()
    def _average_gradients(self) -> None:
        grads = [p.grad for _, p in self.state._named_params() if p.grad is not None]
        if not grads:
            return
        flat = _gather(grads, _new_flat())
        group = self.state.process_group  # a shrink replaces it
        if self.state.codec is None:
            dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)
        else:
            compressed_bucket(group, flat, self.state.codec, "diloco").wait()
        _scatter(flat, grads)

    def state_dict(self) -> dict:
        return {"inner": self.optimizer.state_dict(), "diloco": self.state}

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["inner"])
        self.state.__setstate__(state_dict["diloco"].__getstate__())
        self.state.process_group = self.process_group
        self.state.bind_module(self.module)
