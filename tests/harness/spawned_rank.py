"""One rank of a world that tests/test_failures.py spawns itself (not the shared World harness).

    python ranks.py SCENARIO RESULT_DIR

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a TCPStore hosted by the test
process), plus scenario-specific variables. The rank writes its result as JSON to
RESULT_DIR/rank<R>.json (atomically) and exits 0; on an unexpected exception it writes
{"crash": traceback} and exits 1. Every blocking call here has a deadline; on SIGUSR1
the rank dumps its Python stacks to stderr (the test does that before killing a hung rank).
"""
from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback

STORE_TIMEOUT = datetime.timedelta(seconds=60)


def _die_with_parent() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def resources() -> dict:
    """Threads (native and Python), open fds and /dev/shm entries of this process."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    try:
        shm = sorted(os.listdir("/dev/shm"))
    except OSError:
        shm = []
    with open("/proc/self/maps") as f:
        shm_maps = sorted({line.split()[-1] for line in f if "/dev/shm/" in line})
    return {
        "native_threads": len(os.listdir("/proc/self/task")),
        "py_threads": threading.active_count(),
        "fds": len(fds),
        "fd_targets": sorted(fds),
        "shm": shm,
        "shm_maps": shm_maps,
    }


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e)}


# ------------------------------------------------------------------ scenarios
def _looped_op(rank, ws, dist, torch, t):
    """The op kill_mid_allreduce loops (FT_OP): allreduce, or broadcast from rank 1, allgather
    and reduce_scatter, which on one host read peers' memory (single copy)."""
    op = os.environ.get("FT_OP", "allreduce")
    codec = os.environ.get("FT_CODEC")  # compressed allreduces (AVG keeps ones at one)
    if codec:
        import torch_ringdist
        return lambda: torch_ringdist.all_reduce(t, codec=codec, op=dist.ReduceOp.AVG, async_op=True)
    if op == "broadcast":
        return lambda: dist.broadcast(t, src=1, async_op=True)
    if op == "allgather":
        out = torch.empty(t.numel() * ws, dtype=t.dtype)
        return lambda: dist.all_gather_into_tensor(out, t, async_op=True)
    if op == "reduce_scatter":
        block = t.numel() // ws
        out = torch.empty(block, dtype=t.dtype)
        return lambda: dist.reduce_scatter_tensor(out, t[:block * ws], op=dist.ReduceOp.MAX,
                                                  async_op=True)
    return lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)


