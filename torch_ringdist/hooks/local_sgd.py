"""Post-local SGD: global allreduce first, then local steps with periodic model averaging (a
DiLoCo round with outer learning rate 1 and no momentum)."""

import torch

from torch_ringdist.hooks._registry import add_hook
from torch_ringdist.hooks.diloco import DiLoCoState

# What a LocalSGDState pickled before local SGD became a DiLoCo round lacks.
_BEFORE_DILOCO = {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False,
                  "error_feedback": False, "fragments": 1, "momentum_buffers": {},
                  "residuals": {}, "rounds": 0, "overlap": "none", "tau": 1, "alpha": 0.5,
                  "in_flight": {}}


class LocalSGDState(DiLoCoState):
    """State of the ``local_sgd`` hook (post-local SGD).

    Steps ``0 .. start_step-1`` average gradients globally (plain, or with
    ``codec``). From ``start_step`` on, every rank steps on its own gradient
    (no communication in backward), and every ``period`` steps the *models*
    are averaged right after ``optimizer.step()``, so all replicas are bitwise
    identical again at that point. With a codec, what is averaged is each
    rank's change since the last averaging (small, gradient-like values that
    quantise well), added to the common anchor, never the weights themselves.

    This is a DiLoCo round (:class:`DiLoCoState`) with outer learning rate 1,
    no momentum and no error feedback; the averaging runs from an optimizer
    step post-hook as there. Call :meth:`average_parameters` yourself to
    average at other times (all ranks together).

    Unlike torch's ``PostLocalSGDState`` this state checkpoints (step counter
    and anchor) and a resumed run continues bitwise identically. Optimizer
    state (e.g. momentum) differs between ranks during local steps: save it
    per rank.

    Args:
        start_step: number of global-allreduce steps before local SGD (default 100).
        period: average the models every this many local steps (default 4).
        codec: None (exact averaging) or ``"fp16"``/``"bf16"``/``"int8"``/``"int4"``
            (compressed gradient allreduce before ``start_step`` and compressed
            model-delta averaging after; ringdist groups only).
        process_group: group (None: the DDP model's group).

    Example::

        >>> state = torch_ringdist.hooks.register(ddp_model, "local_sgd", start_step=100,
        ...                                       period=4, optimizer=opt)
    """

    __slots__ = ()
    _saved = ()
    _name = "local_sgd"

    def __init__(self, start_step: int = 100, period: int = 4, codec: str | None = None,
                 process_group=None):
        super().__init__(period=period, outer_lr=1.0, outer_momentum=0.0, nesterov=False,
                         codec=codec, error_feedback=False, fragments=1, start_step=start_step,
                         process_group=process_group)

    def __setstate__(self, state):
        super().__setstate__({**_BEFORE_DILOCO, **state})

    def bind_module(self, module) -> None:
        super().bind_module(module)
        if self.anchor and isinstance(next(iter(self.anchor)), str):
            # Saved before local SGD became a DiLoCo round: the anchor by parameter name.
            named = self.anchor
            self.anchor = {0: torch.cat([named[n].reshape(-1).to(torch.float32)
                                         for n, _ in self._fragment(0)])}

    @torch.no_grad()
    def average_parameters(self) -> None:
        """Average the bound model's parameters over the group now (collective)."""
        self.run_round(0)


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
