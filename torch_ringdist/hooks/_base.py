"""Common machinery of the ringdist DDP hooks: state base class, stable bucket layout.

Bucket layout. DDP builds provisional buckets at construction and rebuilds them
once after the first iteration (the second with ``static_graph``), in
gradient-ready order. Per-bucket state (error-feedback residuals, PowerSGD
memories) is only meaningful for one layout, so a state records the *final*
layout (bucket index -> parameter names) the first time it sees rebuilt
buckets and saves it with its checkpoint.

A freshly constructed DDP model always starts with provisional buckets, so a
run resumed from a checkpoint would otherwise compress its first step in a
different layout than the uninterrupted run did. Here, whenever DDP hands over
a bucket that is not one of the recorded buckets, the hook splits and regroups
the gradients into the recorded buckets ("virtual buckets": a staging buffer
per recorded bucket, filled from the parameters' gradient views), runs the
hook on them in index order, and copies the results back. Resumed training is
then bitwise identical to the uninterrupted run. A recorded bucket whose
parameters DDP delivers in two different buckets waits (its future completes
later) until all of them arrived; DDP waits for every future only at the end
of backward, so this cannot deadlock.
"""

import logging
import threading
import weakref

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def group_size(group) -> int:
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def check_float32(what: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.float32:
        raise TypeError(f"torch_ringdist.hooks.{what}: rank {dist.get_rank()}: error feedback "
                        f"needs float32 gradients, got {tensor.dtype}")


class VirtualBucket:
    """A recorded bucket assembled from gradients DDP delivered in other buckets.

    Offers what hooks use of ``dist.GradBucket``: ``index``, ``buffer``,
    ``gradients``, ``parameters``, ``is_last``, ``set_buffer``.
    """

    __slots__ = ("_index", "_buffer", "_gradients", "_parameters", "_last")

    def __init__(self, index, buffer, gradients, parameters, last):
        self._index = index
        self._buffer = buffer
        self._gradients = gradients
        self._parameters = parameters
        self._last = last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list:
        return self._gradients

    def parameters(self) -> list:
        return self._parameters

    def is_last(self) -> bool:
        return self._last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)


class HookState:
    """Base of every ringdist hook state.

    Subclasses implement ``_run(bucket, provisional) -> Future[Tensor]``
    (``provisional``: DDP's buckets are not final yet and no per-bucket state
    may be created) and list their checkpointed fields in ``_saved``.

    Pickling (``torch.save``) keeps everything but the process group and the
    live bindings to a model; ``torch_ringdist.hooks.register(model, name,
    state=loaded)`` binds a loaded state again and checks that the model has
    the parameters of the recorded bucket layout.
    """

    __slots__ = ("process_group", "iteration", "layout", "_names", "_params", "_ddp",
                 "_building", "_adapt", "__weakref__")
    _saved = ("iteration", "layout")

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.iteration = 0  # completed backward passes seen by this hook
        # Final bucket layout: tuple (by bucket index) of tuples of parameter names.
        self.layout = None
        self._bind_clear()

    # ------------------------------------------------------------ binding

    def _bind_clear(self):
        self._names = None     # id(parameter) -> name
        self._params = None    # name -> parameter
        self._ddp = None       # weakref to the DDP model
        self._building = {}
        self._adapt = None

    def bind(self, ddp_model) -> None:
        """Attach to a DDP model: parameter names for the layout, its process group."""
        named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in named}
        self._params = dict(named)
        self._ddp = weakref.ref(ddp_model)
        if self.process_group is None:
            self.process_group = ddp_model.process_group
        if self.layout is not None:
            recorded = {n for bucket in self.layout for n in bucket}
            missing = sorted(recorded - set(self._params))
            extra = sorted(set(self._params) - recorded)
            if missing or extra:
                raise ValueError(
                    f"torch_ringdist.hooks: rank {dist.get_rank()}: the loaded hook state was "
                    f"saved for a model with other parameters (missing here: {missing[:5]}, "
                    f"not in the saved bucket layout: {extra[:5]}); it cannot be resumed")

    # ------------------------------------------------------------ pickling

    def __getstate__(self):
        state = {}
        for cls in type(self).__mro__:
            for name in getattr(cls, "_saved", ()):
                state[name] = getattr(self, name)
        return state

    def __setstate__(self, state):
        self.process_group = None
        self._bind_clear()
        for name, value in state.items():
            setattr(self, name, value)

    # ------------------------------------------------------------ dispatch

    def _rebuilt(self) -> bool:
        ddp = self._ddp() if self._ddp is not None else None
        # Without a DDP model to ask, assume buckets are final after one iteration.
        return getattr(ddp, "_has_rebuilt_buckets", self.iteration >= 1) if ddp else self.iteration >= 1

    def __call__(self, bucket) -> torch.futures.Future[torch.Tensor]:
        if self._names is None:
            return self._run(bucket, provisional=False)  # used without register(): no layout
        names = tuple(self._names[id(p)] for p in bucket.parameters())
        index = bucket.index()
        if self.layout is None:
            if not self._rebuilt():
                return self._run(bucket, provisional=True)
            self._building[index] = names
            if bucket.is_last():
                self.layout = tuple(self._building[i] for i in sorted(self._building))
                self._building = {}
                logger.debug("hook bucket layout recorded: %s buckets", len(self.layout))
            return self._run(bucket, provisional=False)
        idle = self._adapt is None or self._adapt.idle()
        if index < len(self.layout) and self.layout[index] == names and idle:
            return self._run(bucket, provisional=False)
        return self._regroup(bucket, names)

    def _regroup(self, bucket, names) -> torch.futures.Future[torch.Tensor]:
        if self._adapt is None:
            logger.info("rank %s: DDP's buckets differ from the recorded layout (first step after "
                        "resuming, or a changed bucket size); regrouping gradients into the recorded "
                        "buckets", dist.get_rank())
            self._adapt = _Regrouper(self)
        return self._adapt.add(bucket, names)


