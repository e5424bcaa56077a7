"""Helpers shared by the benchmark scripts: machine description, provenance, JSON output, and
the alternating batch timing of same_process.py and deepspeed_peer.py."""
import datetime
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine_info():
    """What a result was measured on (recorded in every benchmark JSON)."""
    import torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "kernel": platform.release(),
        "hostname": socket.gethostname(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "loadavg_1min": os.getloadavg()[0],
    }


def _git(*args):
    """Output of a git command in this checkout, or None (no git, not a checkout)."""
    try:
        out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description():
    """The machine in words, without its hostname: CPU model, cores, memory, kernel (and GPU)."""
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    text = (f"{_cpu_model()}, {os.cpu_count()} cores, {memory:.1f} GiB memory, "
            f"{platform.system()} {platform.release()} {platform.machine()}")
    if torch.cuda.is_available():
        text += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return text


def provenance():
    """Where a result comes from (recorded in every benchmark JSON by write_json): the commit
    of this checkout and whether tracked files differ from it (dirty), the machine, torch and
    Python versions, the command line and the UTC date. commit and dirty are None outside a
    git checkout."""
    import torch

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "commit": commit,
        "dirty": None if status is None else status != "",
        "machine": machine_description(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": shlex.join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path, obj):
    """Write obj with its provenance (provenance(), unless obj has one) atomically, so a reader
    (compare.py) never sees half a file."""
    obj.setdefault("provenance", provenance())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def time_batches(calls, rounds, batch, barrier, slowest):
    """Per label of `calls` ({label: call()}), `rounds` batches of `batch` calls, the labels
    alternating (A B C A B C ...), each batch after `barrier()`: {label: [us per call]}, each the
    slowest rank's (`slowest(seconds)` gives the maximum over the ranks)."""
    times = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            barrier()
            start = time.perf_counter()
            for _ in range(batch):
                call()
            times[label].append(slowest((time.perf_counter() - start) / batch) * 1e6)
    return times


def batch_row(what, nbytes, world, batch, times, wrong, show):
    """One size's result (medians over the rounds); printed as one line when `show`."""
    row = {"bytes": nbytes, "batch": batch,
           "us": {label: statistics.median(t) for label, t in times.items()},
           "rounds_us": times, "wrong": wrong}
    if show:
        print(f"{what} {nbytes} B N={world} (batches of {batch}): " +
              "  ".join(f"{label} {row['us'][label]:.1f} us" + (" WRONG" if wrong[label] else "")
                        for label in times), flush=True)
    return row
