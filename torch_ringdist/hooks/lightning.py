"""Attach a ringdist DDP hook to a PyTorch Lightning run.

    from torch_ringdist.hooks.lightning import RingdistHook
    trainer = lightning.Trainer(accelerator="cpu", devices=4,
                                strategy=DDPStrategy(process_group_backend="ringdist"),
                                callbacks=[RingdistHook("int8", error_feedback=True)])

Lightning's own ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)`` registers the hook
only when the model is on a GPU and silently ignores it on the CPU; this callback registers
any ringdist hook on the strategy's DDP model whatever the device, once the model is
wrapped and before the first backward pass. The hook state is saved in Lightning's
checkpoints (every rank's: error-feedback residuals differ per rank) and restored, on the
same number of ranks, with ``trainer.fit(..., ckpt_path=path, weights_only=False)`` (the
state is a Python object, not plain tensors).
"""
try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torch_ringdist import hooks


class RingdistHook(Callback):
    """Registers ringdist hook ``name`` (one of ``torch_ringdist.hooks.available()``) with
    ``options`` on the DDP model at the start of ``fit``. ``state`` holds the hook state."""

    def __init__(self, name: str, **options):
        hooks.make_state(name, **options)  # bad names and options fail here, not mid-launch
        self.name = name
        self.options = options
        self.state = None

    def on_fit_start(self, trainer, pl_module):
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"RingdistHook({self.name!r}) needs Lightning's DDPStrategy; the "
                            f"strategy {type(trainer.strategy).__name__} wraps the model in "
                            f"{type(model).__name__}")
        optimizer = trainer.optimizers[0] if self.name in ("local_sgd", "diloco") else None
        if self.state is None:
            self.state = hooks.register(model, self.name, optimizer=optimizer, **self.options)
        else:  # restored from a checkpoint
            hooks.register(model, self.name, state=self.state, optimizer=optimizer)

    def state_dict(self):
        # Lightning calls this on every rank but writes rank 0's checkpoint only, and
        # error-feedback residuals differ per rank: rank 0 saves everyone's state.
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, self.state)
        return {"name": self.name, "states": states}

    def load_state_dict(self, state_dict):
        rank, world = dist.get_rank(), dist.get_world_size()
        if state_dict["name"] != self.name:
            raise ValueError(f"RingdistHook: rank {rank}: the checkpoint holds the state of hook "
                             f"{state_dict['name']!r}, this run uses {self.name!r}")
        if len(state_dict["states"]) != world:
            raise ValueError(f"RingdistHook: rank {rank}: the checkpoint holds hook states of "
                             f"{len(state_dict['states'])} ranks, this run has {world}")
        self.state = state_dict["states"][rank]