class _Regrouper:
    """Runs the hook on recorded buckets built from the buckets DDP delivers."""

    def __init__(self, state: HookState):
        self.state = state
        self.lock = threading.Lock()
        self.views = {}       # name -> gradient view (inside a DDP bucket buffer)
        self.params = {}      # name -> parameter
        self.next = 0         # next recorded bucket to launch
        self.pending = []     # [future, DDP bucket buffer, names not yet written back]

    def idle(self) -> bool:
        return self.next == 0 and not self.views

    def add(self, bucket, names) -> torch.futures.Future[torch.Tensor]:
        state = self.state
        layout = state.layout
        outer = torch.futures.Future()
        for name, grad, param in zip(names, bucket.gradients(), bucket.parameters()):
            self.views[name] = grad
            self.params[name] = param
        with self.lock:
            self.pending.append([outer, bucket.buffer(), set(names)])
        while self.next < len(layout) and all(n in self.views for n in layout[self.next]):
            index = self.next
            self.next += 1
            members = layout[index]
            staging = torch.cat([self.views[n].reshape(-1) for n in members])
            grads, offset = [], 0
            for n in members:
                numel = self.views[n].numel()
                grads.append(staging[offset:offset + numel].view_as(self.views[n]))
                offset += numel
            vb = VirtualBucket(index, staging, grads, [self.params[n] for n in members],
                               index == len(layout) - 1)
            targets = [self.views[n] for n in members]  # views into DDP's bucket buffers
            fut = state._run(vb, provisional=False)
            fut.then(lambda f, members=members, targets=targets: self._write_back(f, members, targets))
        if bucket.is_last():
            if self.next != len(layout):
                raise RuntimeError(
                    f"torch_ringdist.hooks: rank {dist.get_rank()}: DDP delivered no gradient for "
                    f"recorded bucket {self.next} ({layout[self.next][:3]}...); the loaded state "
                    "does not match this model")
            # Next iteration starts over; pending write-backs keep their own lists.
            self.views, self.params, self.next = {}, {}, 0
        return outer

    def _write_back(self, fut, members, targets):
        try:
            flat = fut.value().reshape(-1)
            offset = 0
            for target in targets:
                numel = target.numel()
                target.copy_(flat[offset:offset + numel].view_as(target))
                offset += numel
            self._finish(members, None)
        except Exception as exc:  # noqa: BLE001 - handed to DDP through the futures
            self._finish(members, exc)

    def _finish(self, names, error):
        ready = []
        with self.lock:
            for entry in self.pending:
                entry[2].difference_update(names)
                if not entry[2] or error is not None:
                    ready.append(entry)
            for entry in ready:
                self.pending.remove(entry)
        for outer, buffer, _ in ready:
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(buffer)
