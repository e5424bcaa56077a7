"""Collectives, point-to-point, hooks and DDP on CUDA tensors, several ranks on the one GPU.

The collective matrix is test_collectives.py's own worker code run with CUDA as the
default device (its inputs, outputs and float64/int64 references all live on the GPU;
digests and comparisons copy to the host). The CUDA-only behaviour is checked against
the same operation on CPU tensors in the same world (hooks bit for bit, DDP within
float tolerance, since CPU and GPU matmuls round differently) and against closed forms.

Needs a CUDA build of ringdist and a GPU; skipped otherwise (CI has no GPU).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import test_collectives as tc
from torch_ringdist._extension import load
from harness.world import default_backend

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not (load().cuda_compiled() and torch.cuda.is_available()) or default_backend() != "ringdist",
        reason="needs ringdist built with CUDA (TORCH_RINGDIST_CUDA=1), a GPU, and the ringdist backend"),
]

# Every rank on device 0: what NCCL refuses ("Duplicate GPU detected"). "fused" worlds take the
# same-GPU path (RINGDIST_CUDA_FUSED=1: stream-ordered hand-offs, one fused kernel per
# allreduce, allgather, reduce-scatter, broadcast and reduce; csrc/gpu/same_gpu.h), in
# "fused-expandable" from expandable segments, which cannot be lent, so every call goes through
# the ranks' scratch. By default allreduce goes GPU to GPU through CUDA IPC buffers from 2 MiB
# and everything else through pinned host memory; "ipc" and "ipc64K" take the IPC buffers at
# every size, "ipc64K" with tiny buffers (large allreduces in many pieces); "staged" never
# leaves the pinned host path; "pipelined" copies to and from it while the ring runs.
WORLDS = [(2, "default"), (4, "default"), (2, "tcp"), (3, "64"), (3, "ipc64K"), (2, "staged"),
          (2, "fused"), (4, "fused"), (2, "fused-expandable")]
WORLD_IDS = [f"ws{w}-{s}" for w, s in WORLDS]
world_params = pytest.mark.parametrize("ws,seg", WORLDS, ids=WORLD_IDS)
IPC_ENV = {"ipc": {"RINGDIST_CUDA_IPC_MIN_BYTES": "0"},
           "ipc64K": {"RINGDIST_CUDA_IPC_MIN_BYTES": "0", "RINGDIST_CUDA_IPC_BYTES": "65536"},
           "fused": {"RINGDIST_CUDA_FUSED": "1"},
           "fused-expandable": {"RINGDIST_CUDA_FUSED": "1",
                                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
           "staged": {"RINGDIST_CUDA_IPC_BYTES": "0"},
           # Through host memory with the copies overlapping the ring (StageGate) from 64 KiB;
           # single copy off, so the ring runs as it would between hosts.
           "pipelined": {"RINGDIST_CUDA_IPC_BYTES": "0", "RINGDIST_CUDA_PIPELINE_BYTES": "64K",
                         "RINGDIST_SINGLE_COPY": "0"}}


def _env(ws, seg):
    return dict(IPC_ENV[seg]) if seg in IPC_ENV else tc.world_env_for(ws, seg)


def _on_cuda(rank, ws, case, *args, **kwargs):
    """Runs test_collectives' worker function ``case`` with CUDA as the default device."""
    torch.cuda.set_device(0)
    with torch.device("cuda"):
        return getattr(tc, case)(rank, ws, *args, **kwargs)


def _run(world_factory, ws, seg, case, *args, **kwargs):
    world = world_factory(ws, env=_env(ws, seg))
    return world.run(_on_cuda, case, *args, timeout=300, **kwargs)


# ------------------------------------------------------------ GPU to GPU = the CPU path
def _w_same_bits_as_cpu(rank, ws, counts):
    """all_reduce on CUDA tensors against all_reduce of the same values on CPU tensors in
    the same world, bit for bit: the GPU path combines each element in the CPU path's
    order (rank order for small buffers, ring order for large ones)."""
    torch.cuda.set_device(0)
    out = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
            for n in counts:
                g = torch.Generator().manual_seed(7919 * rank + n)
                x = (torch.randn(n, generator=g) * 100).to(dtype)
                cpu, gpu = x.clone(), x.cuda()
                dist.all_reduce(cpu, op=op)
                dist.all_reduce(gpu, op=op)
                got = gpu.cpu()
                same = torch.equal(got.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                                   cpu.view(torch.int16 if dtype.itemsize == 2 else torch.int32))
                key = f"{dtype} {op} n={n}"
                out[key] = (None if same else
                            f"differs from the CPU path ({(got.double() - cpu.double()).abs().max()})",
                            tc.digest(got))
    return out