def kill_mid_allreduce(rank, ws, store, dist, torch):
    """Loop 64 MiB allreduces (or FT_OP) until the test SIGKILLs one rank; survivors report
    the error."""
    before = resources()
    t_init = time.monotonic()
    dist.init_process_group("ringdist", rank=rank, world_size=ws, store=store,
                            timeout=datetime.timedelta(seconds=10))
    init_s = time.monotonic() - t_init
    numel = int(os.environ.get("FT_NUMEL", 16 << 20))  # 64 MiB of float32
    t = torch.ones(numel, dtype=torch.float32)
    issue = _looped_op(rank, ws, dist, torch, t)
    issue().wait()  # warm-up: connections and buffers in place
    after_init = resources()
    store.add("ft/looping", 1)
    iters, op_times = 0, []
    result = {"init_s": init_s, "resources_before_init": before, "resources_after_init": after_init}
    stop_at = time.monotonic() + float(os.environ.get("FT_LOOP_MAX_S", 60))
    while True:
        t0 = time.monotonic()
        try:
            issue().wait()
        except Exception as e:  # noqa: BLE001  (what we are here for)
            result["error_wall_time"] = time.time()
            result["error_wait_s"] = time.monotonic() - t0
            result["error"] = _error(e)
            break
        op_times.append(time.monotonic() - t0)
        iters += 1
        if time.monotonic() > stop_at:
            result["error"] = None
            break
    result["iters"] = iters
    result["median_op_s"] = sorted(op_times)[len(op_times) // 2] if op_times else None
    # Later operations on the aborted group fail at once with the same error.
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        result["later_error"] = None
    except Exception as e:  # noqa: BLE001
        result["later_error"] = _error(e)
    result["later_error_s"] = time.monotonic() - t0
    del t
    t0 = time.monotonic()
    dist.destroy_process_group()
    result["destroy_s"] = time.monotonic() - t0
    gc.collect()
    time.sleep(0.3)  # let any exiting thread finish leaving
    result["resources_after_destroy"] = resources()
    return result


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
        out["after_destroy_error"] = _error(e)
    return out


def _wait_key(store, key):
    store.wait([key], STORE_TIMEOUT)


def held_init(rank, ws, store, dist, torch):
    """Ranks >= FT_HOLD_FROM wait for the test's "ft/go" before joining the group, so the
    lower ranks sit in the handshake accept loop while the test probes their listeners."""
    hold_from = int(os.environ["FT_HOLD_FROM"])
    if rank >= hold_from:
        _wait_key(store, "ft/go")
    t0 = time.monotonic()
    dist.init_process_group("ringdist", rank=rank, world_size=ws, store=store,
                            timeout=datetime.timedelta(seconds=int(os.environ["FT_INIT_TIMEOUT"])))
    out = {"init_s": time.monotonic() - t0}
    store.add("ft/inited", 1)
    _wait_key(store, "ft/go2")  # the test probes the (closed) listener after init
    errors = []
    for k in range(3):
        x = torch.arange(1000, dtype=torch.float32) + rank + k
        dist.all_reduce(x)
        exp = torch.arange(1000, dtype=torch.float32) * ws + sum(range(ws)) + ws * k
        if not torch.equal(x, exp):
            errors.append(f"allreduce {k}: {x[:4].tolist()} != {exp[:4].tolist()}")
    outs = [torch.empty(5, dtype=torch.int64) for _ in range(ws)]
    dist.all_gather(outs, torch.full((5,), rank * 10, dtype=torch.int64))
    if [int(o[0]) for o in outs] != [r * 10 for r in range(ws)]:
        errors.append(f"all_gather: {[o.tolist() for o in outs]}")
    b = torch.full((7,), 42.0 if rank == ws - 1 else -1.0, dtype=torch.float64)
    dist.broadcast(b, src=ws - 1)
    if not bool((b == 42.0).all()):
        errors.append(f"broadcast: {b.tolist()}")
    # Object collectives (pickle on the wire) after foreign clients tried to talk to us:
    # only authenticated peers' bytes may ever reach the unpickler.
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "payload": list(range(rank + 3))})
    if objs != [{"rank": r, "payload": list(range(r + 3))} for r in range(ws)]:
        errors.append(f"all_gather_object: {objs}")
    lst = [f"from {ws - 1}", ws - 1] if rank == ws - 1 else [None, None]
    dist.broadcast_object_list(lst, src=ws - 1)
    if lst != [f"from {ws - 1}", ws - 1]:
        errors.append(f"broadcast_object_list: {lst}")
    gathered = [None] * ws if rank == 0 else None
    dist.gather_object(("g", rank), gathered, dst=0)
    if rank == 0 and gathered != [("g", r) for r in range(ws)]:
        errors.append(f"gather_object: {gathered}")
    dist.barrier()
    out["errors"] = errors
    dist.destroy_process_group()
    return out


def _init(rank, ws, store, dist):
    dist.init_process_group("ringdist", rank=rank, world_size=ws, store=store,
                            timeout=datetime.timedelta(seconds=30))


def _sum_ok(dist, torch):
    """An allreduce on the current default group, against its closed form."""
    n = dist.get_world_size()
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return bool(torch.all(t == n * (n + 1) / 2))


def death_during_shrink(rank, ws, store, dist, torch):
    """4 ranks. Rank 3 dies; then rank 2 dies after agreeing but before connecting: the
    shrink of ranks 0 and 1 must fail within RINGDIST_SHRINK_TIMEOUT, naming the problem."""
    import torch_ringdist

    _init(rank, ws, store, dist)
    _sum_ok(dist, torch)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        _sum_ok(dist, torch)
        _sum_ok(dist, torch)
        return {"error": None}
    except dist.DistBackendError:
        pass
    lost = torch_ringdist.lost_ranks(wait=0.5)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.shrink_group(lost)
        return {"lost": lost, "error": None}
    except Exception as e:  # noqa: BLE001 (reported to the test)
        return {"lost": lost, "error": f"{type(e).__name__}: {e}"[:600],
                "seconds": time.monotonic() - start}


