"""`python -m torch_ringdist`: what ringdist sees on this machine, and what is wrong with it.

Prints the torch version and the one the extension was built against (a different
minor version is named with the reinstall command), the CPU kernels picked, whether
CUDA code was compiled, whether shared memory is usable, the address this rank would
listen on for the current MASTER_ADDR / RINGDIST_SOCKET_IFNAME, and the environment
variables that change ringdist's behaviour. `--json` prints the same as one object.
Exits 1 if a problem was found.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import torch_ringdist
from torch_ringdist._extension import REINSTALL, load, minor

# Variables that change ringdist's behaviour (README's table), besides RINGDIST_*.
RELATED_ENV = ("MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG",
               "TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_RINGDIST_CUDA", "TORCH_CUDA_ARCH_LIST",
               "OMP_NUM_THREADS")


def _shared_memory() -> dict:
    """Can this process create a shared-memory segment (what same-host ranks use)?"""
    info = {"path": "/dev/shm", "exists": os.path.isdir("/dev/shm")}
    if info["exists"]:
        st = os.statvfs("/dev/shm")
        info["free_bytes"] = st.f_bavail * st.f_frsize
    try:
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=4096)
        segment.close()
        segment.unlink()
        info["usable"] = True
    except (OSError, ImportError) as exc:
        info["usable"] = False
        info["error"] = str(exc)
    return info


def collect() -> tuple[dict, list[str]]:
    """(facts, problems) about this machine as ringdist sees it."""
    problems = []
    facts = {"torch_ringdist": torch_ringdist.__version__, "torch": torch.__version__,
             "python": sys.version.split()[0]}
    try:
        ext = load()
    except ImportError as exc:
        facts["extension"] = None
        problems.append(str(exc).splitlines()[0])
        return facts, problems
    facts["extension"] = ext.__file__
    facts["built_with_torch"] = ext.built_with_torch
    if minor(ext.built_with_torch) != minor(torch.__version__):
        problems.append(
            f"torch_ringdist was built against torch {ext.built_with_torch} but torch "
            f"{torch.__version__} is installed; rebuild it for this torch: {REINSTALL}")
    facts["cpu_kernels"] = ext.reduce_kernel_family()
    facts["cuda_compiled"] = ext.cuda_compiled()
    facts["cuda_available"] = torch.cuda.is_available()
    facts["shared_memory"] = _shared_memory()
    if not facts["shared_memory"]["usable"]:
        problems.append("shared memory is not usable: ranks on this host will talk over TCP "
                        f"({facts['shared_memory'].get('error')})")
    try:
        facts["listen_address"] = ext.listen_address(None)  # what a group would listen on (no store yet)
    except RuntimeError as exc:
        facts["listen_address"] = None
        problems.append(str(exc))
    facts["environment"] = {k: v for k, v in sorted(os.environ.items())
                            if k.startswith("RINGDIST_") or k in RELATED_ENV}
    return facts, problems


def _print_text(facts: dict, problems: list[str]) -> None:
    shm = facts.get("shared_memory", {})
    rows = [
        ("torch_ringdist", facts["torch_ringdist"]),
        ("torch", facts["torch"]),
        ("built against torch", facts.get("built_with_torch", "-")),
        ("extension", facts.get("extension") or "not loadable"),
        ("CPU kernels", facts.get("cpu_kernels", "-")),
        ("CUDA code compiled", facts.get("cuda_compiled", "-")),
        ("CUDA available to torch", facts.get("cuda_available", "-")),
        ("shared memory", "-" if not shm else
         f"{'usable' if shm.get('usable') else 'NOT usable'}, "
         f"{shm.get('free_bytes', 0) / 2**30:.1f} GiB free in {shm['path']}"),
        ("listens on", facts.get("listen_address") or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    env = facts.get("environment", {})
    print(f"{'environment':<{width}}  " + (", ".join(f"{k}={v}" for k, v in env.items()) or "(none set)"))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if not problems:
        print("no problems found")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_ringdist", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    facts, problems = collect()
    if args.json:
        print(json.dumps({"facts": facts, "problems": problems}, indent=1))
    else:
        _print_text(facts, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
