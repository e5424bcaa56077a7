"""Multi-process test harness: one long-lived "world" of worker processes runs many cases.

Spawning a torch process costs seconds on a small machine, so a World spawns its
workers once, initialises the default process group in each, and then serves
commands: ``World.run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every
rank and returns the per-rank results.

Workers are plain subprocesses running this file as a script, so the environment
(RINGDIST_SEGMENT_BYTES, OMP_NUM_THREADS, ...) is in place before torch is imported.
Parent and workers talk over a loopback socket with multiprocessing.connection
framing and plain pickle (not torch's ForkingPickler, which would try to share
tensor memory through file descriptors).

The parent never blocks without a deadline: a rank that hangs gets its Python
stacks dumped (faulthandler on SIGUSR1) into its log, then the whole world is
killed and marked dead so the fixture respawns it.
"""
from __future__ import annotations

import atexit
import datetime
import importlib
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait as mp_wait

from harness.procs import Launched, tail, world_envs

__all__ = ["World", "WorldError", "WorldHung", "close_all", "default_backend", "ranks_equal"]


def default_backend() -> str:
    return os.environ.get("RINGDIST_TEST_BACKEND", "ringdist")


class WorldError(AssertionError):
    """A rank raised, died, or the world could not start."""


class WorldHung(WorldError):
    """A command passed its deadline; the world was killed."""


def _import_root(module_name: str, module_file: str | None) -> str | None:
    """The sys.path entry a module was imported from (so a worker can import it too)."""
    if not module_file:
        return None
    path = os.path.abspath(module_file)
    path = os.path.dirname(path)  # strip the file name
    if os.path.basename(module_file).startswith("__init__."):
        path = os.path.dirname(path)  # a package: its own directory is a dotted part too
    for _ in range(module_name.count(".")):
        path = os.path.dirname(path)
    return path


_LIVE_WORLDS: "weakref.WeakSet[World]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    # A crashed or interrupted pytest must not leave workers spinning on a shared machine.
    for w in list(_LIVE_WORLDS):
        w._kill()


def close_all(worlds, timeout: float = 30) -> None:
    """Closes several worlds at once: all are told to exit before any is waited for, so their
    teardowns overlap; whatever is left at the deadline is killed."""
    worlds = list(worlds)
    for w in worlds:
        w._begin_close()
    deadline = time.monotonic() + timeout
    for w in worlds:
        w._finish_close(deadline)