def _w_gather_scatter_same_as_cpu(rank, ws, counts):
    """all_gather_into_tensor (out of place, and in place as FSDP2 calls it: the input a view
    of the rank's own block) and reduce_scatter_tensor on CUDA tensors against the same calls
    on CPU tensors, bit for bit."""
    torch.cuda.set_device(0)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in counts:
            g = torch.Generator().manual_seed(7919 * rank + n)
            x = (torch.randn(n * ws, generator=g) * 100).to(dtype)
            block = x[:n].clone()
            cpu = torch.empty(n * ws, dtype=dtype)
            dist.all_gather_into_tensor(cpu, block)
            gpu = torch.full((n * ws,), 7, dtype=dtype, device="cuda")
            dist.all_gather_into_tensor(gpu, block.cuda())
            in_place = torch.full((n * ws,), 7, dtype=dtype, device="cuda")
            in_place[rank * n:(rank + 1) * n] = block.cuda()
            dist.all_gather_into_tensor(in_place, in_place[rank * n:(rank + 1) * n])
            for key, got in ((f"all_gather {dtype} n={n}", gpu),
                             (f"all_gather in place {dtype} n={n}", in_place)):
                same = torch.equal(got.cpu(), cpu)
                out[key] = (None if same else f"{key}: differs from the CPU path",
                            tc.digest(got.cpu()))
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) if dtype != torch.int64 else (
                    dist.ReduceOp.MAX,):
                cpu = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(cpu, x, op=op)
                gpu = torch.full((n,), 7, dtype=dtype, device="cuda")
                dist.reduce_scatter_tensor(gpu, x.cuda(), op=op)
                got = gpu.cpu()
                same = torch.equal(got.view(torch.uint8), cpu.view(torch.uint8))
                key = f"reduce_scatter {dtype} {op} n={n}"
                out[key] = (None if same else f"{key}: differs from the CPU path", tc.digest(got))
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_cuda_pipelined_gather_scatter_same_bits_as_cpu(world_factory, ws):
    """The staged allgather and reduce-scatter with copies overlapping the ring (single copy
    off, so the ring runs as between hosts), from 64 KiB, up to several 2 MiB pieces."""
    counts = [1, 1000, 300001, 1500001]
    tc.assert_cases(world_factory(ws, env=_env(ws, "pipelined")).run(
        _w_gather_scatter_same_as_cpu, counts, timeout=240), check_digests=False)


@pytest.mark.parametrize("ws,seg", [(2, "fused"), (3, "fused"), (4, "fused"), (2, "ipc"),
                                    (3, "ipc"), (4, "ipc64K"), (2, "fused-expandable"),
                                    (2, "pipelined"), (3, "pipelined")],
                         ids=["ws2-fused", "ws3-fused", "ws4-fused", "ws2-ipc", "ws3-ipc",
                              "ws4-ipc64K", "ws2-fused-expandable", "ws2-pipelined",
                              "ws3-pipelined"])
def test_cuda_all_reduce_same_bits_as_cpu(world_factory, ws, seg):
    counts = [1, 5, 1000, 16385, 300001]  # both sides of the 64 KiB one-round threshold
    if seg == "pipelined":
        counts.append(3000001)  # several 2 MiB pieces per chunk
    tc.assert_cases(world_factory(ws, env=_env(ws, seg)).run(_w_same_bits_as_cpu, counts,
                                                             timeout=240))


# ------------------------------------------------------------ the collective matrix
@world_params
def test_cuda_all_reduce_every_dtype_and_op(world_factory, ws, seg):
    res = _run(world_factory, ws, seg, "_case_all_reduce", tc.DTYPE_OPS,
               tc.counts_for(seg, True), tc.DENSE)
    tc.assert_cases(res)


@world_params
def test_cuda_all_reduce_async_and_strided(world_factory, ws, seg):
    cases = [("float32", "SUM"), ("int64", "MAX"), ("bool", "BOR"), ("bfloat16", "AVG")]
    tc.assert_cases(_run(world_factory, ws, seg, "_case_all_reduce", cases,
                         tc.counts_for(seg, True), tc.DENSE, async_op=True))
    tc.assert_cases(_run(world_factory, ws, seg, "_case_all_reduce", tc.LAYOUT_DTYPE_OPS,
                         tc.SMALL_COUNTS, ["strided"]))


