"""Tensor-parallel CPU inference on ringdist: a small decoder-only transformer (random weights
from a fixed seed, nothing downloaded) split over the ranks of one host, generating tokens
greedily.

    torchrun --nproc-per-node 2 examples/tp_inference.py                  # torch's tensor-parallel API
    torchrun --nproc-per-node 2 examples/tp_inference.py --mode direct    # the direct operators

--mode dtensor (default): torch's tensor-parallel API (``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel`` over a DeviceMesh of --backend, ringdist by default;
DTensor runs the collectives). --mode direct: every rank holds the same shards as plain tensors
and the model calls ``torch_ringdist.direct_all_reduce`` after each row-parallel projection and
``direct_all_gather`` for the vocabulary-parallel logits. --mode deepspeed: the same shards with
DeepSpeed's ``torch.ops.deepspeed.inference_all_reduce_`` (if installed) for the allreduces.
--mode no-comm: the same shards with the collectives skipped (wrong tokens; the time per token
without communication, the bound L). --mode sync-only: each collective replaced by a one-element
direct allreduce (wrong tokens; the ranks still wait for each other at every collective, so
this is L plus the synchronisation, with next to no data). --mode spin-barrier: each collective
replaced by the cheapest wait for the other ranks there is, no backend at all: a counter per
rank in shared memory, spun on from Python (wrong tokens; no collective can cost less, since no
rank leaves one before every rank reached it). Rank 0 also runs the whole model in this process and checks
the tokens are equal (float64 by default, so summation order cannot flip an argmax). Prints
``tokens: ...`` and ``ms/token``.
"""
import argparse
import ctypes
import mmap
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_ringdist

VOCAB = 256


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        # Column-parallel qkv holds this rank's heads: their number follows from the width.
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        heads = q.shape[-1] // self.head_dim
        q, k, v = (z.reshape(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, dim, heads, layers, context):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


# ---------------------------------------------------------------- the direct-operator model

def all_reduce_with(mode, barrier):
    """The allreduce a row-parallel layer ends with, in place."""
    if mode == "direct":
        return torch_ringdist.direct_all_reduce
    if mode == "deepspeed":
        return torch.ops.deepspeed.inference_all_reduce_
    if mode == "sync-only":
        return lambda y: torch_ringdist.direct_all_reduce(SYNC_TOKEN)
    if mode == "spin-barrier":
        return lambda y: barrier()
    return lambda y: y  # no-comm


# sync-only: what each collective all-reduces instead of its data.
SYNC_TOKEN = torch.zeros(1)


class SpinBarrier:
    """spin-barrier: the ranks of this host wait for each other through a page of shared
    memory and nothing else. Each call raises this rank's counter (one per cache line) and
    spins until every rank's counter got there."""

    def __init__(self):
        rank, self.size = dist.get_rank(), dist.get_world_size()
        names = [None]
        if rank == 0:
            fd, names[0] = tempfile.mkstemp(prefix="ringdist_tp_barrier_", dir="/dev/shm")
            os.ftruncate(fd, 64 * self.size)
            os.close(fd)
        dist.broadcast_object_list(names, src=0)
        with open(names[0], "r+b") as f:
            self.page = mmap.mmap(f.fileno(), 64 * self.size)
        dist.barrier()  # everyone has it mapped
        if rank == 0:
            os.unlink(names[0])
        self.counters = (ctypes.c_int64 * (8 * self.size)).from_buffer(self.page)
        self.mine = 8 * rank
        self.generation = 0

    def __call__(self):
        self.generation += 1
        reached, counters = self.generation, self.counters
        counters[self.mine] = reached
        for r in range(0, 8 * self.size, 8):
            while counters[r] < reached:
                pass


class RowParallel(nn.Module):
    """This rank's input columns of a linear layer; the partial products summed over the
    ranks."""

    def __init__(self, linear, rank, size, all_reduce):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, dim=1)[rank].clone())
        self.all_reduce = all_reduce

    def forward(self, x):
        y = x @ self.weight.t()
        self.all_reduce(y)
        return y


def column_shard(linear, rank, size, parts=1):
    """This rank's output rows of a linear layer; `parts` blocks (q, k, v) each split alike."""
    blocks = linear.weight.detach().chunk(parts, dim=0)
    shard = torch.cat([b.chunk(size, dim=0)[rank] for b in blocks])
    layer = nn.Linear(shard.shape[1], shard.shape[0], bias=False)
    layer.weight = nn.Parameter(shard.clone())
    return layer


class GatheredHead(nn.Module):
    """Vocabulary-parallel logits, gathered across the ranks (comm "gather"; "none", "sync" and
    "spin" repeat this rank's logits instead, "sync" after a one-element allreduce, "spin" after
    the spin barrier)."""

    def __init__(self, linear, rank, size, comm, barrier=None):
        super().__init__()
        self.shard = column_shard(linear, rank, size)
        self.comm = comm
        self.barrier = barrier

    def forward(self, x):
        local = self.shard(x)  # (b, t, VOCAB / size)
        if self.comm != "gather":
            if self.comm == "sync":
                torch_ringdist.direct_all_reduce(SYNC_TOKEN)
            elif self.comm == "spin":
                self.barrier()
            return local.repeat(1, 1, dist.get_world_size())
        parts = torch_ringdist.direct_all_gather(local.movedim(-1, 0).contiguous())
        return parts.movedim(0, -1)


