"""DiLoCo (Douillard et al., arXiv 2311.08105) and plain local SGD, one implementation.

Every replica runs its inner optimizer alone; every ``period`` steps a *round* averages the
pseudo-gradient (how far each replica moved from the common model theta_global) and an outer
SGD step, with Nesterov momentum in DiLoCo, moves theta_global; every replica then restarts from
it and keeps its inner optimizer state. ``local_sgd`` (post-local SGD) is the same round with
outer learning rate 1 and no momentum: theta_global becomes the replicas' average.

This module holds the round (:class:`DiLoCoState`) and the ``diloco`` DDP hook. The same
rounds on a module without DDP, and joining a running job: :class:`DiLoCoOptimizer` in
``hooks/diloco_optimizer.py`` (still importable from here).
"""

import itertools
import logging
import time
import warnings
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from torch_ringdist import _C
from torch_ringdist._collectives import CODECS, ringdist_backend
from torch_ringdist.hooks._base import HookState, check_float32, completed_future
from torch_ringdist.hooks._registry import add_hook
from torch_ringdist.hooks.compress import allreduce_bucket, compressed_bucket

logger = logging.getLogger(__name__)
# With exchange_timeout: how often a rank waiting for its exchange looks whether another rank
# has begun a check of who is alive (one store round trip each time): the others' check waits
# lost_wait for it.
_CHECK_POLL = 0.25
# ... and how often it looks at the others' beats as last read (no round trip).
_BEAT_POLL = 0.05
# A link's rate counts once bytes waited on it this long during the exchange: microseconds, and
# round trips of the link (slow start and the first acknowledgements take a few).
_BUSY_US, _BUSY_ROUND_TRIPS = 20_000, 4
# The job's first round waits this many exchange_timeouts before it checks who is alive: the
# ranks' first steps (allocations, warm-up) drift apart by more than later periods do.
_FIRST_ROUND_SLACK = 4
# Rounds of each link's rates kept (slow_peer="drop"): their median is its usual rate.
_HISTORY = 8


