"""Train a small MLP on scikit-learn's bundled digits data set under DDP.

    torchrun --nproc-per-node 4 examples/train_ddp.py --backend ringdist --hook none
    torchrun --nproc-per-node 2 examples/train_ddp.py --device cuda --hook int8

Works with any torch.distributed backend (``--backend gloo`` for comparison). With
``--device cuda`` rank r trains on GPU ``LOCAL_RANK % device count``: several ranks share
a GPU when there are fewer GPUs than ranks (which ringdist allows and NCCL does not).
Needs scikit-learn and tqdm (``pip install torch_ringdist[examples]``).
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


# ---------------------------------------------------------------------------
# Communication hooks: name -> function(model, args) that registers it on the
# DDP model. "none" keeps DDP's default allreduce.
# ---------------------------------------------------------------------------

def _hook_none(model, args):
    pass


def _hook_powersgd(model, args):
    # Its error-feedback state is not checkpointed: a resumed run restarts the warm-up.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    opts = dict(args.hook_options)
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=int(opts.pop("matrix_approximation_rank", 2)),
        # PowerSGD needs >= 2 vanilla allreduce steps first (DDP rebuilds its
        # buckets after step 1); a short warm-up keeps the example quick.
        start_powerSGD_iter=int(opts.pop("start_powerSGD_iter", 10)),
        random_seed=args.seed,
    )
    if opts:
        raise SystemExit(f"unknown powersgd options: {sorted(opts)}")
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _hook_fp16_torch(model, args):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model.register_comm_hook(None, default_hooks.fp16_compress_hook)


# This example's defaults where the library's suit longer runs: DiLoCo's default period (500
# inner steps per round) is more than this example's whole run (5 epochs of 22 steps), which
# would then end without a single round.
EXAMPLE_OPTIONS = {"diloco": {"period": 10}}


def available_hooks():
    hooks = {
        "none": _hook_none,
        "powersgd": _hook_powersgd,
        "fp16-torch": _hook_fp16_torch,
    }
    # The project's own hooks, when this torch_ringdist has them.
    try:
        from torch_ringdist import hooks as rd_hooks
    except ImportError:
        return hooks
    if hasattr(rd_hooks, "available") and hasattr(rd_hooks, "register"):
        for name in rd_hooks.available():
            hooks.setdefault(
                name,
                lambda model, args, _n=name: rd_hooks.register(
                    model, _n, **{**EXAMPLE_OPTIONS.get(_n, {}), **args.hook_options}),
            )
    return hooks


# ---------------------------------------------------------------------------

def wire_bytes_sent(backend):
    """Bytes this rank has sent on the default group (ringdist's counters), else None."""
    if backend != "ringdist":
        return None
    import torch_ringdist

    return sum(entry["bytes_sent"] for entry in torch_ringdist.stats().values())


def parse_args(argv=None, hooks=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", default="ringdist", help="torch.distributed backend")
    p.add_argument("--hook", default="none", choices=sorted(hooks) if hooks else None,
                   help="DDP communication hook")
    p.add_argument("--hook-option", dest="hook_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="option passed to the hook (repeatable); here diloco's period is 10 "
                        "unless given (the library's default, 500 steps, is longer than this "
                        "run: no round would run)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split across ranks)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model and batches live (cuda: GPU LOCAL_RANK %% device count)")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="save after every epoch; resume from it if it exists")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (this run)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.hook_options = dict(_parse_option(o, p) for o in args.hook_options)
    return args


def _parse_option(text, parser):
    key, sep, value = text.partition("=")
    if not sep or not key:
        parser.error(f"--hook-option wants KEY=VALUE, got {text!r}")
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def import_backend(backend):
    # `import torch_ringdist` registers the "ringdist" backend; other backends
    # don't need it, so it may be missing then.
    if backend == "ringdist":
        import torch_ringdist  # noqa: F401
    else:
        try:
            import torch_ringdist  # noqa: F401
        except ImportError:
            pass


def make_data(seed):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values are 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.2, random_state=seed, stratify=y.numpy())
    return TensorDataset(x[idx_train], y[idx_train]), TensorDataset(x[idx_test], y[idx_test])


def make_model():
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(),
        nn.Linear(128, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )


def evaluate(model, test_ds, rank, world_size, device):
    """Accuracy on the whole test set; each rank scores a disjoint shard."""
    x, y = test_ds.tensors
    # Strided shards without padding (DistributedSampler would pad with duplicates).
    x, y = x[rank::world_size], y[rank::world_size]
    model.eval()
    with torch.no_grad():
        correct = (model(x.to(device)).argmax(dim=1) == y.to(device)).sum().item()
    model.train()
    # float32 holds these counts exactly and is the dtype every backend supports.
    t = torch.tensor([correct, len(y)], dtype=torch.float32)
    dist.all_reduce(t)
    return t[0].item() / t[1].item()


