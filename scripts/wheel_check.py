"""What CI proves of the release wheel, run in a fresh venv holding only torch and the wheel,
with no compiler, CMake or nvcc on PATH (scripts/test_wheel.sh):
  - it loads, has no test hooks (no _C.testing, no RINGDIST_TEST_* string in its libraries),
    and ignores the fault-injection variables a test build reads;
  - a 2-rank allreduce gives the closed-form sums (with those variables set);
  - a DDP step with the fp16 hook gives the mean gradient within fp16's rounding.
"""
import datetime
import os
import shutil
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A test build reads these; a release must not (it would corrupt a result or a checksum).
FAULTS = {"RINGDIST_CHECK_RESULTS": "1", "RINGDIST_TEST_CORRUPT_RESULT": "1", "RINGDIST_CRC": "1",
          "RINGDIST_TEST_CORRUPT_SEND": "1", "RINGDIST_TEST_SINGLE_COPY_WRITE_DELAY_MS": "2000"}
SIZES = [1, 7, 1000, 65536 + 3, (1 << 20) + 5]


def check_no_tools():
    found = {tool: shutil.which(tool) for tool in ("gcc", "g++", "cc", "c++", "cmake", "nvcc")}
    found = {tool: path for tool, path in found.items() if path}
    assert not found, f"compilers or CMake on PATH, the check needs none: {found}"


def check_no_test_hooks():
    import torch_ringdist
    from torch_ringdist import _build_config
    from torch_ringdist._extension import load
    assert _build_config.TESTING is False, "the wheel is a test build"
    assert not hasattr(load(), "testing"), "the wheel has the _C.testing module"
    package = os.path.dirname(torch_ringdist.__file__)
    for root, _, files in os.walk(package):
        for name in files:
            if ".so" in name:
                data = open(os.path.join(root, name), "rb").read()
                assert b"RINGDIST_TEST_" not in data, f"{name} reads a RINGDIST_TEST_ variable"


def rank_main(rank, world, port):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ringdist.hooks as hooks

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("ringdist", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    for n in SIZES:
        t = torch.arange(n, dtype=torch.float32) + rank * 3
        dist.all_reduce(t)
        expected = 2 * torch.arange(n, dtype=torch.float32) + 3  # ranks 0 and 1
        assert torch.equal(t, expected), f"rank {rank}: allreduce of {n} floats is wrong"

    torch.manual_seed(0)
    model = DDP(nn.Linear(64, 8))
    hooks.register(model, "fp16")
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    model(x).square().mean().backward()
    # The reference: each rank's own gradient, computed alone, averaged in float64.
    local = []
    for r in range(world):
        torch.manual_seed(0)
        ref = nn.Linear(64, 8).double()
        xr = torch.randn(16, 64, generator=torch.Generator().manual_seed(r)).double()
        ref(xr).square().mean().backward()
        local.append(ref.weight.grad)
    mean = sum(local) / world
    err = (model.module.weight.grad.double() - mean).abs().max().item()
    assert err <= 1e-3 * mean.abs().max().item() + 1e-6, f"rank {rank}: fp16 hook gradient off by {err}"
    dist.destroy_process_group()


def main():
    check_no_tools()
    check_no_test_hooks()
    os.environ.update(FAULTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(2, port), nprocs=2, start_method="spawn")
    print("wheel check passed: no test hooks, fault variables ignored, allreduce and a DDP hook "
          f"correct (torch {torch.__version__}, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
