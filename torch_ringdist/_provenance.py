"""Where a benchmark result comes from: the record `python -m torch_ringdist.bench --json` and
every script in benchmarks/ (bench_common.provenance) write beside their results."""
import datetime
import os
import platform
import shlex
import subprocess
import sys


def _git(folder, *args):
    """Output of a git command in `folder`, or None (no git, not a checkout)."""
    try:
        out = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_checkout():
    """The git checkout of torch_ringdist this package runs from, or None when installed."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = _git(here, "rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(os.path.join(top, "torch_ringdist")) != os.path.realpath(here):
        return None
    return top


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


def provenance(checkout):
    """The commit of `checkout` and whether tracked files differ from it (dirty; both None when
    `checkout` is None or not a git checkout), the machine, torch and Python versions, the
    command line and the UTC date."""
    import torch

    commit = _git(checkout, "rev-parse", "HEAD") if checkout else None
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "commit": commit,
        "dirty": None if status is None else status != "",
        "machine": machine_description(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": shlex.join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
