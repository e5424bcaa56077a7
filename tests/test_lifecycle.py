"""Group lifecycle with real processes (issue 5, scenarios 5-7): many async operations
over two groups, init/destroy cycles without leaks, a torchrun restart that resumes
from a checkpoint. harness/spawned.py describes the worlds.
"""
from __future__ import annotations

import datetime
import gc
import os
import subprocess
import sys
import re
import time

import pytest
import torch
import torch.distributed as dist

from harness.procs import Launched, descendants, port_clash, tail, torchrun_cmd
from harness.spawned import RINGDIST_ONLY, Spawned, ft_world, proc_sockets, report, sec, transports
from harness.spawned_rank import error_record, resources

pytestmark = RINGDIST_ONLY

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_KILL_SCRIPT = os.path.join(HERE, "scenarios", "lifecycle_train_kill.py")


# ---------------------------------------- 5. 1000 async ops over two groups, reverse waits
N_ASYNC = 1000


def _many_async(rank, ws, n):
    groups = [dist.new_group(list(range(ws)), timeout=sec(30)) for _ in range(2)]
    pending = []
    for i in range(n):
        g = groups[i % 2]
        kind = (i // 2) % 3
        if kind == 0:
            t = torch.full((5,), float(rank + i))
            w = dist.all_reduce(t, group=g, async_op=True)
            expect = [torch.full((5,), float(ws * i + sum(range(ws))))]
            got = [t]
        elif kind == 1:
            src = i % ws
            t = torch.full((3,), float(i) if rank == src else -1.0, dtype=torch.float64)
            w = dist.broadcast(t, src=src, group=g, async_op=True)
            expect = [torch.full((3,), float(i), dtype=torch.float64)]
            got = [t]
        else:
            got = [torch.empty(2, dtype=torch.int64) for _ in range(ws)]
            w = dist.all_gather(got, torch.full((2,), i * 10 + rank, dtype=torch.int64),
                                group=g, async_op=True)
            expect = [torch.full((2,), i * 10 + r, dtype=torch.int64) for r in range(ws)]
        pending.append((i, w, got, expect))
    t0 = time.monotonic()
    bad = []
    for i, w, got, expect in reversed(pending):
        w.wait()
        if not all(torch.equal(a, b) for a, b in zip(got, expect)):
            bad.append(i)
    waited = time.monotonic() - t0
    for g in groups:
        dist.destroy_process_group(g)
    return {"bad": bad[:20], "n_bad": len(bad), "wait_s": waited}


@transports
def test_many_async_ops_two_groups_reverse_wait(world_factory, record_property, transport):
    res = ft_world(world_factory, 3, transport=transport).run(_many_async, N_ASYNC, timeout=120)
    for r, out in enumerate(res):
        report(record_property, f"rank{r}_reverse_wait_s", round(out["wait_s"], 3))
        assert out["n_bad"] == 0, f"rank {r}: {out['n_bad']} wrong results, e.g. ops {out['bad']}"


# ================================================== 6. 50 init/destroy cycles
N_CYCLES = 50


def _foreign_shm(name: str) -> bool:
    # torch's shared-memory tensors of other processes on this shared machine.
    m = re.match(r"torch_(\d+)_", name)
    return bool(m) and m.group(1) not in _OUR_PIDS


_OUR_PIDS: set[str] = set()


def cycles(rank, ws, store, dist, torch):
    """N init/destroy cycles, each on a fresh FileStore; resources after every cycle."""
    n = int(os.environ["FT_CYCLES"])
    store_dir = os.environ["FT_STORE_DIR"]
    per_cycle, times = {}, []
    for i in range(1, n + 1):
        t0 = time.monotonic()
        fs = dist.FileStore(os.path.join(store_dir, f"cycle{i}"), ws)
        dist.init_process_group("ringdist", rank=rank, world_size=ws, store=fs,
                                timeout=datetime.timedelta(seconds=10))
        x = torch.full((1000,), float(rank + i))
        dist.all_reduce(x)
        expected = float(sum(r + i for r in range(ws)))
        if not bool((x == expected).all()):
            raise AssertionError(f"cycle {i}: allreduce gave {x[:4].tolist()}, expected {expected}")
        dist.destroy_process_group()
        del fs, x
        gc.collect()
        times.append(time.monotonic() - t0)
        if i in (1, 5, n):
            time.sleep(0.2)
            per_cycle[str(i)] = resources()
    out = {"per_cycle": per_cycle, "cycle_s": times}
    try:
        dist.all_reduce(torch.ones(2))
        out["after_destroy_error"] = None
    except Exception as e:  # noqa: BLE001
        out["after_destroy_error"] = error_record(e)
    return out


@transports
def test_init_destroy_cycles_do_not_leak(tmp_path, record_property, transport):
    ws = 2
    stores = tmp_path / "stores"
    stores.mkdir()
    with Spawned(cycles, ws, tmp_path, env={"FT_CYCLES": N_CYCLES, "FT_STORE_DIR": str(stores),
                                              "RINGDIST_TRANSPORT": transport}) as w:
        _OUR_PIDS.update(str(p) for p in w.pids)
        res = w.results(timeout=240)
    problems = []
    for r, out in sorted(res.items()):
        c1, c5, cn = (out["per_cycle"][k] for k in ("1", "5", str(N_CYCLES)))
        times = out["cycle_s"]
        report(record_property, f"rank{r}_cycle_s_median/max",
                (round(sorted(times)[len(times) // 2], 3), round(max(times), 3)))
        for key in ("native_threads", "py_threads", "fds"):
            report(record_property, f"rank{r}_{key}_cycle1/5/{N_CYCLES}", (c1[key], c5[key], cn[key]))
            if cn[key] > c5[key]:
                problems.append(f"rank {r}: {key} grew from {c5[key]} (cycle 5) to {cn[key]} "
                                f"(cycle {N_CYCLES})")
        new_fds = sorted(set(cn["fd_targets"]) - set(c5["fd_targets"]))
        if new_fds and cn["fds"] > c5["fds"]:
            problems.append(f"rank {r}: new fds {new_fds[:10]}")
        new_shm = [s for s in set(cn["shm"]) - set(c5["shm"]) if not _foreign_shm(s)]
        if new_shm or len(cn["shm_maps"]) > len(c5["shm_maps"]):
            problems.append(f"rank {r}: /dev/shm grew: {sorted(new_shm)[:10]}, mapped "
                            f"{c5['shm_maps']} -> {cn['shm_maps']}")
        err = out["after_destroy_error"]
        report(record_property, f"rank{r}_collective_after_destroy", err)
        if err is None:
            problems.append(f"rank {r}: a collective after destroy_process_group succeeded")
        elif not ({"ValueError", "RuntimeError"} & set(err["mro"])
                  and "Default process group has not been initialized" in err["message"]):
            problems.append(f"rank {r}: collective after destroy raised {err} (want torch's "
                            "'Default process group has not been initialized')")
    assert not problems, "\n".join(problems)


# ======================================== 7. torchrun restart resumes from a checkpoint
TORCHRUN_TIMEOUT_S = 90  # a healthy run (two attempts) takes ~17-40 s on 2 loaded cores
KILL_STEP = 30  # steps per epoch with 2 ranks and the default global batch 64: 22
# On the restarted attempt rank 0 starts this much later than rank 1 (a slower node), so
# rank 1 reaches the group's rendezvous first: the order that matters when the store
# outlives the first attempt (torchrun's static rendezvous keeps the agent's TCPStore).
RESTART_DELAY_RANK0_S = 3
# The example passes no timeout to init_process_group (torch's default: 30 min); the
# wrapper lowers that default so a stuck rendezvous fails the job instead of hanging it.
PG_TIMEOUT_S = 20


def _worker_states(torchrun_pid):
    """Python-less view of hung workers: what each one is blocked in (for the failure text)."""
    lines = []
    for pid in descendants(torchrun_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "train_kill" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0")
                           if "=" in kv)
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
            socks = [(local, remote, st) for _, local, remote, st in proc_sockets(pid)]
            lines.append(f"pid {pid} RANK={env.get('RANK')} attempt="
                         f"{env.get('TORCHELASTIC_RESTART_COUNT')} wchan={wchan} "
                         f"threads={len(os.listdir(f'/proc/{pid}/task'))} tcp={socks}")
        except OSError:
            continue
    return "\n".join(lines)


@pytest.mark.slow
def test_torchrun_restart_resumes_from_checkpoint(tmp_path, record_property):
    pytest.importorskip("sklearn")
    ckpt, mark = tmp_path / "ckpt.pt", tmp_path / "killed.txt"
    # RINGDIST_DEBUG: the log then shows each attempt's listening addresses.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RINGDIST_DEBUG="1",
               FT_KILL_RANK="1",
               FT_KILL_STEP=str(KILL_STEP), FT_KILL_MARK=str(mark),
               FT_RESTART_DELAY_RANK0=str(RESTART_DELAY_RANK0_S), FT_PG_TIMEOUT_S=str(PG_TIMEOUT_S))
    for attempt in range(3):
        log_path = tmp_path / f"torchrun{attempt}.log"
        cmd = torchrun_cmd(2, TRAIN_KILL_SCRIPT, "--backend", "ringdist", "--no-progress",
                           "--epochs", "3", "--checkpoint", ckpt,
                           options=("--max-restarts", "1", "--monitor-interval", "0.5"))
        t0 = time.monotonic()
        with Launched([cmd], [env], cwd=str(tmp_path), logs=[log_path]) as run:
            if not run.wait(TORCHRUN_TIMEOUT_S):
                stacks = _worker_states(run.pids[0])
                run.kill()
                pytest.fail(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S}s (killed); rank 1 "
                            f"killed: {mark.exists()}, resumed lines: "
                            f"{re.findall(r'resumed from .*', tail(log_path, 100000))}\n"
                            f"workers at kill time:\n{stacks}\n{tail(log_path, 6000)}")
        proc = run.procs[0]
        elapsed = time.monotonic() - t0
        out = tail(log_path, 1 << 20)
        if port_clash(proc.returncode, out) and not mark.exists():
            continue
        break
    report(record_property, "torchrun_total_s", round(elapsed, 1))
    assert mark.exists(), f"rank 1 was never killed\n{out[-6000:]}"
    listening = re.findall(r"\[ringdist\] rank \d+ listening on \S+", out)
    assert proc.returncode == 0, (f"exit code {proc.returncode}; ringdist listeners in order of "
                                  f"start (both attempts): {listening}\n{out[-6000:]}")
    resumed = re.findall(r"resumed from \S+ at epoch (\d+)", out)
    assert resumed == ["1"], f"expected one resume at epoch 1, got {resumed}\n{out[-6000:]}"
    final = re.findall(r"^final: loss=(\S+) accuracy=(\S+)$", out, re.M)
    assert len(final) == 1, out[-6000:]
    report(record_property, "final_loss/accuracy", final[0])
    assert float(final[0][1]) > 0.8, out[-3000:]
    assert torch.load(str(ckpt), weights_only=True)["epoch"] == 3
    # How the surviving rank of the first attempt failed (ringdist error, or stopped by the agent).
    first_err = re.search(r"(ringdist \w+: rank 0[^\n]*)", out)
    report(record_property, "survivor_error", first_err.group(1)[:300] if first_err else None)


# ---------------------------------------- exit without destroy_process_group
EXIT_SCRIPT = os.path.join(HERE, "scenarios", "lifecycle_exit_without_destroy.py")


@pytest.mark.slow
def test_exit_without_destroy_is_quiet(tmp_path):
    """torch.multiprocessing.spawn, no destroy_process_group, the store's host exiting
    first: every rank exits 0 and prints nothing, no secret given. (Before the atexit shutdown, a worker
    thread still dropping tensors while Python finalized aborted the process with
    'terminate called without an active exception', 2 runs in 3.)"""
    import subprocess
    import sys

    from harness.procs import free_port

    # No secret: a one-host job on loopback is not warned about unauthenticated TCP peers.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGDIST_SECRET")}
    for attempt in range(4):
        out = subprocess.run([sys.executable, "-P", EXIT_SCRIPT, "3", str(free_port())],
                             capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                             env=env)
        noise = (out.stdout.replace("done\n", "", 1) + out.stderr).strip()
        assert out.returncode == 0 and out.stdout.startswith("done") and not noise, \
            f"attempt {attempt}: exit {out.returncode}\n{noise[-4000:]}"


# ---------------------------------------- one-rank groups run on the caller
def _one_rank_inline(rank, ws, n_threads, n_ops):
    """World size 1: CPU ops complete on the calling thread when the worker is idle (no
    hand-off). Issue order, nested ops from completion callbacks (waited for inside the
    callback, as PowerSGD does) and several threads issuing at once must all still hold."""
    import threading

    import torch_ringdist

    out = {}
    t = torch.arange(6, dtype=torch.float32)
    work = dist.all_reduce(t, async_op=True)
    out["complete at return"] = work.is_completed()

    def nested(fut):
        inner = fut.value()[0] * 2
        dist.all_reduce(inner)  # issued and waited for inside the callback
        return inner

    got = dist.all_reduce(t.clone(), async_op=True).get_future().then(nested).wait()
    out["nested op in a callback"] = torch.equal(got, t * 2)
    # A compressed allreduce (quantises even alone) followed by a plain one on the same tensor:
    # the plain one must see the compressed result.
    x = torch.linspace(-3, 3, 1000)
    expected = x.clone()
    torch_ringdist.all_reduce(expected, codec="int8")
    y = x.clone()
    w1 = torch_ringdist.all_reduce(y, codec="int8", async_op=True)
    w2 = dist.all_reduce(y, async_op=True)
    w2.wait()
    w1.wait()
    out["issue order with a compressed op"] = torch.equal(y, expected)
    errors = []

    def hammer(k):
        try:
            for i in range(n_ops):
                v = torch.full((17,), float(k * n_ops + i))
                dist.all_reduce(v)
                dist.broadcast(v, 0)
                if not bool((v == k * n_ops + i).all()):
                    errors.append(f"thread {k} op {i}: {v[:3]}")
        except Exception as exc:  # noqa: BLE001  (reported to the parent)
            errors.append(f"thread {k}: {exc!r}")

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    out["threads"] = errors[:5] or ("hung" if any(th.is_alive() for th in threads) else None)
    return out


def test_one_rank_group_runs_inline_in_order(world_factory):
    res = world_factory(1).run(_one_rank_inline, 4, 300, timeout=120)[0]
    assert res == {"complete at return": True, "nested op in a callback": True,
                   "issue order with a compressed op": True, "threads": None}, res


@pytest.mark.quick
@pytest.mark.parametrize("name,value,expected", [
    ("RINGDIST_CUDA_IPC_BYTES", "100", "must be 0 (off) or >= 4096"),
    ("RINGDIST_CUDA_IPC_MIN_BYTES", "-1", "must be >= 0"),
    ("RINGDIST_SEGMENT_BYTES", "12Q", "is not an integer"),
    ("RINGDIST_SINGLE_COPY", "maybe", "must be auto, 1 or 0, got 'maybe'"),
    ("RINGDIST_ROUTE", "rhd", "must be auto, ring, direct, halving-doubling or pair, got 'rhd'"),
])
def test_bad_setting_fails_init_naming_it(tmp_path, name, value, expected):
    script = ("import torch.distributed as dist, torch_ringdist\n"
              f"dist.init_process_group('ringdist', init_method='file://{tmp_path}/store', "
              "rank=0, world_size=1)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGDIST_")}
    env[name] = value
    out = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and name in out.stderr and expected in out.stderr, out.stderr[-2000:]