class World:
    def __init__(
        self,
        world_size: int,
        backend: str | None = None,
        env: dict | None = None,
        timeout_s: float = 120,
    ):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend if backend is not None else default_backend()
        self.env = dict(env or {})
        self.timeout_s = float(timeout_s)
        self.dead = False
        self.dead_reason = ""
        self._closed = False
        self._launched: Launched | None = None
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection | None] = [None] * world_size
        self._logdir = tempfile.mkdtemp(prefix=f"ringdist-world{world_size}-")
        self.logs = [os.path.join(self._logdir, f"rank{r}.log") for r in range(world_size)]
        self._store = None
        _LIVE_WORLDS.add(self)
        try:
            self._start()
        except BaseException:
            self._kill()
            raise

    # ------------------------------------------------------------------ startup
    def _start(self) -> None:
        import torch.distributed as dist

        # The store lives in the parent: a free port is chosen by the OS (port 0), so
        # concurrent test sessions on one machine cannot collide.
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True,
            timeout=datetime.timedelta(seconds=self.timeout_s),
            wait_for_workers=False,
        )
        store_port = self._store.port

        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(self.world_size)
        server.settimeout(0.2)
        ctrl_port = server.getsockname()[1]
        token = secrets.token_hex(16)

        # Same import path as the parent (pytest's rootdir insertion etc.): world_envs.
        harness = {"_RINGDIST_WORLD_CTRL": f"127.0.0.1:{ctrl_port}:{token}",
                   "_RINGDIST_WORLD_BACKEND": self.backend,
                   "_RINGDIST_WORLD_TIMEOUT": str(self.timeout_s)}
        deadline = time.monotonic() + self.timeout_s
        try:
            self._launched = Launched(
                [[sys.executable, "-u", os.path.abspath(__file__)]] * self.world_size,
                world_envs(self.world_size, store_port, self.env, [harness] * self.world_size),
                cwd=os.getcwd(), logs=self.logs)
            self._procs = self._launched.procs

            # Accept the control connections; each worker says hello with its rank.
            pending = self.world_size
            while pending:
                self._check_procs_alive("starting")
                if time.monotonic() > deadline:
                    raise self._hang_and_kill("world did not start (workers never connected)",
                                              [r for r in range(self.world_size) if self._conns[r] is None])
                try:
                    sock, _ = server.accept()
                except socket.timeout:
                    continue
                sock.settimeout(None)
                conn = Connection(sock.detach())
                if not conn.poll(10):
                    conn.close()
                    continue
                hello = pickle.loads(conn.recv_bytes())
                if hello[0] != "hello" or hello[1] != token:
                    conn.close()  # a stranger on our port
                    continue
                self._conns[hello[2]] = conn
                pending -= 1
        finally:
            server.close()

        # Each worker now imports torch and joins the process group.
        replies = self._collect("init_process_group", deadline)
        failed = {r: rep[1] for r, rep in replies.items() if rep[0] != "ready"}
        if failed:
            self._kill()
            self._mark_dead("init_process_group failed")
            raise WorldError(self._format_errors(
                f"world_size={self.world_size} backend={self.backend!r} failed to start", failed))

    # ----------------------------------------------------------------- commands
    def run(self, fn, *args, timeout: float = 60, **kwargs) -> list:
        """Call ``fn(rank, world_size, *args, **kwargs)`` on every rank; per-rank results."""
        if self.dead:
            raise WorldError(f"world is dead ({self.dead_reason}); get a fresh one from the fixture")
        if self._closed:
            raise WorldError("world is closed")
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<" in qualname:
            raise TypeError(f"World.run needs a module-level function, got {fn!r}")
        root = _import_root(module, getattr(sys.modules.get(module), "__file__", None))
        try:
            payload = pickle.dumps(("call", module, qualname, root, args, kwargs))
        except Exception as e:
            raise TypeError(f"arguments for {qualname} are not picklable: {e}") from e

        for r, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError:
                self._check_procs_alive(f"sending {qualname}")
                raise
        replies = self._collect(qualname, time.monotonic() + timeout)
        failed = {r: rep[1] for r, rep in replies.items() if rep[0] != "ok"}
        if failed:
            raise WorldError(self._format_errors(f"{qualname} raised on {len(failed)} rank(s)", failed))
        return [pickle.loads(replies[r][1]) for r in range(self.world_size)]

    def _collect(self, what: str, deadline: float, grace_s: float = 10.0) -> dict:
        """Wait for one reply from every rank, never past the deadline."""
        replies: dict[int, tuple] = {}
        waiting = {conn: r for r, conn in enumerate(self._conns)}
        first_error_at = None
        while waiting:
            limit = deadline
            if first_error_at is not None:
                # Once a rank failed, its peers are likely stuck in a collective with it.
                limit = min(deadline, first_error_at + grace_s)
            remaining = limit - time.monotonic()
            if remaining <= 0:
                missing = sorted(waiting.values())
                errs = {r: rep[1] for r, rep in replies.items() if rep[0] not in ("ok", "ready")}
                msg = (f"world hung: rank(s) {missing} did not finish {what} "
                       f"within the deadline" + (" after another rank failed" if errs else ""))
                raise self._hang_and_kill(msg, missing, errs)
            for conn in mp_wait(list(waiting), timeout=min(remaining, 1.0)):
                r = waiting.pop(conn)
                try:
                    replies[r] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._procs[r].poll()
                    self._kill()
                    self._mark_dead(f"rank {r} died during {what}")
                    raise WorldError(
                        f"rank {r} died during {what} (exit code {self._procs[r].returncode}); "
                        f"world killed.\n--- rank {r} log ---\n{tail(self.logs[r])}")
                if replies[r][0] not in ("ok", "ready") and first_error_at is None:
                    first_error_at = time.monotonic()
        return replies

    # ----------------------------------------------------------------- teardown
    def close(self, timeout: float = 30) -> None:
        """Orderly shutdown: workers destroy the process group and exit; killed after the deadline."""
        close_all([self], timeout)

    def _begin_close(self) -> None:
        """Tells the workers to destroy the process group and exit (close_all waits for them)."""
        if self._closed:
            return
        self._closed = True
        if not self.dead:
            for conn in self._conns:
                try:
                    conn.send_bytes(pickle.dumps(("close",)))
                except (OSError, AttributeError):
                    pass

    def _finish_close(self, deadline: float) -> None:
        for p in self._procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        _LIVE_WORLDS.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def alive(self) -> bool:
        return not self.dead and not self._closed and all(p.poll() is None for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __repr__(self):
        state = "alive" if self.alive else ("dead: " + self.dead_reason if self.dead else "closed")
        return f"World(world_size={self.world_size}, backend={self.backend!r}, env={self.env}, {state})"

    # ----------------------------------------------------------------- internals
    def _mark_dead(self, reason: str) -> None:
        self.dead = True
        self.dead_reason = reason

    def _kill(self) -> None:
        if self._launched is not None:
            self._launched.kill()
        for conn in self._conns:
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        self._store = None

    def _check_procs_alive(self, what: str) -> None:
        for r, p in enumerate(self._procs):
            if p.poll() is not None:
                self._kill()
                self._mark_dead(f"rank {r} exited while {what}")
                raise WorldError(f"rank {r} exited with code {p.returncode} while {what}; world killed."
                                 f"\n--- rank {r} log ---\n{tail(self.logs[r])}")

    def _hang_and_kill(self, msg: str, missing: list[int], errors: dict | None = None) -> WorldHung:
        # Ask the stuck ranks for their Python stacks before killing them.
        if self._launched is not None:
            self._launched.signal_stacks(missing)
        self._kill()
        self._mark_dead(msg)
        parts = [msg + f" (world_size={self.world_size}, backend={self.backend!r}, env={self.env}); "
                 "world killed"]
        for r, tb in sorted((errors or {}).items()):
            parts.append(f"--- rank {r} raised ---\n{tb}")
        for r in missing:
            if r < len(self.logs):
                parts.append(f"--- rank {r} log (stacks at kill time) ---\n{tail(self.logs[r])}")
        return WorldHung("\n".join(parts))

    def _format_errors(self, headline: str, failed: dict) -> str:
        parts = [f"{headline} (world_size={self.world_size}, backend={self.backend!r}, env={self.env})"]
        for r, tb in sorted(failed.items()):
            parts.append(f"--- rank {r} ---\n{tb}")
        return "\n".join(parts)


def ranks_equal(results, what: str = "result") -> None:
    """Assert every rank returned the same value (bytes, digests, dicts of them...).

    For dicts, report which keys differ so a failure names the offending case.
    """
    assert len(results) >= 1
    ref = results[0]
    if isinstance(ref, dict):
        bad = []
        for r, res in enumerate(results[1:], start=1):
            assert res.keys() == ref.keys(), f"rank {r} returned different {what} keys"
            bad += [f"{k} (rank 0 vs rank {r})" for k in ref if res[k] != ref[k]]
        assert not bad, f"{what} differs across ranks for: " + ", ".join(bad[:20])
    else:
        for r, res in enumerate(results[1:], start=1):
            assert res == ref, f"{what} differs between rank 0 and rank {r}"


# ====================================================================== worker
def _die_with_parent() -> None:
    # A worker stuck in a collective must not outlive a killed pytest.
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _resolve(module_name: str, qualname: str, root: str | None):
    if root and root not in sys.path:
        sys.path.insert(0, root)
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_main() -> None:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(1)
    import faulthandler
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    host, port, token = os.environ.pop("_RINGDIST_WORLD_CTRL").rsplit(":", 2)
    backend = os.environ.pop("_RINGDIST_WORLD_BACKEND")
    timeout_s = float(os.environ.pop("_RINGDIST_WORLD_TIMEOUT"))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    sock = socket.create_connection((host, int(port)))
    conn = Connection(sock.detach())
    conn.send_bytes(pickle.dumps(("hello", token, rank)))

    try:
        import torch  # noqa: F401  (env is already set: this is the first torch import)
        import torch.distributed as dist
        if "ringdist" in backend:  # "ringdist", or a mixed form like "cpu:ringdist,cuda:nccl"
            import torch_ringdist  # noqa: F401  (registers the backend)
        store = dist.TCPStore(host, int(os.environ["MASTER_PORT"]), world_size, False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, rank=rank, world_size=world_size, store=store,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except BaseException:
        conn.send_bytes(pickle.dumps(("init_error", traceback.format_exc())))
        sys.exit(1)
    conn.send_bytes(pickle.dumps(("ready", None)))

    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # parent went away
        if msg[0] == "close":
            try:
                dist.destroy_process_group()
            finally:
                os._exit(0)
        _, module_name, qualname, root, args, kwargs = msg
        try:
            fn = _resolve(module_name, qualname, root)
            result = fn(rank, world_size, *args, **kwargs)
            reply = ("ok", pickle.dumps(result))
        except BaseException:
            reply = ("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))


if __name__ == "__main__":
    _worker_main()
