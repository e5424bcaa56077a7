"""Post-local SGD: global allreduce first, then local steps with periodic model averaging."""

import logging
import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from torch_ringdist._collectives import CODECS
from torch_ringdist.hooks._base import HookState, completed_future
from torch_ringdist.hooks._registry import add_hook
from torch_ringdist.hooks.compress import allreduce_bucket, compressed_bucket

logger = logging.getLogger(__name__)


class LocalSGDState(HookState):
    """State of the ``local_sgd`` hook (post-local SGD).

    Steps ``0 .. start_step-1`` average gradients globally (plain, or with
    ``codec``). From ``start_step`` on, every rank steps on its own gradient
    (no communication in backward), and every ``period`` steps the *models*
    are averaged right after ``optimizer.step()``, so all replicas are bitwise
    identical again at that point. With a codec, what is averaged is each
    rank's change since the last averaging (small, gradient-like values that
    quantise well), added to the common anchor, never the weights themselves.

    The averaging runs from an optimizer step post-hook: the optimizer passed
    to ``register`` (``optimizer=``), or else any optimizer that steps this
    model's parameters. Call :meth:`average_parameters` yourself to average at
    other times (all ranks together).

    Unlike torch's ``PostLocalSGDState`` this state checkpoints (step counter
    and anchor) and a resumed run continues bitwise identically. Optimizer
    state (e.g. momentum) differs between ranks during local steps: save it
    per rank.

    Args:
        start_step: number of global-allreduce steps before local SGD (default 100).
        period: average the models every this many local steps (default 4).
        codec: None (exact averaging) or ``"fp16"``/``"bf16"``/``"int8"``
            (compressed gradient allreduce before ``start_step`` and compressed
            model-delta averaging after; ringdist groups only).
        process_group: group (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "local_sgd", start_step=100,
        ...                                       period=4, optimizer=opt)
    """

    __slots__ = ("start_step", "period", "codec", "anchor", "averaged_at", "_model", "_hook_handle")
    _saved = ("start_step", "period", "codec", "anchor", "averaged_at")

    def __init__(self, start_step: int = 100, period: int = 4, codec: str | None = None,
                 process_group=None):
        super().__init__(process_group)
        if start_step < 0 or period < 1:
            raise ValueError("torch_ringdist.hooks.local_sgd: start_step must be >= 0 and "
                             f"period >= 1, got {start_step} and {period}")
        if codec is not None and codec not in CODECS:
            raise ValueError(f"torch_ringdist.hooks.local_sgd: unknown codec {codec!r}")
        self.start_step = int(start_step)
        self.period = int(period)
        self.codec = codec
        self.anchor = None       # name -> float32 tensor: the models at the last averaging
        self.averaged_at = -1    # iteration of the last averaging decision
        self._model = None
        self._hook_handle = None

    def _bind_clear(self):
        super()._bind_clear()
        self._model = None
        self._hook_handle = None

    def bind(self, ddp_model, optimizer=None) -> None:
        super().bind(ddp_model)
        self._model = weakref.ref(ddp_model.module)
        if self._hook_handle is not None:
            self._hook_handle.remove()
        if optimizer is not None:
            self._hook_handle = optimizer.register_step_post_hook(lambda opt, a, kw: self.after_step())
        else:
            owned = {id(p) for p in ddp_model.module.parameters()}

            def after_any_step(opt, args, kwargs):
                if any(id(p) in owned for group in opt.param_groups for p in group["params"]):
                    self.after_step()

            self._hook_handle = register_optimizer_step_post_hook(after_any_step)
        if self.iteration == self.start_step and self.anchor is None:
            self._set_anchor()  # start_step 0: DDP just broadcast identical weights

    def _named_params(self):
        model = self._model() if self._model is not None else None
        if model is None:
            raise RuntimeError("torch_ringdist.hooks.local_sgd: the state is not bound to a "
                               "model (use torch_ringdist.hooks.register)")
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def _set_anchor(self):
        if self.codec is not None:
            self.anchor = {n: p.detach().to(torch.float32, copy=True) for n, p in self._named_params()}

    def _run(self, bucket, provisional):
        step = self.iteration
        if bucket.is_last():
            self.iteration += 1
        if step >= self.start_step:
            return completed_future(bucket.buffer())  # local step: the rank's own gradient
        if self.codec is None:
            return allreduce_bucket(self.process_group, bucket.buffer())
        return compressed_bucket(self.process_group, bucket.buffer(), self.codec, "local_sgd")

    def after_step(self) -> None:
        """Called after each optimizer step: averages the models when one is due."""
        t = self.iteration  # completed backward passes
        if t == self.averaged_at:
            return
        self.averaged_at = t
        if t == self.start_step and self.anchor is None:
            self._set_anchor()  # last global step done: replicas are identical here
        local = t - self.start_step
        if local > 0 and local % self.period == 0:
            self.average_parameters()

    @torch.no_grad()
    def average_parameters(self) -> None:
        """Average the bound model's parameters over the group now (collective)."""
        params = self._named_params()
        group = self.process_group
        flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for _, p in params])
        if self.codec is None:
            dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)
        else:
            if self.anchor is None:
                raise RuntimeError("torch_ringdist.hooks.local_sgd: no anchor to average "
                                   "deltas against (state restored from an incomplete checkpoint?)")
            base = torch.cat([self.anchor[n].reshape(-1) for n, _ in params])
            flat.sub_(base)
            compressed_bucket(group, flat, self.codec, "local_sgd").wait()
            flat.add_(base)
        offset = 0
        for name, p in params:
            numel = p.numel()
            p.copy_(flat[offset:offset + numel].view_as(p))
            if self.codec is not None:
                self.anchor[name].copy_(p)
            offset += numel
        logger.debug("local_sgd: models averaged after step %s", self.iteration)


def local_sgd_hook(state: LocalSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Post-local SGD. See :class:`LocalSGDState`.

    Args:
        state: a :class:`LocalSGDState`, bound with ``torch_ringdist.hooks.register``.
        bucket: the ``dist.GradBucket`` DDP hands over.

    Returns:
        Future of the averaged bucket (global phase) or of the bucket unchanged (local phase).
    """
    return state(bucket)


add_hook("local_sgd", local_sgd_hook, LocalSGDState)
