#!/usr/bin/env python3
"""Held-out loss of DiLoCo against data parallel on a byte-level language model, in one world:

    torchrun --nproc-per-node 2 benchmarks/diloco_convergence.py --steps 600 --period 25 \
        --json out.json

Text: the CPython standard library's sources (every machine with Python has them), the first
--text-mb MiB of its .py files in sorted order; the last tenth is held out. Model: a small
decoder-only transformer over bytes. Every algorithm starts from the same seed, sees the same
samples (each rank its own stream, --batch per rank per step) with AdamW as the (inner)
optimizer, and ends with the held-out loss in nats per byte of the model every rank holds then
(steps a multiple of --period: the last step ends with a round), averaged over the ranks.
Algorithms: `ddp` (DDP's own allreduce), `diloco` (outer Nesterov SGD, --outer-lr, momentum
0.9), `diloco-int8` and `diloco-int4` (int8 or 4-bit pseudo-gradients with error feedback),
`diloco-streaming` (4 int4 fragments, each exchange overlapped with 2 inner steps; the last
rounds in flight are completed after the last step; replicas differ by their own mix),
`diloco-eager` (each round's exchange overlapped with the next period, eager updates),
`local_sgd` (plain averaging every --period steps).
"""
import argparse
import glob
import math
import os
import sys
import sysconfig
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ALGOS = ("ddp", "diloco", "diloco-int8", "diloco-int4", "diloco-streaming", "diloco-eager",
         "local_sgd")
# Streaming DiLoCo as run across the emulated WAN (docs/wan.md): int4 fragments overlapped.
STREAMING = {"codec": "int4", "fragments": 4, "overlap": "streaming", "tau": 2}


def stdlib_text(megabytes):
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    chunks, size = [], 0
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        size += len(data)
        if size >= megabytes * (1 << 20):
            break
    text = torch.frombuffer(bytearray(b"".join(chunks)[:int(megabytes * (1 << 20))]),
                            dtype=torch.uint8).long()
    cut = len(text) * 9 // 10
    return text[:cut], text[cut:]


class ByteLM(nn.Module):
    def __init__(self, dim, layers, heads, context):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context),
                             persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.pos[:t]
        return self.head(self.blocks(h, mask=self.mask[:t, :t], is_causal=True))


def batch(text, generator, size, context):
    start = torch.randint(0, len(text) - context - 1, (size,), generator=generator)
    idx = start[:, None] + torch.arange(context + 1)
    window = text[idx]
    return window[:, :-1], window[:, 1:]


def held_out_loss(model, text, context, batches=16, size=16):
    g = torch.Generator().manual_seed(12345)
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            x, y = batch(text, g, size, context)
            total += F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    return total / batches


def train(algo, args, train_text, eval_text):
    """One algorithm from the same start; returns the held-out loss every rank agrees on."""
    import torch_ringdist.hooks as hooks

    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = ByteLM(args.dim, args.layers, args.heads, args.context)
    ddp = DDP(model)
    inner = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.0)
    state = None
    if algo == "diloco-streaming":
        state = hooks.register(ddp, "diloco", optimizer=inner, period=args.period,
                               outer_lr=args.outer_lr, **{**STREAMING, **dict(args.streaming)})
    elif algo.startswith("diloco"):
        hooks.register(ddp, "diloco", optimizer=inner, period=args.period, outer_lr=args.outer_lr,
                       codec=algo[7:] if algo.startswith("diloco-int") else None,
                       overlap="eager" if algo == "diloco-eager" else "none")
    elif algo == "local_sgd":
        hooks.register(ddp, "local_sgd", optimizer=inner, start_step=0, period=args.period)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    for step in range(args.steps):
        for group in inner.param_groups:  # linear warm-up, then cosine to a tenth
            warm = min(1.0, (step + 1) / args.warmup)
            decay = 0.55 + 0.45 * math.cos(math.pi * step / args.steps)
            group["lr"] = args.lr * warm * decay
        x, y = batch(train_text, g, args.batch, args.context)
        inner.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x).reshape(-1, 256), y.reshape(-1)).backward()
        inner.step()
    if state is not None:  # streaming: the last rounds' exchanges complete
        state.finish()
    loss = held_out_loss(model, eval_text, args.context)
    # Replicas agree after the last round (eager: up to the timing of their own shares).
    spread = torch.tensor([loss, -loss], dtype=torch.float64)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    mean = torch.tensor([loss], dtype=torch.float64)
    dist.all_reduce(mean)
    return {"held_out": mean.item() / dist.get_world_size(),
            "rank_spread": spread[0].item() + spread[1].item()}


def _option(text):
    key, value = text.split("=", 1)
    for parse in (int, float):
        try:
            return key, parse(value)
        except ValueError:
            pass
    return key, value


def add_args(p):
    p.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--period", type=int, default=25)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--text-mb", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streaming", nargs="*", default=[], type=_option, metavar="KEY=VALUE",
                   help="diloco-streaming's options in place of " + repr(STREAMING) +
                        " (e.g. tau=1 alpha=0.25 overlap=none)")


def run(args):
    """Every algorithm in turn; {algo: {held_out, rank_spread, seconds}} (on every rank)."""
    if args.steps % args.period:
        raise SystemExit(f"--steps {args.steps} must be a multiple of --period {args.period}")
    train_text, eval_text = stdlib_text(args.text_mb)
    results = {}
    for algo in args.algos:
        start = time.perf_counter()
        results[algo] = train(algo, args, train_text, eval_text)
        results[algo]["seconds"] = time.perf_counter() - start
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    import torch_ringdist  # noqa: F401  registers "ringdist"
    dist.init_process_group("ringdist")
    results = run(args)
    if dist.get_rank() == 0:
        base = results.get("ddp", {}).get("held_out")
        for algo, r in results.items():
            rel = f" ({(r['held_out'] / base - 1) * 100:+.2f}% vs ddp)" if base else ""
            print(f"{algo:<12} held-out {r['held_out']:.4f} nats/byte{rel}  "
                  f"{r['seconds']:.0f} s", flush=True)
        if args.json:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from bench_common import machine_info, write_json
            write_json(args.json, {"machine": machine_info(), "world_size": dist.get_world_size(),
                                   "args": vars(args), "results": results,
                                   "command": sys.argv})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