def abort_healthy(rank, ws, store, dist, torch):
    """3 ranks, all alive; ranks 0 and 1 drop rank 2 with SHRINK_ABORT. The survivors get a
    working group at once (no wait for rank 2 at teardown), subgroups made before are gone,
    and rank 2, still using the old group, gets an error instead of a hang."""
    _init(rank, ws, store, dist)
    sub = dist.new_group([0, 1])
    old_transports = dist.group.WORLD._get_backend(torch.device("cpu")).transports
    _sum_ok(dist, torch)
    if rank == 2:
        start = time.monotonic()
        try:
            time.sleep(1.0)  # the others shrink meanwhile
            _sum_ok(dist, torch)
            return {"error": None}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"[:300], "seconds": time.monotonic() - start}
    start = time.monotonic()
    dist.shrink_group([2], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    seconds = time.monotonic() - start
    new = dist.group.WORLD._get_backend(torch.device("cpu"))
    try:
        dist.all_reduce(torch.ones(1), group=sub)
        subgroup = "usable"
    except Exception as e:  # noqa: BLE001
        subgroup = type(e).__name__
    return {"seconds": seconds, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "sum_ok": _sum_ok(dist, torch), "backend": dist.get_backend(),
            "transports": new.transports, "old_transports": old_transports[:2],
            "subgroup": subgroup}


def trace_desync(rank, ws, store, dist, torch):
    """3 ranks record a few ops (checked live with torch_ringdist.trace()), then rank 1 calls
    all_reduce with 7 elements where the others pass 8; with RINGDIST_TRACE_DUMP set every
    rank dumps its trace."""
    import time

    import torch_ringdist

    _init(rank, ws, store, dist)
    wall_before = time.time_ns()
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    out = torch.empty(ws * 5)
    dist.all_gather_into_tensor(out, torch.ones(5))
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(2), src=0)
    dist.barrier()
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    wall_after = time.time_ns()
    keys = ("profiling_name", "collective_seq_id", "p2p_seq_id", "input_sizes", "output_sizes",
            "state", "is_p2p", "time_created_ns", "time_discovered_started_ns",
            "time_discovered_completed_ns")
    result = {"live": [{k: e[k] for k in keys} for e in torch_ringdist.trace()["entries"]],
              "wall": (wall_before, wall_after)}
    try:
        dist.all_reduce(torch.ones(7 if rank == 1 else 8))
        result["error"] = None
    except Exception as e:  # noqa: BLE001 (reported)
        result["error"] = str(e).splitlines()[0][:300]
    return result