def save_checkpoint(path, model, optimizer, epoch, loss):
    state = {
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,  # number of completed epochs
        "loss": loss,
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written checkpoint


def main(argv=None):
    hooks = available_hooks()
    args = parse_args(argv, hooks)
    import_backend(args.backend)

    dist.init_process_group(backend=args.backend)  # env:// from torchrun
    rank, world_size = dist.get_rank(), dist.get_world_size()
    is_main = rank == 0

    def log(msg):
        if is_main:
            (bar.write if bar is not None else print)(msg)
            sys.stdout.flush()

    bar = None
    local_batch = max(1, args.batch_size // world_size)
    if is_main and local_batch * world_size != args.batch_size:
        print(f"note: global batch {args.batch_size} is not divisible by {world_size} ranks; "
              f"using {local_batch * world_size}", flush=True)

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)  # same init on every rank (DDP broadcasts rank 0's anyway)
    train_ds, test_ds = make_data(args.seed)
    model = make_model().to(device)  # before the optimizer: its state follows the parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    start_epoch, last_loss = 0, float("nan")
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch, last_loss = ckpt["epoch"], ckpt["loss"]
        if is_main:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch}", flush=True)

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb)
    hook_state = hooks[args.hook](ddp, args)
    # The accumulate hook communicates every K backward passes: step the
    # optimizer (and zero the gradients) only then, as with DDP.no_sync().
    micro_steps = getattr(hook_state, "steps", 1) if args.hook == "accumulate" else 1

    sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    # Only full global batches: global batch k is then the same samples for any
    # world size dividing the batch, so results do not depend on the rank count.
    loader = DataLoader(train_ds, batch_size=local_batch, sampler=sampler, drop_last=True)

    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if is_main:
        print(f"backend={args.backend} device={device} world_size={world_size} hook={args.hook} "
              f"global_batch={local_batch * world_size} params={sum(p.numel() for p in model.parameters())}",
              flush=True)

    show_bar = is_main and not args.no_progress and sys.stderr.isatty()
    if show_bar:
        from tqdm import tqdm
        total = (args.epochs - start_epoch) * len(loader)
        if args.max_steps is not None:
            total = min(total, args.max_steps)
        bar = tqdm(total=max(total, 0), desc="train", unit="step")

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        if args.max_steps is not None and steps >= args.max_steps:
            break
        sampler.set_epoch(epoch)  # new shuffle each epoch, identical on all ranks
        t0 = time.perf_counter()
        stats = torch.zeros(2, dtype=torch.float32)  # sum of loss * n, n
        epoch_steps = 0
        wire_before = wire_bytes_sent(args.backend)
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(ddp(x), y)
            # DDP (or the hook) averages the gradients across ranks here; with
            # micro-steps each backward adds 1/K of its batch's gradient.
            (loss / micro_steps).backward()
            if (i + 1) % micro_steps == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            stats += torch.tensor([loss.item() * len(y), len(y)])
            steps += 1
            epoch_steps += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.4f}")
            if args.max_steps is not None and steps >= args.max_steps:
                break
        wire_after = wire_bytes_sent(args.backend)
        dist.all_reduce(stats)
        last_loss = stats[0].item() / stats[1].item()
        acc = evaluate(ddp.module, test_ds, rank, world_size, device)
        complete = epoch_steps == len(loader)
        if args.checkpoint and complete and is_main:
            save_checkpoint(args.checkpoint, ddp, optimizer, epoch + 1, last_loss)
        dt = time.perf_counter() - t0
        if wire_after is not None:
            # Measured by ringdist: bytes this rank sent, this epoch's training steps only.
            wire = f"wire_bytes_per_step={(wire_after - wire_before) / max(epoch_steps, 1):.0f} (measured)"
        else:
            wire = (f"wire_bytes_per_step~{2 * (world_size - 1) / world_size * grad_bytes:.0f} "
                    f"(estimate for an uncompressed ring allreduce of {grad_bytes} B)")
        log(f"epoch {epoch}: loss={last_loss:.4f} test_accuracy={acc:.4f} steps={epoch_steps} "
            f"time={dt:.2f}s {wire}"
            + ("" if complete else " [partial epoch, not checkpointed]"))

    if bar is not None:
        bar.close()
    if hasattr(hook_state, "detach"):
        hook_state.detach()  # diloco, local_sgd: warns if the run ended without an outer round
    acc = evaluate(ddp.module, test_ds, rank, world_size, device)
    if is_main:
        print(f"final: loss={last_loss:.6f} accuracy={acc:.6f}", flush=True)
    # Keep rank 0's checkpoint write ahead of any rank's exit (torchrun restarts).
    dist.barrier()
    dist.destroy_process_group()
    # A diverged run (NaN/inf loss) is a failure for scripts and CI.
    return 1 if steps and not math.isfinite(last_loss) else 0


if __name__ == "__main__":
    sys.exit(main())