@world_params
def test_cuda_reduce_and_reduce_scatter(world_factory, ws, seg):
    cases = [("float32", "SUM"), ("float16", "MAX"), ("int32", "BXOR"), ("bfloat16", "AVG")]
    tc.assert_cases(_run(world_factory, ws, seg, "_case_reduce", cases, tc.SMALL_COUNTS,
                         tc.DENSE), check_digests=False)
    for variant in ("list", "list_strided", "tensor", "tensor_stacked", "tensor_strided"):
        tc.assert_cases(_run(world_factory, ws, seg, "_case_reduce_scatter", cases,
                             tc.counts_for(seg, True), variant))
    for dtype, op in cases:
        tc.assert_cases(_run(world_factory, ws, seg, "_case_all_reduce_coalesced", dtype, op,
                             [0, 1, 7, 1001, 33]))


@world_params
def test_cuda_data_movement(world_factory, ws, seg):
    dtypes = ["float32", "bfloat16", "int8", "bool", "int64"]
    counts = tc.counts_for(seg, True)
    tc.assert_cases(_run(world_factory, ws, seg, "_case_broadcast", dtypes, counts,
                         tc.DENSE + ["strided"]))
    for variant in ("list", "list_strided", "tensor", "tensor_stacked", "tensor_strided_input",
                    "tensor_in_place"):
        tc.assert_cases(_run(world_factory, ws, seg, "_case_all_gather", dtypes, counts, variant))
    for layout in ("contig", "strided"):
        tc.assert_cases(_run(world_factory, ws, seg, "_case_gather", dtypes, tc.SMALL_COUNTS,
                             layout))
        tc.assert_cases(_run(world_factory, ws, seg, "_case_scatter", dtypes, tc.SMALL_COUNTS,
                             layout))
    for uneven in (False, True):
        tc.assert_cases(_run(world_factory, ws, seg, "_case_all_to_all", dtypes, [0, 3, 1001],
                             uneven))
    for variant in ("even", "uneven", "noncontig_input", "noncontig_output"):
        tc.assert_cases(_run(world_factory, ws, seg, "_case_all_to_all_single", dtypes,
                             [0, 3, 1001], variant))


@world_params
def test_cuda_send_recv(world_factory, ws, seg):
    tc.assert_cases(_run(world_factory, ws, seg, "_case_send_recv",
                         ["float32", "int8", "bool"], tc.counts_for(seg, True)))


def _w_device_messages(rank, ws):
    """Same-GPU point-to-point (RINGDIST_CUDA_FUSED=1, after the set-up that the group's first
    CUDA collective runs): every message GPU to GPU (device_messages counts them), bits equal
    what was sent, in the orders a stream-ordered design could deadlock on."""
    import torch_ringdist

    torch.cuda.set_device(0)
    dist.all_reduce(torch.ones(4, device="cuda"))  # the set-up
    torch_ringdist.reset_stats()
    out = {}
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    sent = 0

    def data(sender, tag, n, dtype=torch.float32):
        g = torch.Generator().manual_seed(1000 * sender + tag)
        return (torch.randn(n, generator=g) * 100).to(dtype).cuda()

    # Both ranks post their receive before their send (NCCL's streams would hang here).
    for n in (0, 1, 1000, (1 << 20) + 3):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            got = torch.full((n,), 7, dtype=dtype, device="cuda")
            r = dist.irecv(got, src=prv, tag=3)
            s = dist.isend(data(rank, 3, n, dtype), dst=nxt, tag=3)
            r.wait()
            s.wait()
            sent += 1
            ok = torch.equal(got.cpu(), data(prv, 3, n, dtype).cpu())
            out[f"recv before send n={n} {dtype}"] = None if ok else "wrong bytes"
    # Tags taken in the opposite order; any source; into a strided view.
    a, b = data(rank, 11, 5000), data(rank, 12, 5000)
    ra, rb = torch.empty_like(a), torch.empty_like(b)
    works = [dist.isend(a, dst=nxt, tag=11), dist.isend(b, dst=nxt, tag=12),
             dist.irecv(rb, src=prv, tag=12), dist.irecv(ra, tag=11)]
    for w in works:
        w.wait()
    sent += 2
    out["tags reversed, any source"] = None if torch.equal(ra, data(prv, 11, 5000)) and \
        torch.equal(rb, data(prv, 12, 5000)) else "wrong bytes"
    strided = torch.zeros(2 * 3000, device="cuda")[::2]
    r = dist.irecv(strided, src=prv, tag=13)
    dist.send(data(rank, 13, 3000), dst=nxt, tag=13)
    r.wait()
    sent += 1
    out["strided receive"] = None if torch.equal(strided, data(prv, 13, 3000)) else "wrong bytes"
    # The data is written behind slow work on the caller's stream; the sender reuses its buffer
    # right after wait(): the receiver sees exactly what was there at the send.
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda._sleep(50_000_000)
    x.fill_(rank + 1.0)
    got = torch.zeros_like(x)
    r = dist.irecv(got, src=prv, tag=14)
    s = dist.isend(x, dst=nxt, tag=14)
    s.wait()
    x.fill_(-1.0)
    r.wait()
    sent += 1
    out["stream order"] = None if bool((got == prv + 1.0).all()) else f"got {got[:3]}"
    counted = sum(v["device_messages"] for v in torch_ringdist.stats().values())
    out["every send GPU to GPU"] = None if counted == sent else f"{counted} of {sent}"
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_cuda_same_gpu_messages(world_factory, ws):
    tc.assert_cases(world_factory(ws, env={"RINGDIST_CUDA_FUSED": "1"}).run(
        _w_device_messages, timeout=180), check_digests=False)