def _sent_since(then: list, now: list) -> list:
    """Per rank, from two of _link_sends' readings: [bytes its link delivered in between,
    milliseconds bytes waited on it] (a phase held back by a link shows there)."""
    return [[b[0] - a[0], (b[1] - a[1]) // 1000] for a, b in zip(then, now)]


def _new_flat(dtype=torch.float32) -> torch.Tensor:
    return torch.empty(0, dtype=dtype)


def _pieces(flat, tensors):
    """Views of `flat` cut as the tensors are."""
    offset = 0
    for t in tensors:
        yield flat[offset:offset + t.numel()]
        offset += t.numel()


def _completed_ok(work) -> bool:
    if not work.is_completed():
        return False
    try:
        work.wait()
        return True
    except dist.DistBackendError:
        return False


def _gather(tensors, into):
    """The tensors, flat, in `into` (resized; one pass, no new memory when it already has the
    size)."""
    into.resize_(sum(t.numel() for t in tensors))
    for t, piece in zip(tensors, _pieces(into, tensors)):
        piece.copy_(t.detach().reshape(-1))
    return into


def _scatter(flat, tensors) -> None:
    for t, piece in zip(tensors, _pieces(flat, tensors)):
        t.copy_(piece.view_as(t))


# A round's host work as single native passes over float32 CPU fragments (_C.diloco_delta,
# _C.diloco_outer_step: the bits of the torch ops in 2.5x less time, benchmarks/
# diloco_round_passes.py); other tensors (CUDA, other dtypes) take the torch ops. Tests switch it
# off to compare the two.
FUSED_PASSES = True


def _fusable(*tensors) -> bool:
    return FUSED_PASSES and all(t.device.type == "cpu" and t.dtype == torch.float32
                                and t.is_contiguous() for t in tensors)


class DiLoCoState(HookState):
    """State of the ``diloco`` hook: DiLoCo on a DDP model.

    Steps ``0 .. start_step-1`` average gradients over the group (plain, or with ``codec``).
    From then on the inner steps do not communicate: DDP's hook hands each rank its own
    gradient back. Right after every ``period``-th inner step (``optimizer.step()``) a round runs,
    for each of the ``fragments`` parts of the model in turn (part ``p`` after inner steps
    ``(p + 1) * period // fragments + j * period``, the same on every rank):

    1. ``d = theta_local - theta_global`` in float32, plus the residual with error feedback;
    2. ``avg(d)`` over the group, sent in ``codec`` (sums in float32);
    3. an outer SGD step on theta_global with gradient ``-avg(d)``, learning rate ``outer_lr``,
       momentum ``outer_momentum`` (Nesterov's if ``nesterov``): the arithmetic of
       ``torch.optim.SGD(foreach=False)``, so theta_global and the momentum are identical on
       every rank;
    4. every replica's parameters become theta_global (its inner optimizer state is kept).

    ``overlap="streaming"`` (Streaming DiLoCo, arXiv 2501.18512): step 2 runs on the backend's
    own thread while ``tau`` further inner steps compute; then steps 3-4 apply, with the
    fragment's parameters mixed as ``alpha * theta_local + (1 - alpha) * theta_global``.

    ``overlap="eager"`` (eager updates, arXiv 2502.12996): a fragment's exchange runs on the
    backend's thread for its whole next period. Each round takes the outer step at once with
    ``avg(d_prev) - d_prev_own / M + d_own / M``: this rank's fresh ``d`` in place of its own
    share of the average still in flight, the other ranks' shares one round late. Every ``d``
    is applied exactly once, but theta_global differs between ranks by the timing of their own
    shares (the first round uses ``d_own / M`` alone; the last round's average stays in flight
    and is kept by checkpoints).

    ``on_failure="shrink"``: a rank lost between rounds (or during one) is noticed when the
    round's exchange fails. The survivors agree on who is gone
    (:func:`torch_ringdist.lost_ranks`, ``lost_wait`` seconds), shrink the group
    (``dist.shrink_group``; the state's group becomes the new one) and redo the exchanges that
    were in flight with their own contributions of those rounds, then carry on: nothing rolls
    back, no round runs twice. A peer that goes silent (a hung or stopped process, a cut link)
    fails nothing by itself: with ``exchange_timeout`` a rank whose exchange is still running
    that many seconds after its round began waiting asks who is alive the same way. Every rank
    waiting for that exchange answers (each looks every 0.25 s); those that do not answer within
    ``lost_wait`` are dropped as above. When every rank answers, the exchange is only slow and
    the round waits on: a slow link is waited for (``slow_peer="wait"``). With
    ``slow_peer="drop"`` every rank also reports the rate at which each of its links
    delivered the exchange's bytes so far (the kernel's count of bytes acknowledged over the
    time bytes waited on the link) against the link's usual rate, and a rank most of whose
    links, out or in, run at under a third of their usual rate is dropped as above (3 ranks
    or more). The dropped rank gets a :class:`torch_ringdist.ExcludedError` at its next
    exchange; :class:`DiLoCoOptimizer` with a store then joins the job again
    (``rejoin_after``). With ``exchange_timeout`` every rank also beats in the store (every
    0.1 s), and a peer whose beat stops for ``lost_wait`` opens the check at once; it is
    dropped then if none of the TCP links to it of the ranks still beating has carried its data
    for ``lost_wait / 2`` (a live rank's beats may queue behind its data on a congested link,
    its data does not stop), otherwise once its beat has been still for ``lost_wait`` twice,
    however late the check began. A rank still computing then cannot answer, so
    ``exchange_timeout + lost_wait`` must exceed how far the ranks' compute drifts apart within
    a period, ``lost_wait`` a look (0.25 s) plus a few store round trips and two beat periods
    (each 0.1 s and a store round trip) plus a retransmission timeout, and two ``lost_wait``
    the longest a live rank's beats may sit behind its congested link.
    Re-split the data over ``dist.get_world_size()`` after a shrink. Each
    rank keeps a copy of its contribution in flight for this (one more buffer per fragment).
    With DDP, DDP keeps the old group: use :class:`DiLoCoOptimizer`, or a model without
    buffers (the inner steps make no other collective).

    With ``outer_lr=1``, no momentum and no codec the round averages the parameters themselves
    (the same update without the rounding of ``theta_global + avg(d)``; ``local_sgd``).

    The round runs from an optimizer step post-hook: the optimizer passed to ``register``
    (``optimizer=``), or else any optimizer that steps this model's parameters. The state
    checkpoints (``torch.save``) the step counter, theta_global (the model to export:
    :meth:`global_model`), the outer momentum and the residuals; a resumed run is bitwise
    identical to an uninterrupted one. The inner optimizer's state differs between ranks: save
    it per rank.

    Args:
        period: inner steps between two rounds of each fragment (H; default 500).
        outer_lr: outer learning rate (default 0.7, the paper's).
        outer_momentum: outer momentum (default 0.9).
        nesterov: Nesterov momentum (default True; needs ``outer_momentum > 0``).
        codec: None (exact) or ``"fp16"``/``"bf16"``/``"int8"``/``"int4"`` for the
            pseudo-gradients (and the gradients before ``start_step``); ringdist groups only.
        error_feedback: carry what the codec lost into the next round's pseudo-gradient
            (default True; with a codec).
        fragments: parts the parameters are split into, round robin in ``named_parameters()``
            order, each exchanged once per period at its own offset (Streaming DiLoCo's
            schedule; default 1). At most ``period``.
        start_step: optimizer steps with averaged gradients before the local phase (default 0).
        overlap: ``"none"`` (the round completes within the step that starts it) or
            ``"streaming"``.
        tau: with streaming, inner steps between a fragment's exchange starting and its
            outer step (1 <= tau < period // fragments: one fragment in flight at a time).
        alpha: with streaming, the weight of the replica's own parameters in the mix.
        on_failure: ``"raise"`` or ``"shrink"`` (above).
        lost_wait: seconds the survivors wait for each other's answer after a failure (1.0).
        exchange_timeout: with ``"shrink"``, seconds a round waits for its exchange before it
            checks for silent peers (None: never; a silent peer then fails the exchange only at
            the group's timeout; the job's first round waits 4 times as long). Tested on
            ringdist groups, whose exchange keeps running when a wait for it times out.
        slow_peer: ``"wait"`` (default) or ``"drop"`` (above; needs ``exchange_timeout``):
            what that check does with a peer that answers but whose link holds the exchange
            back.
        process_group: group (None: the DDP model's group).

    Example::

        >>> inner = torch.optim.AdamW(ddp.parameters(), lr=4e-4)
        >>> state = torch_ringdist.hooks.register(ddp, "diloco", optimizer=inner, period=50,
        ...                                       codec="int8")
    """

    __slots__ = ("period", "outer_lr", "outer_momentum", "nesterov", "codec", "error_feedback",
                 "fragments", "start_step", "overlap", "tau", "alpha", "anchor",
                 "on_failure", "lost_wait", "exchange_timeout", "slow_peer", "momentum_buffers",
                 "residuals", "averaged_at", "_sends_at", "_link_history", "_heartbeat",
                 "rounds", "in_flight", "sent", "shrinks", "admitted", "generation", "recoveries",
                 "_model", "_hook_handle", "_scratch", "kept_averages")
    _saved = ("period", "outer_lr", "outer_momentum", "nesterov", "codec", "error_feedback",
              "fragments", "start_step", "overlap", "tau", "alpha", "on_failure", "lost_wait",
              "exchange_timeout", "slow_peer", "anchor", "momentum_buffers", "residuals",
              "averaged_at",
              "rounds", "in_flight", "sent", "shrinks", "admitted", "generation")
    # Fields newer than the first saved states, with the values those states ran with.
    _defaults = {"on_failure": "raise", "lost_wait": 1.0, "exchange_timeout": None,
                 "slow_peer": "wait", "sent": {},
                 "shrinks": 0, "admitted": 0, "generation": 0}
    # The options a joining process takes from the job (DiLoCoOptimizer.join).
    _options = ("period", "outer_lr", "outer_momentum", "nesterov", "codec", "error_feedback",
                "fragments", "start_step", "overlap", "tau", "alpha", "on_failure", "lost_wait",
                "exchange_timeout", "slow_peer")
    _name = "diloco"

    def __init__(self, period: int = 500, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, codec: str | None = None, error_feedback: bool = True,
                 fragments: int = 1, start_step: int = 0, overlap: str = "none", tau: int = 1,
                 alpha: float = 0.5, on_failure: str = "raise", lost_wait: float = 1.0,
                 exchange_timeout: float | None = None, slow_peer: str = "wait",
                 process_group=None):
        super().__init__(process_group)
        what = f"torch_ringdist.hooks.{self._name}"
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"{what}: period must be an integer >= 1, got {period!r}")
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"{what}: start_step must be an integer >= 0, got {start_step!r}")
        if not outer_lr > 0:
            raise ValueError(f"{what}: outer_lr must be > 0, got {outer_lr!r}")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"{what}: outer_momentum must be in [0, 1), got {outer_momentum!r}")
        if nesterov and outer_momentum == 0:
            raise ValueError(f"{what}: nesterov needs outer_momentum > 0")
        if codec is not None and codec not in CODECS:
            raise ValueError(f"{what}: unknown codec {codec!r} (known: {', '.join(CODECS)})")
        if not isinstance(fragments, int) or not 1 <= fragments <= period:
            raise ValueError(f"{what}: fragments must be an integer in [1, period={period}], "
                             f"got {fragments!r}")
        if overlap not in ("none", "streaming", "eager"):
            raise ValueError(f"{what}: overlap must be 'none', 'streaming' or 'eager', "
                             f"got {overlap!r}")
        if overlap == "streaming" and not (isinstance(tau, int) and 1 <= tau < period // fragments):
            raise ValueError(f"{what}: tau must be an integer in [1, period // fragments = "
                             f"{period // fragments}), got {tau!r}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"{what}: alpha must be in [0, 1], got {alpha!r}")
        if on_failure not in ("raise", "shrink"):
            raise ValueError(f"{what}: on_failure must be 'raise' or 'shrink', got {on_failure!r}")
        if on_failure == "shrink" and not hasattr(dist, "shrink_group"):
            raise ValueError(f"{what}: on_failure='shrink' needs dist.shrink_group (torch >= 2.10)")
        if not lost_wait > 0:
            raise ValueError(f"{what}: lost_wait must be > 0 seconds, got {lost_wait!r}")
        if exchange_timeout is not None and (on_failure != "shrink" or not exchange_timeout > 0):
            raise ValueError(f"{what}: exchange_timeout must be None or > 0 seconds, with "
                             f"on_failure='shrink'; got {exchange_timeout!r} with "
                             f"on_failure={on_failure!r}")
        if slow_peer not in ("wait", "drop") or (slow_peer == "drop" and exchange_timeout is None):
            raise ValueError(f"{what}: slow_peer must be 'wait' or 'drop' (with an "
                             f"exchange_timeout), got {slow_peer!r} with exchange_timeout="
                             f"{exchange_timeout!r}")
        if overlap != "none" and self._plain_average_for(codec, outer_lr, outer_momentum):
            raise ValueError(f"{what}: overlap={overlap!r} needs a theta_global to step: "
                             "a codec, outer_lr != 1 or outer_momentum > 0")
        self.period = period
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.nesterov = bool(nesterov)
        self.codec = codec
        self.error_feedback = bool(error_feedback) and codec is not None
        self.fragments = fragments
        self.start_step = start_step
        self.overlap = overlap
        self.tau = tau
        self.alpha = float(alpha)
        self.on_failure = on_failure
        self.lost_wait = float(lost_wait)
        self.exchange_timeout = None if exchange_timeout is None else float(exchange_timeout)
        self.slow_peer = slow_peer
        self.anchor = None           # fragment -> flat float32 theta_global (None: plain averaging)
        self.momentum_buffers = {}   # fragment -> float32 outer momentum
        self.residuals = {}          # fragment -> float32 error-feedback residual
        self.averaged_at = -1        # iteration of the last round decision
        self.rounds = 0              # fragment exchanges so far
        # fragment -> [local step to apply at, flat average (in place), its Work or None]
        self.in_flight = {}
        self.sent = {}               # fragment -> this rank's d in flight (eager, shrink)
        self.shrinks = 0             # groups shrunk after a lost rank
        self.admitted = 0            # join requests answered (DiLoCoOptimizer with a store)
        self.generation = 0          # generations begun for joiners (formed or dropped)
        self._model = None
        self._hook_handle = None

    # ------------------------------------------------------------ binding

    def _bind_clear(self):
        super()._bind_clear()
        self._model = None
        self._hook_handle = None
        self._scratch = {}  # fragment -> flat float32 work buffer, kept between rounds
        self._sends_at = None  # the links' send totals when the last exchange began (drop)
        self._link_history = None  # (backend, per rank: its link's last rates) (drop)
        self._heartbeat = None  # with exchange_timeout: this rank's beat, the others' (_recovery)
        # {"lost": ranks, "failed_at": time.time() of the failed wait, "seconds": to the redo,
        # and its phases (_shrink_and_redo)}
        self.recoveries = []
        # None, or fragment -> a copy of its last round's average (DiLoCoOptimizer's joins)
        self.kept_averages = None

    def bind(self, ddp_model, optimizer=None) -> None:
        super().bind(ddp_model)
        self.bind_module(ddp_model.module)
        self._run_after_steps(ddp_model.module, optimizer)

    def bind_module(self, module) -> None:
        """The model whose parameters the rounds average (DiLoCoOptimizer: no DDP)."""
        self._model = weakref.ref(module)
        if self.iteration == self.start_step and self.anchor is None:
            self._set_anchor()  # start_step 0: the replicas start from the same weights

    def _run_after_steps(self, module, optimizer) -> None:
        """Rounds after the steps of `optimizer` (None: any optimizer stepping `module`)."""
        if self._hook_handle is not None:
            self._hook_handle.remove()
        if optimizer is not None:
            self._hook_handle = optimizer.register_step_post_hook(lambda opt, a, kw: self.after_step())
        else:
            owned = {id(p) for p in module.parameters()}

            def after_any_step(opt, args, kwargs):
                if any(id(p) in owned for group in opt.param_groups for p in group["params"]):
                    self.after_step()

            self._hook_handle = register_optimizer_step_post_hook(after_any_step)

    def detach(self) -> None:
        """Stop running rounds after optimizer steps (the run is over). Warns when the local
        phase began and no outer round ran: the replicas were then never averaged."""
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
        self._warn_if_no_round()

    def _warn_if_no_round(self) -> None:
        local = self.iteration - self.start_step
        if self.rounds > 0 or local <= 0:
            return
        first = self.period // self.fragments  # fragment 0's round, the first of a period
        export = ("; global_model() is still the starting model" if self.anchor is not None
                  else "")
        warnings.warn(f"torch_ringdist.hooks.{self._name}: the run ends without an outer round: "
                      f"{local} inner step(s) from step {self.start_step} on, and the first "
                      f"round is due after inner step {first} (period={self.period}, "
                      f"fragments={self.fragments}). "
                      f"The replicas were never averaged after step {self.start_step}: each "
                      f"trained on its own data{export}. Pass a period the run reaches.",
                      stacklevel=3)

    def _named_params(self):
        model = self._model() if self._model is not None else None
        if model is None:
            raise RuntimeError(f"torch_ringdist.hooks.{self._name}: the state is not bound to a "
                               "model (use torch_ringdist.hooks.register)")
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    @staticmethod
    def _plain_average_for(codec, outer_lr, outer_momentum) -> bool:
        return codec is None and outer_lr == 1.0 and outer_momentum == 0.0

    def _plain_average(self) -> bool:
        return self._plain_average_for(self.codec, self.outer_lr, self.outer_momentum)

    def __setstate__(self, state):
        super().__setstate__({**self._defaults, **state})

    def __getstate__(self):
        # An exchange in flight is waited for: the checkpoint holds its result.
        for entry in self.in_flight.values():
            if entry[2] is not None:
                entry[2].wait()
                entry[2] = None
        return super().__getstate__()

    def finish(self) -> None:
        """Streaming: completes now the rounds still in flight (their exchanges, outer steps
        and mixes, due ``tau`` steps later). Call it after the last step, before exporting
        :meth:`global_model`, so the last rounds' exchanges are not lost. (Eager overlap's last
        average stays in flight, as its checkpoints keep it.)"""
        if self.overlap != "streaming":
            return
        for fragment in sorted(self.in_flight):
            self._finish_round(fragment)

    def _set_anchor(self):
        if not self._plain_average():
            self.anchor = {f: _gather(self._fragment_tensors(f), _new_flat())
                           for f in range(self.fragments)}

    def global_model(self) -> dict:
        """theta_global by parameter name (float32; the model to export). With plain averaging
        (no anchor kept) the parameters themselves, equal on every rank right after a round."""
        out = {}
        for f in range(self.fragments):
            params = self._fragment(f)
            tensors = [p for _, p in params]
            theta = self.anchor[f] if self.anchor is not None else _gather(tensors, _new_flat())
            for (name, p), piece in zip(params, _pieces(theta, tensors)):
                out[name] = piece.view_as(p).clone()
        return out

    def _work_buffer(self, fragment):
        buf = self._scratch.get(fragment)
        if buf is None:
            buf = self._scratch[fragment] = _new_flat()
        return buf

    # ------------------------------------------------------------ the DDP hook

    def _run(self, bucket, provisional):
        step = self.iteration
        if bucket.is_last():
            self.iteration += 1
        if step >= self.start_step:
            return completed_future(bucket.buffer())  # an inner step: the rank's own gradient
        if self.codec is None:
            return allreduce_bucket(self.process_group, bucket.buffer())
        return compressed_bucket(self.process_group, bucket.buffer(), self.codec, self._name)

    # ------------------------------------------------------------ rounds

    def due_fragments(self, local_step: int) -> list:
        """Fragments whose round follows inner step `local_step` (counted from start_step)."""
        due = []
        for p in range(self.fragments):
            offset = (p + 1) * self.period // self.fragments
            if local_step >= offset and (local_step - offset) % self.period == 0:
                due.append(p)
        return due

    def after_step(self) -> None:
        """Called after each optimizer step: runs the rounds that are due."""
        t = self.iteration  # completed backward passes
        if t == self.averaged_at:
            return
        self.averaged_at = t
        if t == self.start_step and self.anchor is None:
            self._set_anchor()  # last global step done: the replicas are identical here
        local = t - self.start_step
        if self.overlap == "streaming":
            for fragment in [f for f, entry in self.in_flight.items() if entry[0] == local]:
                self._finish_round(fragment)
        for fragment in self.due_fragments(local):
            if self.overlap == "streaming":
                self._start_round(fragment, local + self.tau)
            elif self.overlap == "eager":
                self._eager_round(fragment, local)
            else:
                self.run_round(fragment)

    @torch.no_grad()
    def run_round(self, fragment: int = 0) -> None:
        """One round of `fragment` now (collective: every rank of the group together)."""
        params = self._fragment_tensors(fragment)
        plain = self._plain_average()  # flat: the parameters themselves, averaged
        if plain:
            flat = _gather(params, self._work_buffer(fragment))
            self._contribute(fragment, flat)
        else:
            flat = self._delta(fragment, params)
        self._wait(fragment, flat, self._allreduce(fragment, flat))
        if plain:
            _scatter(flat, params)
        else:
            if self.kept_averages is not None:
                self.kept_averages[fragment] = flat.clone()
            self._outer_step(fragment, params, flat)
        self.rounds += 1
        logger.debug("%s: round %s (fragment %s) after step %s", self._name, self.rounds,
                     fragment, self.iteration)

    def _fragment(self, fragment: int):
        return self._named_params()[fragment::self.fragments]

    def _fragment_tensors(self, fragment: int):
        return [p for _, p in self._fragment(fragment)]

    def _theta(self, fragment: int) -> torch.Tensor:
        if self.anchor is None:
            raise RuntimeError(f"torch_ringdist.hooks.{self._name}: no theta_global to measure "
                               "the replicas against (state restored from an incomplete "
                               "checkpoint?)")
        return self.anchor[fragment]

    @torch.no_grad()
    def _start_round(self, fragment: int, apply_at: int) -> None:
        """Starts the exchange of `fragment`'s d on the backend's thread (streaming)."""
        flat = self._delta(fragment, self._fragment_tensors(fragment))
        self.in_flight[fragment] = [apply_at, flat, self._allreduce(fragment, flat)]

    @torch.no_grad()
    def _finish_round(self, fragment: int) -> None:
        """The outer step with the exchange started tau steps ago; mixes the parameters."""
        _, avg_d, work = self.in_flight.pop(fragment)
        self._wait(fragment, avg_d, work)
        self._outer_step(fragment, self._fragment_tensors(fragment), avg_d, mix=True)
        self.rounds += 1

    @torch.no_grad()
    def _eager_round(self, fragment: int, local: int) -> None:
        """Eager overlap: the outer step now, with this rank's fresh d in place of its share
        of the last round's average (waited for here, a period after it started); then this
        round's exchange starts and runs until the fragment's next round."""
        params = self._fragment_tensors(fragment)
        fresh = self._delta(fragment, params, contribute=False)
        previous = self.in_flight.pop(fragment, None)
        if previous is not None:  # waited first: a shrink redoes it with the last "sent"
            self._wait(fragment, previous[1], previous[2])
        share = 1.0 / dist.get_world_size(self.process_group)  # after any shrink
        if previous is not None:  # the others' shares: the average less this rank's
            previous[1].sub_(self.sent[fragment], alpha=share)
        self._contribute(fragment, fresh)  # "sent" becomes this round's
        if previous is None:  # the first round: no other shares yet
            grad = torch.mul(fresh, share)
        else:
            grad = previous[1].add_(fresh, alpha=share)
        self.in_flight[fragment] = [local + self.period, fresh, self._allreduce(fragment, fresh)]
        self._scratch[fragment] = grad  # the next round's work buffer, once stepped with
        self._outer_step(fragment, params, grad)
        self.rounds += 1

    def _delta(self, fragment: int, params, contribute: bool = True) -> torch.Tensor:
        """d = theta_local - theta_global of `fragment`, in its work buffer; with `contribute`,
        readied for the exchange (_contribute) in the same pass."""
        theta = self._theta(fragment)
        flat = self._work_buffer(fragment)
        if not _fusable(theta, *params):
            _gather(params, flat).sub_(theta)
            if contribute:
                self._contribute(fragment, flat)
            return flat
        flat.resize_(theta.numel())
        residual, sent = self._contribution_buffers(fragment, flat) if contribute else (None, None)
        _C.diloco_delta(params, theta, flat, residual, sent)
        return flat

    def _contribution_buffers(self, fragment: int, flat: torch.Tensor):
        """(the fragment's error feedback residual or None, the tensor that keeps what this
        rank sends or None), sized as flat: what _contribute fills."""
        residual = None
        if self.error_feedback:
            check_float32(self._name, flat)
            residual = self.residuals.get(fragment)
            if residual is None or residual.numel() != flat.numel():
                residual = self.residuals[fragment] = torch.zeros_like(flat)
        sent = None
        if self.overlap == "eager" or self.on_failure == "shrink":
            sent = self.sent.get(fragment)
            if sent is None:
                sent = self.sent[fragment] = _new_flat()
            sent.resize_as_(flat)
        return residual, sent

    def _contribute(self, fragment: int, flat: torch.Tensor) -> None:
        """Readies flat for the exchange. With error feedback the exchange adds the residual
        to flat and keeps in it what the codec lost. This rank's contribution (flat plus the
        residual) is kept in "sent" where a redo (on_failure="shrink") or eager overlap needs
        it."""
        residual, sent = self._contribution_buffers(fragment, flat)
        if sent is not None:
            sent.copy_(flat)
            if residual is not None:
                sent.add_(residual)

    def _wait(self, fragment: int, flat: torch.Tensor, work) -> None:
        """Waits for `fragment`'s exchange into `flat`; on_failure="shrink": a failed one, or
        one still running after exchange_timeout while a peer is silent, shrinks the group and
        is redone there."""
        if work is None:
            return
        limit = self.exchange_timeout
        if limit is not None and self._heartbeat is None:
            self._start_heartbeat()
        if self.on_failure == "shrink":
            from torch_ringdist._recovery import ready_to_shrink

            # With a deadline a waiting rank looks for a check another rank began (the cascade
            # of an error), so an error may leave the links open for the shrink to keep.
            ready_to_shrink(self.process_group, keep_links=limit is not None)
        if limit is not None and self.rounds == 0:
            limit *= _FIRST_ROUND_SLACK  # the ranks' first steps take unequal time
        deadline = None if limit is None else time.monotonic() + limit
        round_key = f"round{self.rounds}"  # the same on every rank
        for attempt in itertools.count():
            check = f"{round_key}.{attempt}"  # this attempt's check of who is alive
            try:
                if self._wait_until(work, deadline, check, watch_beats=attempt == 0):
                    self._mark_done(round_key)
                    return
                error = None
            except dist.DistBackendError as exc:
                if self.on_failure != "shrink":
                    raise
                error = exc
            failed_at, start = time.time(), time.monotonic()
            lost, phases = self._shrink_and_redo(fragment, flat, work, check, round_key)
            if lost:
                self.recoveries.append({"lost": lost, "failed_at": failed_at,
                                        "seconds": time.monotonic() - start, **phases})
                return
            if error is not None:
                raise RuntimeError(f"torch_ringdist.hooks.{self._name}: the round's exchange "
                                   f"failed on rank {dist.get_rank(self.process_group)} and no "
                                   f"rank is lost: {error}") from error
            deadline = time.monotonic() + limit  # every rank answered: slow, not silent

    def _mark_done(self, round_key: str) -> None:
        """With exchange_timeout: records (off the training thread, one store round trip) that
        this round's exchange completed here. A rank whose exchange is still running (a
        retransmission can hold one link back for seconds) may check who is alive after this
        rank has moved on; the mark counts this rank as alive there, so it is not dropped."""
        if self.exchange_timeout is None:
            return
        from torch_ringdist._recovery import mark_done

        mark_done(self.process_group, round_key,
                  self._link_ratios(remember=True) if self.slow_peer == "drop" else None)

    def _start_heartbeat(self) -> None:
        """Beats for this rank and watches the others' beats (_recovery.Heartbeat) for as long
        as this state lives, in whatever group it is in."""
        from torch_ringdist._recovery import Heartbeat

        state = weakref.ref(self)
        self._heartbeat = Heartbeat(lambda: state().process_group, self.lost_wait,
                                    lambda: state() is not None)

    def _must_check(self, check: str, watch_beats: bool) -> bool:
        """Whether this rank takes part in the check of who is alive `check` now: another rank
        began it, or (`watch_beats`) a peer's beat stopped."""
        from torch_ringdist._recovery import check_open

        return self._beat_stopped(watch_beats) or check_open(self.process_group, check)

    def _beat_stopped(self, watch_beats: bool) -> bool:
        """With `watch_beats`: whether a peer's beat has stopped, as last read."""
        return watch_beats and self._heartbeat is not None and \
            bool(self._heartbeat.view(self.process_group)[0])

    def _wait_until(self, work, deadline, check: str, watch_beats: bool = False) -> bool:
        """Waits for `work` (raising its error). True: it completed. False: this rank must take
        part in the check of who is alive `check`, because its deadline passed, another rank's
        did (looked for on beginning to wait, every _CHECK_POLL seconds while waiting, and once
        more on completing after that), or (`watch_beats`) a peer's beat stopped (looked for
        every _BEAT_POLL seconds)."""
        if deadline is None:
            work.wait()
            return True
        # A rank whose compute ran late may begin waiting after the others' deadline passed:
        # it joins their check at once (the look overlaps its exchange).
        if self._must_check(check, watch_beats):
            return False
        waited, looked = False, time.monotonic()
        poll = _BEAT_POLL if watch_beats else _CHECK_POLL
        while True:
            left = deadline - time.monotonic()
            try:
                work.wait(timedelta(seconds=min(poll, max(left, 0.001))))
            except dist.DistBackendError:
                if not work.is_completed():  # the poll ran out; the exchange runs on
                    waited = True
                    if left <= poll or self._beat_stopped(watch_beats):
                        return False
                    if time.monotonic() - looked >= _CHECK_POLL:
                        looked = time.monotonic()
                        if self._must_check(check, False):
                            return False
                    continue
                work.wait()  # it failed (its own error), or completed just after the poll
            return not (waited and self._must_check(check, False))

    def _shrink_and_redo(self, fragment: int, flat: torch.Tensor, work, check: str,
                         round_key: str) -> tuple[list, dict]:
        """The survivors agree on the lost ranks; when there are some, they shrink the group
        (aborting the old one, so its exchanges in flight end), and redo `fragment`'s exchange
        into `flat` (`work`: the one that failed here) and every other one in flight (the same
        set on every rank, whichever of them failed here) with the contributions they sent.
        `check` names this attempt's check of who is alive; ranks whose exchange completed
        marked `round_key` done (alive), and an exchange that completes during the check
        settles it: nobody is lost. Returns the lost ranks ([]: none, nothing done) and the
        seconds each phase took."""
        from torch_ringdist._recovery import ExcludedError, decide, excluded

        start = time.monotonic()
        drop = self.slow_peer == "drop"
        operation = excluded(self.process_group) if drop else None
        if operation is not None:  # dropped after its exchange of that round completed here
            raise ExcludedError(f"torch_ringdist.hooks.{self._name}: rank "
                                f"{dist.get_rank(self.process_group)} was dropped as the slow "
                                f"peer in {operation}; it must leave or join again", operation)
        decision = decide(self.process_group, wait=self.lost_wait, key=check,
                          settled=lambda: _completed_ok(work), done=round_key,
                          heartbeat=self._heartbeat,
                          ratios=(lambda: self._link_ratios(remember=False)) if drop else None,
                          behind=(f"round{self.rounds - 1}.0", f"round{self.rounds - 1}"))
        lost = decision["lost"]
        if not lost:
            return lost, {}
        agreed = time.monotonic()
        self.process_group = dist.shrink_group(lost, group=self.process_group,
                                               shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
        shrunk = time.monotonic()
        sends = self._redo_sends()  # what each link carries during the redo (_sent_since)
        redo, ending = {fragment: flat}, [work]
        for f, entry in self.in_flight.items():
            if entry[2] is not None:
                redo[f] = entry[1]
                ending.append(entry[2])
                entry[2] = None
        for old in ending:
            try:  # ends with the old group (aborted), failed or not: its buffer is free after
                old.wait()
            except dist.DistBackendError:
                pass
        self.shrinks += 1
        logger.warning("%s: rank(s) %s %s; the group shrank to %s ranks, redoing %s "
                       "exchange(s)", self._name, lost,
                       "dropped as the slow peer" if decision["slow"] else "lost",
                       dist.get_world_size(self.process_group), len(redo))
        works = []
        for f in sorted(redo):
            redo[f].copy_(self.sent[f])  # with the residual it was sent with
            if self.error_feedback:
                self.residuals[f].zero_()  # the redo's loss replaces the failed one's
            works.append(self._allreduce(f, redo[f]))
        for work in works:
            work.wait()
        redone = time.monotonic()
        links = _sent_since(sends, self._redo_sends())
        return lost, {"agree_s": agreed - start, "shrink_s": shrunk - agreed,
                      "redo_s": redone - shrunk, "redo_links": links, "slow": decision["slow"],
                      "quiet": decision.get("quiet", []), "looks": decision["looks"],
                      "learnt": decision["learnt"],
                      "ratios": decision["ratios"]}

    def _allreduce(self, fragment: int, flat: torch.Tensor):
        """Starts flat <- its average over the group, in the codec; with error feedback, flat
        plus the fragment's residual, which then gets what the codec lost. Returns the Work."""
        if self.slow_peer == "drop":
            self._sends_at = self._link_sends()
        if self.codec is None:
            return dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.process_group,
                                   async_op=True)
        residual = self.residuals.get(fragment) if self.error_feedback else None
        return ringdist_backend(self.process_group, f"torch_ringdist.hooks.{self._name}") \
            .allreduce_compressed(flat, self.codec, True, residual=residual)

    def _redo_sends(self) -> list:
        """_link_sends, or [] where the group does not run on ringdist."""
        try:
            return self._link_sends()
        except ValueError:
            return []

    def _link_sends(self) -> list:
        """[bytes acknowledged, microseconds busy, smallest round trip, bytes unacknowledged]
        per rank on this rank's links."""
        return ringdist_backend(self.process_group, f"torch_ringdist.hooks.{self._name}") \
            ._link_sends()

    def _link_rates(self) -> list:
        """For each of this rank's links since the last exchange began: (MB/s, measured). The
        bytes acknowledged over the time bytes waited, once that is _BUSY_ROUND_TRIPS round
        trips (measured); for a link that delivered everything sooner, those bytes over that
        time (a bound, not measured: it names no link slow); None where bytes still wait after
        less (a rank whose exchange just began)."""
        before, now = self._sends_at, self._link_sends()
        if before is None or len(before) != len(now):
            return [(None, False)] * len(now)
        rates = []
        for (acked, busy, _, _), (acked_now, busy_now, rtt, unacked) in zip(before, now):
            floor = max(_BUSY_US, _BUSY_ROUND_TRIPS * rtt)
            waited, sent = busy_now - busy, acked_now - acked
            if waited >= floor:
                rates.append((sent / waited, True))
            else:
                rates.append((sent / floor if sent > 0 and unacked == 0 else None, False))
        return rates

    def _link_ratios(self, remember: bool) -> list:
        """Each link's measured rate in this exchange (_link_rates) over its usual rate, the
        median of its last _HISTORY rates in this group (the same exchange, so the same bytes
        and round trips), None where either is unknown; with `remember`, the rates (bounds
        too) join those."""
        rates = self._link_rates()
        backend = ringdist_backend(self.process_group, f"torch_ringdist.hooks.{self._name}")
        if self._link_history is None or self._link_history[0] is not backend:
            self._link_history = (backend, [[] for _ in rates])  # new links, new history
        history = self._link_history[1]
        usual = [sorted(past)[len(past) // 2] if past else 0.0 for past in history]
        ratios = [rate / typical if measured and typical > 0 else None
                  for (rate, measured), typical in zip(rates, usual)]
        if remember:
            for (rate, _), past in zip(rates, history):
                if rate is not None:
                    past[:] = (past + [rate])[-_HISTORY:]
        return ratios

    def _outer_step(self, fragment: int, params, avg_d: torch.Tensor, mix: bool = False) -> None:
        """theta <- an SGD step with gradient -avg_d, as torch.optim.SGD(foreach=False) does;
        then the parameters <- theta, or with `mix` alpha * params + (1 - alpha) * theta. avg_d
        is spent (its memory may be used)."""
        theta = self._theta(fragment)
        buf = self.momentum_buffers.get(fragment)
        first = buf is None
        if first and self.outer_momentum != 0:
            buf = self.momentum_buffers[fragment] = torch.empty_like(avg_d)
        if _fusable(theta, avg_d, *params, *([buf] if buf is not None else [])):
            _C.diloco_outer_step(params, theta, avg_d, buf if self.outer_momentum != 0 else None,
                                 first, self.outer_lr, self.outer_momentum, self.nesterov,
                                 self.alpha if mix else None)
            return
        grad = avg_d.neg_()
        if self.outer_momentum != 0:
            if first:
                buf.copy_(grad)
            else:
                buf.mul_(self.outer_momentum).add_(grad)
            # In place of torch's grad.add(buf, alpha=momentum): the same bits, no new memory.
            grad = grad.add_(buf, alpha=self.outer_momentum) if self.nesterov else buf
        theta.add_(grad, alpha=-self.outer_lr)
        if not mix:
            _scatter(theta, params)
            return
        mixed = _gather(params, avg_d)  # avg_d is spent: its memory takes the mix
        mixed.mul_(self.alpha).add_(theta, alpha=1.0 - self.alpha)
        _scatter(mixed, params)


def diloco_hook(state: DiLoCoState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DiLoCo. See :class:`DiLoCoState`.

    Args:
        state: a :class:`DiLoCoState`, bound with ``torch_ringdist.hooks.register``.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the averaged bucket (before start_step) or of the bucket unchanged.
    """
    return state(bucket)


add_hook("diloco", diloco_hook, DiLoCoState)


def __getattr__(name):
    # DiLoCoOptimizer lived here; it imports this module, so it is re-exported lazily.
    if name == "DiLoCoOptimizer":
        from torch_ringdist.hooks.diloco_optimizer import DiLoCoOptimizer
        return DiLoCoOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
