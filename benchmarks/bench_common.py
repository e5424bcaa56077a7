"""Helpers shared by the benchmark scripts: machine description, provenance, JSON output, and
the alternating batch timing of same_process.py and deepspeed_peer.py."""
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import statistics
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


def provenance():
    """Where a result comes from (recorded in every benchmark JSON by write_json): this
    checkout's commit and whether tracked files differ from it (dirty), the machine, torch and
    Python versions, the command line and the UTC date (torch_ringdist._provenance)."""
    from torch_ringdist._provenance import provenance as record

    return record(REPO)


def write_json(path, obj):
    """Write obj with its provenance (provenance(), unless obj has one) atomically, so a reader
    (compare.py) never sees half a file."""
    obj.setdefault("provenance", provenance())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def time_batches(calls, rounds, batch, barrier, slowest, lead=0):
    """Per label of `calls` ({label: call()}), `rounds` batches of `batch` calls, the labels
    alternating (A B C A B C ...), each batch after `barrier()`: {label: [us per call]}, each the
    slowest rank's (`slowest(seconds)` gives the maximum over the ranks). `lead` calls before
    each batch are not timed: on long links the ranks leave a barrier up to several one-way
    trips apart, and the first call after it takes that spread on top of its own time."""
    times = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            barrier()
            for _ in range(lead):
                call()
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


def end_session(proc, grace, kill_grace=5.0):
    """End a process started in a session of its own and everything in that session: TERM
    first (so launchers and namespace scripts can clean up), KILL after `grace` seconds, then
    KILL for whatever the session's leader left running."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_grace)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