# ------------------------------------------------------------ stream semantics
def _w_streams(rank, ws):
    torch.cuda.set_device(0)
    out = {}
    n = 1 << 20
    # Queued behind slow work on the caller's stream: the op must see its result.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(n, device="cuda")
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time
        x.fill_(rank + 1.0)
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # side stream now waits for the op's copy-back
        y = x * 2    # queued on the side stream after the wait
    side.synchronize()
    want = 2.0 * ws * (ws + 1) / 2
    out["ordered after the caller's stream"] = None if bool((y == want).all()) else \
        f"got {y[0].item()} expected {want}"
    # Two ops on one tensor without waiting in between: issue order holds on the GPU.
    z = torch.full((n,), float(rank + 1), device="cuda")
    w1 = dist.all_reduce(z, async_op=True)
    w2 = dist.all_reduce(z, async_op=True)
    w2.wait()
    w1.wait()
    want2 = float(ws * (ws * (ws + 1) // 2))
    out["issue order"] = None if bool((z == want2).all()) else f"got {z[0].item()} want {want2}"
    # The future is CUDA-aware: a callback sees the result and runs on the GPU.
    v = torch.full((1000,), float(rank), device="cuda")
    fut = dist.all_reduce(v, async_op=True).get_future().then(lambda f: f.value()[0] * 3)
    got = fut.wait()
    want3 = 3.0 * ws * (ws - 1) / 2
    out["future chain"] = None if got.is_cuda and bool((got == want3).all()) else \
        f"got {got[:3]} on {got.device}, want {want3}"
    # synchronize(): the caller's stream waits; is_completed() once everything is done.
    u = torch.ones(n, device="cuda")
    work = dist.all_reduce(u, async_op=True)
    work.synchronize()
    s = u.sum()  # on the current stream, after the wait
    torch.cuda.current_stream().synchronize()
    out["synchronize"] = None if s.item() == n * ws and work.is_completed() else \
        f"sum {s.item()} completed {work.is_completed()}"
    # Mixed devices and a CPU tensor on the same group.
    cpu = torch.full((5,), float(rank + 1))
    dist.all_reduce(cpu)
    out["cpu tensor on the same group"] = None if bool((cpu == ws * (ws + 1) / 2).all()) else \
        f"got {cpu}"
    try:
        dist.all_gather([torch.empty(3, device="cuda") for _ in range(ws)], torch.ones(3))
        out["mixed devices"] = "no error for a CPU input with CUDA outputs"
    except (RuntimeError, ValueError) as exc:
        # ringdist's own check names the op, the rank and both devices; torch's Python layer
        # may refuse the mix before the backend sees it, also naming the devices.
        out["mixed devices"] = None if "device" in str(exc).lower() else f"unclear error: {exc}"
    return out


@pytest.mark.parametrize("ws", [2, 4])
def test_cuda_stream_semantics(world_factory, ws):
    tc.assert_cases(world_factory(ws).run(_w_streams, timeout=120), check_digests=False)


# ------------------------------------------------------------ hooks and DDP
def _bucket(buffer):
    from torch_ringdist.hooks._base import VirtualBucket
    return VirtualBucket(0, buffer, [buffer], [], True)


def _w_hooks(rank, ws, steps):
    """Each hook on a CUDA bucket against the same hook on the same CPU bucket, bit for bit."""
    from torch_ringdist.hooks._registry import lookup, make_state

    torch.cuda.set_device(0)
    out = {}
    for name, options in [("fp16", {}), ("bf16", {}), ("int8", {"error_feedback": True}),
                          ("topk", {"ratio": 0.05}), ("allreduce", {})]:
        cpu_state = make_state(name, **options)
        gpu_state = make_state(name, **options)
        hook = lookup(name).hook
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 * rank + step)
            grad = torch.randn(70001, generator=g) * (step + 1)
            cpu_buf, gpu_buf = grad.clone(), grad.cuda()
            a = hook(cpu_state, _bucket(cpu_buf)).wait()
            b = hook(gpu_state, _bucket(gpu_buf)).wait()
            same = b.is_cuda and torch.equal(a, b.cpu())
            out[f"{name} step {step}"] = (None if same else
                                          f"CUDA result differs ({(a - b.cpu()).abs().max()})",
                                          tc.digest(b))
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_cuda_hooks_match_cpu(world_factory, ws):
    tc.assert_cases(world_factory(ws).run(_w_hooks, 3, timeout=180))


def _w_ddp(rank, ws, hook, steps):
    """DDP on CUDA (every rank on device 0) against DDP on the CPU in the same world."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ringdist.hooks as hooks

    torch.cuda.set_device(0)
    finals = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10)).to(device)
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None, bucket_cap_mb=0.01)
        if hook != "none":
            hooks.register(ddp, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            F.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
            opt.step()
        finals[device] = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    diff = (finals["cpu"] - finals["cuda"]).abs().max().item()
    # CPU and GPU matmuls round differently: close, not equal (compressed hooks amplify it).
    tol = 1e-4 if hook == "none" else 2e-2
    return {hook: (None if diff < tol else f"CUDA run differs from the CPU run by {diff}",
                   tc.digest(finals["cuda"]))}


@pytest.mark.parametrize("hook", ["none", "fp16", "int8", "topk", "powersgd"])
def test_cuda_ddp_close_to_cpu_and_replicas_identical(world_factory, hook):
    tc.assert_cases(world_factory(2).run(_w_ddp, hook, 12, timeout=180))


# ------------------------------------------------------------ CUDA graph capture
def _w_capture_refused(rank, ws):
    """A collective on a stream that is capturing a CUDA graph is refused at the call, on every
    rank, naming the op; the group stays usable."""
    torch.cuda.set_device(0)
    x = torch.ones(1024, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    message = None
    try:
        with torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(x)
    except RuntimeError as e:
        message = str(e)
    torch.cuda.synchronize()
    after = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(after)
    ok = (message is not None and "allreduce" in message and "capturing a graph" in message
          and bool((after.cpu() == ws * (ws + 1) / 2).all()))
    return {"capture refused": None if ok else f"message {message!r}, after {after[:4]}"}


def test_cuda_graph_capture_refused(world_factory):
    tc.assert_cases(world_factory(2).run(_w_capture_refused, timeout=120), check_digests=False)


# ------------------------------------------------------------ NCCL beside ringdist
def _w_mixed_backend(rank, ws):
    t = torch.full((4,), 2.0)
    u = torch.full((4,), 3.0, device="cuda")
    dist.all_reduce(t)
    dist.all_reduce(u)
    group = dist.distributed_c10d._get_default_group()
    gpu_backend = type(group._get_backend(torch.device("cuda"))).__name__
    ok = bool((t == 2.0 * ws).all()) and bool((u.cpu() == 3.0 * ws).all())
    return {"cpu:ringdist,cuda:nccl": None if ok and gpu_backend == "ProcessGroupNCCL"
            else f"t={t} u={u} cuda backend {gpu_backend}"}


def test_cpu_ringdist_cuda_nccl_one_rank(tmp_path):
    """The README's mixed form: ringdist for CPU tensors, NCCL for CUDA (one rank: NCCL
    needs one GPU per rank)."""
    from harness.world import World

    world = World(1, backend="cpu:ringdist,cuda:nccl")
    try:
        tc.assert_cases(world.run(_w_mixed_backend, timeout=60), check_digests=False)
    finally:
        world.close()