def latency_path(rank, ws, store, dist, torch):
    """Synchronous ops take the latency path (run on the calling thread) when the worker is
    idle. Checked here, at 2 ranks:
    - order: a seeded random mix of sync and async allreduce/broadcast on shared tensors of
      8 B to 4 MiB equals the mix applied in issue order (a float64 simulation of every
      rank), and some ops ran inline while others queued behind async work;
    - 4 MiB isends/irecvs crossing, 40 rounds: posts queue behind transfers in flight;
    - callers pinned to one CPU wait without spinning (shared_core_waits), on two CPUs spin;
      a group made while each rank was pinned to its own core spins too;
    - deadline: an inline allreduce whose peer never comes fails after the group's timeout;
    - abort: an inline allreduce whose peer never comes fails soon after another thread
      aborts the group, and the abort returns."""
    import random

    import torch_ringdist

    _init(rank, ws, store, dist)
    rng = random.Random(7)
    sizes = [1, 256, 16384, 1 << 19]  # float64 elements: 8 B .. 4 MiB
    state = [[float((r + 1) * (i + 2)) for i in range(len(sizes))] for r in range(ws)]
    tensors = [torch.full((n,), state[rank][i], dtype=torch.float64) for i, n in enumerate(sizes)]
    torch_ringdist.reset_stats()
    pending = []
    for _ in range(60):
        i = rng.randrange(len(sizes))
        sync = rng.random() < 0.6
        if rng.random() < 0.5:
            work = dist.all_reduce(tensors[i], async_op=not sync)
            total = sum(state[r][i] for r in range(ws))
            for r in range(ws):
                state[r][i] = total
        else:
            root = rng.randrange(ws)
            work = dist.broadcast(tensors[i], src=root, async_op=not sync)
            for r in range(ws):
                state[r][i] = state[root][i]
        if work is not None:
            pending.append(work)
    for work in pending:
        work.wait()
    order_ok = all(bool(torch.all(t == state[rank][i])) for i, t in enumerate(tensors))
    stats = torch_ringdist.stats()
    calls = sum(stats[k]["calls"] for k in ("allreduce", "broadcast"))
    inline = sum(stats[k]["inline_calls"] for k in ("allreduce", "broadcast"))
    # 8 B sync allreduce, back to back: every one takes the latency path
    torch_ringdist.reset_stats()
    small_ok = True
    for k in range(100):
        small = torch.full((2,), float(rank + k))
        dist.all_reduce(small)
        small_ok &= bool(torch.all(small == sum(r + k for r in range(ws))))
    back_to_back = torch_ringdist.stats()["allreduce"]["inline_calls"]
    # Ping-pong: each rank adds one and sends it back; sends and receives post inline.
    torch_ringdist.reset_stats()
    ball = torch.zeros(2)
    for _ in range(50):
        if rank == 0:
            dist.send(ball + 1, dst=1)
            dist.recv(ball, src=1)
        else:
            dist.recv(ball, src=0)
            dist.send(ball + 1, dst=0)
    p2p = torch_ringdist.stats()["send/recv"]
    # Posts that find the worker still moving large transfers an earlier post left queue
    # behind them (a lost wake-up here once hung both ranks in irecv).
    crossed_ok = True
    for k in range(40):
        a, b = torch.full((1 << 20,), rank + k + 0.5), torch.full((1 << 20,), rank + k + 0.25)
        ra, rb = torch.empty_like(a), torch.empty_like(b)
        sends = [dist.isend(a, dst=1 - rank, tag=11), dist.isend(b, dst=1 - rank, tag=12)]
        recvs = [dist.irecv(rb, src=1 - rank, tag=12), dist.irecv(ra, src=1 - rank, tag=11)]
        for w in recvs + sends:
            w.wait()
        peer = 1 - rank + k
        crossed_ok &= bool(torch.all(ra == peer + 0.5) and torch.all(rb == peer + 0.25))
    # A synchronous op issued by a completion callback (on the worker, or inline) runs there.
    # Each rank in turn calls first while the other waits 0.1 s, so the early rank's op is
    # still running when its callback is attached: that callback runs on the worker. (With
    # both ranks at once, a starved caller thread could attach it after the op completed.)
    callback_ok = True
    for early in range(ws):
        big, inner, ran_on = torch.ones(1 << 20), torch.ones(2), []

        def callback(fut):
            ran_on.append(threading.get_ident())
            dist.all_reduce(inner)
            return fut.value()

        if rank != early:
            time.sleep(0.1)
        dist.all_reduce(big, async_op=True).get_future().then(callback).wait()
        callback_ok &= bool(torch.all(big == ws)) and bool(torch.all(inner == ws))
        if rank == early:
            callback_ok &= ran_on != [threading.get_ident()]

    # Ranks the scheduler put on one CPU: a rank does not spin for a peer that last ran or
    # waited on its own CPU. Both callers pinned to one CPU, then each to its own.
    cores = sorted(os.sched_getaffinity(0))
    shared_core_waits = None
    if len(cores) >= 2:
        shared_core_waits = {}
        for name, cpus in (("one_cpu", [cores[0]] * 2), ("two_cpus", cores[:2])):
            os.sched_setaffinity(0, {cpus[rank]})  # this thread only: the group spins as before
            dist.barrier()  # both published their CPU
            torch_ringdist.reset_stats()
            pinned = torch.ones(2)
            for _ in range(200):
                dist.all_reduce(pinned)
            shared_core_waits[name] = torch_ringdist.stats()["allreduce"]["shared_core_waits"]
        # A group made while each rank is pinned to a core of its own (taskset, numactl, a
        # batch scheduler's binding) has a core per rank although each process sees one: it
        # spins too, so with both callers then on one CPU it skips the spin as above.
        os.sched_setaffinity(0, {cores[rank]})  # its worker thread inherits this
        own_core_group = dist.new_group()
        dist.barrier(group=own_core_group)
        os.sched_setaffinity(0, {cores[0]})
        dist.barrier(group=own_core_group)
        torch_ringdist.reset_stats(own_core_group)
        for _ in range(200):
            dist.all_reduce(pinned, group=own_core_group)
        shared_core_waits["own_core_group"] = \
            torch_ringdist.stats(own_core_group)["allreduce"]["shared_core_waits"]
        os.sched_setaffinity(0, cores)

    # The Work's future, asked for before the op completed and after (a host op makes it
    # only when asked): the same value, callbacks run, done() agrees.
    future_ok = True
    for early_ask in (True, False):
        big = torch.full((1 << 20,), float(rank + 1))
        work = dist.all_reduce(big, async_op=True)
        fut = work.get_future() if early_ask else None
        work.wait()
        if fut is None:
            fut = work.get_future()
        chained = fut.then(lambda f: f.value()[0].sum().item())
        future_ok &= fut.done() and bool(torch.all(fut.wait()[0] == 3.0))
        future_ok &= chained.wait() == 3.0 * (1 << 20) and work.get_future().done()
    # A future asked for before the op ended is done once wait() returned (as gloo's): the
    # future completes before the waiter wakes.
    not_done = 0
    for _ in range(300):
        work = dist.all_reduce(torch.ones(2), async_op=True)
        fut = work.get_future()
        work.wait()
        not_done += not fut.done()
    future_ok &= not_done == 0

    out = {"order_ok": order_ok, "shared_core_waits": shared_core_waits, "calls": calls,
           "inline": inline, "back_to_back": back_to_back,
           "small_ok": small_ok, "ping_pong": ball.tolist(), "p2p_calls": p2p["calls"],
           "p2p_inline": p2p["inline_calls"], "callback_ok": callback_ok,
           "crossed_ok": crossed_ok, "future_ok": future_ok}
    late = dist.new_group(timeout=datetime.timedelta(seconds=1))
    aborted = dist.new_group()
    # Failed ops' futures: asked for before the failure and after it.
    failing = {ask: dist.new_group(timeout=datetime.timedelta(seconds=1)) for ask in ("early", "late")}
    if rank == 1:  # never joins the ops below; waits until rank 0 is done with them
        store.wait(["latency_path/done"], datetime.timedelta(seconds=60))
        return out
    for name, group in (("deadline", late), ("abort", aborted)):
        timer = None
        if name == "abort":
            timer = threading.Timer(0.5, group.abort)
            timer.start()
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2), group=group)
            out[name] = {"error": None}
        except Exception as e:  # noqa: BLE001 (reported)
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300],
                         "seconds": time.monotonic() - start}
        if timer is not None:
            timer.join(10)
            out[name]["abort_returned"] = not timer.is_alive()
    for ask, group in failing.items():
        work = dist.all_reduce(torch.ones(2), group=group, async_op=True)
        fut = work.get_future() if ask == "early" else None
        time.sleep(1.5)  # past the group's timeout: the op failed meanwhile
        fut = fut if fut is not None else work.get_future()
        try:
            fut.wait()
            out[f"future_error_{ask}"] = None
        except Exception as e:  # noqa: BLE001 (reported)
            out[f"future_error_{ask}"] = f"{type(e).__name__}: {e}"[:300]
    store.set("latency_path/done", "1")
    return out