def shard_directly(model, rank, size, mode):
    barrier = SpinBarrier() if mode == "spin-barrier" else None
    all_reduce = all_reduce_with(mode, barrier)
    for block in model.blocks:
        block.attn.qkv = column_shard(block.attn.qkv, rank, size, parts=3)
        block.attn.out = RowParallel(block.attn.out, rank, size, all_reduce)
        block.up = column_shard(block.up, rank, size)
        block.down = RowParallel(block.down, rank, size, all_reduce)
    comm = {"no-comm": "none", "sync-only": "sync", "spin-barrier": "spin"}.get(mode, "gather")
    model.lm_head = GatheredHead(model.lm_head, rank, size, comm, barrier)
    return model


def shard_with_dtensor(model, mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    plan = {}
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.out": RowwiseParallel(),
                     f"blocks.{i}.up": ColwiseParallel(), f"blocks.{i}.down": RowwiseParallel()})
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return parallelize_module(model, mesh, plan)


def dtensor_qkv_order(model, size):
    """ColwiseParallel shards qkv's rows in plain chunks; reorder them so each rank's chunk
    holds its own q, k and v heads (what Attention expects), as the direct shards do."""
    for block in model.blocks:
        w = block.attn.qkv.weight.detach()
        q, k, v = (part.chunk(size, dim=0) for part in w.chunk(3, dim=0))
        block.attn.qkv.weight = nn.Parameter(torch.cat([torch.cat([q[r], k[r], v[r]])
                                                        for r in range(size)]))


@torch.no_grad()
def generate(model, prompt, steps):
    tokens = prompt
    for _ in range(steps):
        logits = model(tokens)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[0, prompt.shape[1]:].tolist()


def build(args):
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    model = Decoder(args.dim, args.heads, args.layers, args.prompt + args.tokens).to(dtype).eval()
    prompt = torch.randint(0, VOCAB, (1, args.prompt))
    return model, prompt


def add_model_args(p):
    """The model and the generation (build() and generate() read them)."""
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--seed", type=int, default=0)


def init_deepspeed(backend):
    """The default process group through DeepSpeed (its shared-memory allreduce needs
    LOCAL_SIZE), on `backend`; returns the deepspeed module. DeepSpeed never unlinks the buffer
    it creates in /dev/shm (66 MB a rank); every rank maps every buffer during the set-up, so
    once all are through it each rank unlinks its own, and nothing is left however it exits."""
    import deepspeed  # builds its shared-memory op on first use
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    deepspeed.init_distributed(dist_backend=backend)
    dist.barrier()
    buffer = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
              f"{os.environ.get('MASTER_PORT', '')}_{dist.get_rank()}")
    if os.path.exists(buffer):
        os.unlink(buffer)
    return deepspeed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="dtensor",
                   choices=["dtensor", "direct", "deepspeed", "no-comm", "sync-only",
                            "spin-barrier"])
    p.add_argument("--backend", default="ringdist", help="the process group's backend")
    add_model_args(p)
    p.add_argument("--repeat", type=int, default=3, help="timed generations after a warm-up")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.mode == "deepspeed":
        init_deepspeed(args.backend)
    else:
        dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    for what, n in (("--heads", args.heads), ("--dim", args.dim), ("vocabulary", VOCAB)):
        if n % size:
            raise SystemExit(f"tp_inference: {what} ({n}) must divide by the {size} ranks")

    model, prompt = build(args)
    reference = generate(model, prompt, args.tokens) if rank == 0 else None
    mode = args.mode
    if mode == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        dtensor_qkv_order(model, size)
        model = shard_with_dtensor(model, init_device_mesh("cpu", (size,)))
    else:
        model = shard_directly(model, rank, size, mode)

    tokens = generate(model, prompt, args.tokens)  # warm-up, and the tokens checked
    times = []
    for _ in range(args.repeat):
        dist.barrier()
        start = time.perf_counter()
        generate(model, prompt, args.tokens)
        times.append((time.perf_counter() - start) / args.tokens)
    if rank == 0:
        same = tokens == reference
        print(f"mode {mode}, {args.backend}, {size} ranks, {args.dtype}: tokens: {tokens}")
        print(f"ms/token: {' '.join(f'{t * 1e3:.3f}' for t in times)} (median "
              f"{sorted(times)[len(times) // 2] * 1e3:.3f})")
        print("tokens equal the one-process run" if same else
              f"TOKENS DIFFER from the one-process run: {reference}")
        if not same and mode not in ("no-comm", "sync-only", "spin-barrier"):  # these do not sum
            os._exit(1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
