"""Train the digits MLP with PyTorch Lightning's DDPStrategy on ringdist, with a ringdist hook.

    python examples/lightning_train.py --devices 4 --hook int8 --hook-option error_feedback=true

Lightning starts the other ranks itself (it runs this script again per rank); under
torchrun it uses torchrun's ranks instead. The hook is attached with the
``torch_ringdist.hooks.lightning.RingdistHook`` callback (Lightning's own ``ddp_comm_hook``
argument only takes effect on GPUs). Works with any backend (``--backend gloo`` for
comparison; hooks other than ``none`` need ringdist). Needs lightning and scikit-learn.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the standalone package
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

from train_ddp import _parse_option, import_backend, make_data, make_model


class DigitsModel(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.lr = lr
        self.net = make_model()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", default="ringdist", help="torch.distributed backend")
    p.add_argument("--devices", type=int, default=2, help="ranks on this machine")
    p.add_argument("--hook", default="none", help="a torch_ringdist.hooks name, or none")
    p.add_argument("--hook-option", dest="hook_options", action="append", default=[],
                   metavar="KEY=VALUE", help="option passed to the hook (repeatable)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split across ranks)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", metavar="PATH", help="save at the end; resume from it if it exists")
    args = p.parse_args(argv)
    args.hook_options = dict(_parse_option(o, p) for o in args.hook_options)
    return args


def full_train_loss(model, train_ds):
    """Loss of the final model on the whole training set (same on every rank)."""
    x, y = train_ds.tensors
    with torch.no_grad():
        return F.cross_entropy(model.net(x), y).item()


def main(argv=None):
    args = parse_args(argv)
    import_backend(args.backend)
    pl.seed_everything(args.seed, verbose=False)  # same init on every rank
    train_ds, test_ds = make_data(args.seed)
    model = DigitsModel(args.lr)
    # Lightning adds a DistributedSampler (shuffled with the seed, reseeded per epoch).
    loader = DataLoader(train_ds, batch_size=max(1, args.batch_size // args.devices),
                        shuffle=True, drop_last=True)
    callbacks = []
    if args.hook != "none":
        from torch_ringdist.hooks.lightning import RingdistHook
        callbacks.append(RingdistHook(args.hook, **args.hook_options))
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
        strategy=DDPStrategy(process_group_backend=args.backend),
        callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    resume = args.checkpoint if args.checkpoint and os.path.exists(args.checkpoint) else None
    trainer.fit(model, loader, ckpt_path=resume, weights_only=False)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)

    loss = full_train_loss(model, train_ds)
    x, y = test_ds.tensors
    with torch.no_grad():
        acc = (model.net(x).argmax(dim=1) == y).float().mean().item()
    if trainer.global_rank == 0:
        hook_steps = callbacks[0].state.iteration if callbacks else trainer.global_step
        print(f"backend={args.backend} world_size={trainer.world_size} hook={args.hook} "
              f"steps={trainer.global_step} hook_steps={hook_steps}"
              + (f" resumed_from={resume}" if resume else ""), flush=True)
        print(f"final: loss={loss:.6f} accuracy={acc:.6f}", flush=True)
    # No destroy_process_group: Lightning leaves the group to interpreter exit, and so
    # does this script, which must still exit quietly.
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
