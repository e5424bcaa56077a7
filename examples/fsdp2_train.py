"""FSDP2 (fully_shard) on ringdist, with a DCP checkpoint mid-training and an exact resume.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py --steps 12 --save-at 6 --ckpt /tmp/fsdp2
    torchrun --nproc-per-node 4 examples/fsdp2_train.py --mesh 2x2    # replicate x shard (HSDP)
    torchrun --nproc-per-node 2 examples/fsdp2_train.py --device cuda  # both ranks on one GPU

A small transformer-like model (token embedding, two blocks of causal self-attention and
MLP, output head) learns a fixed synthetic next-token task, every block and the root
sharded with fully_shard over a DeviceMesh of ringdist. With --save-at K the run trains K
steps, saves model and optimizer with torch.distributed.checkpoint (DCP), builds a fresh
sharded model, loads the checkpoint and trains the remaining steps: the losses printed
("step N loss X", the mean over ranks) equal an uninterrupted run's. --backend gloo runs
the same job on gloo for comparison. --device cuda trains on the GPUs, the ranks spread over
them (several ranks share one GPU when there are fewer GPUs than ranks, which NCCL refuses;
ringdist's all-gathers and reduce-scatters then stay on the GPU).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

VOCAB, WIDTH, HEADS, CONTEXT = 64, 32, 4, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        h = self.norm1(x)
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device),
                            diagonal=1)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        """Logits of every position, (batch * context, VOCAB)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        # The head sees positions as rows: nn.Linear on a 3-D input returns a view of its 2-D
        # result, and FSDP2 warns when a sharded module returns a view (an in-place op on it
        # would skip the backward all-gather).
        return self.head(x.flatten(0, 1))


def build(mesh):
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = TinyLM().to(mesh.device_type)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def batch(step, rank, per_rank, device):
    """Rank `rank`'s tokens for `step`: sequences that count up modulo VOCAB from a random start."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, VOCAB, (per_rank, 1), generator=g)
    tokens = (start + torch.arange(CONTEXT + 1)) % VOCAB
    noise = torch.rand(tokens.shape, generator=g) < 0.05
    tokens = torch.where(noise, torch.randint(0, VOCAB, tokens.shape, generator=g), tokens)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def train(model, opt, steps, rank, per_rank):
    device = next(model.parameters()).device.type
    for step in steps:
        x, y = batch(step, rank, per_rank, device)
        loss = F.cross_entropy(model(x), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().double()  # float64: the sum of the ranks' float32 losses is exact
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item() / dist.get_world_size():.9f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="ringdist")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-at", type=int, default=0, help="checkpoint after this many steps, "
                   "then resume from it in a fresh model (0: no checkpoint)")
    p.add_argument("--ckpt", default="/tmp/fsdp2_ckpt", help="DCP checkpoint directory")
    p.add_argument("--mesh", default="", help="RxS: replicate x shard (HSDP); default: shard all")
    p.add_argument("--per-rank", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()

    import torch_ringdist  # noqa: F401  (registers "ringdist")
    torch.set_num_threads(1)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.mesh:
        replicate, shard = (int(v) for v in args.mesh.lower().split("x"))
        mesh = init_device_mesh(args.device, (replicate, shard), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(args.device, (world,), mesh_dim_names=("shard",))
    if rank == 0:
        print(f"backend={args.backend} world_size={world} mesh={tuple(mesh.shape)} "
              f"device={args.device}", flush=True)

    model, opt = build(mesh)
    if not args.save_at:
        train(model, opt, range(args.steps), rank, args.per_rank)
    else:
        train(model, opt, range(args.save_at), rank, args.per_rank)
        model_sd, opt_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=args.ckpt)
        del model, opt
        model, opt = build(mesh)  # fresh weights (seed 0): everything must come from the checkpoint
        model_sd, opt_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": opt_sd}
        dcp.load(state, checkpoint_id=args.ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"resumed from {args.ckpt} after step {args.save_at - 1}", flush=True)
        train(model, opt, range(args.save_at, args.steps), rank, args.per_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