def single_copy_abort(rank, ws, store, dist, torch):
    """2 ranks: rank 0 broadcasts 1 MiB, writing half of it straight into rank 1's buffer
    while rank 1 reads the other half. Rank 0's writes wait 300 ms with their write flag set
    (RINGDIST_TEST_SINGLE_COPY_WRITE_DELAY_MS, set by the test), and another thread of rank 1
    aborts its group 100 ms into the broadcast. Both ranks must fail; rank 1's broadcast must
    return only after rank 0's write in flight ended, so no byte lands in the buffer rank 1
    lent after it returned (filled with a pattern at once, checked 500 ms later)."""
    _init(rank, ws, store, dist)
    t = torch.full((1 << 18,), float(rank))
    group = dist.new_group(timeout=datetime.timedelta(seconds=20))
    out = {"error": None}
    timer = threading.Timer(0.1, group.abort) if rank == 1 else None
    start = time.monotonic()
    try:
        if timer is not None:
            timer.start()
        dist.broadcast(t, src=0, group=group)
    except Exception as e:  # noqa: BLE001 (reported)
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["seconds"] = time.monotonic() - start
    if rank == 1:
        t.fill_(-1.0)
        time.sleep(0.5)
        out["stray_elements"] = int((t != -1.0).sum())
        timer.join(10)
    return out


SCENARIOS = {f.__name__: f for f in (kill_mid_allreduce, cycles, held_init, death_during_shrink,
                                     abort_healthy, trace_desync, latency_path,
                                     single_copy_abort)}


def main() -> int:
    scenario, outdir = sys.argv[1], sys.argv[2]
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return 1
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path = os.path.join(outdir, f"rank{rank}.json")
    try:
        import torch
        import torch.distributed as dist
        import torch_ringdist  # noqa: F401  (registers the backend)

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ws,
                              False, timeout=STORE_TIMEOUT)
        result = SCENARIOS[scenario](rank, ws, store, dist, torch)
        result["pid"] = os.getpid()
        status = 0
    except BaseException:  # noqa: BLE001
        result = {"crash": traceback.format_exc(), "pid": os.getpid()}
        status = 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a wedged backend thread must not turn into a hang here.
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
