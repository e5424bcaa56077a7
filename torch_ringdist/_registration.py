"""Registration of the "ringdist" backend with torch.distributed."""
import atexit
import concurrent.futures
import contextlib
import gc
import logging
import sys
import threading

from torch_ringdist._extension import build_record, load

logger = logging.getLogger(__name__)

BACKEND_NAME = "ringdist"


_exit_hook_registered = False
# A backend connected ahead of its init_process_group (connect_ahead), which the next call of
# _create_backend takes instead of connecting: set only around that call (adopting).
_ahead = None


def _shutdown_at_exit():
    # Before Python finalizes: a ringdist worker thread still running then would be
    # killed while dropping a tensor (it needs the GIL) and abort the process.
    # After an uncaught exception (Python set sys.last_value) the groups are aborted: the
    # peers may be blocked in an operation with this rank, and waiting for their goodbye
    # would hold both until the teardown deadline (10 s); closed at once, their operation
    # fails with this rank's loss within a second.
    failed = getattr(sys, "last_value", None) is not None
    load()._shutdown_all(wait_for_peers=not failed)
    if failed:
        # And the failed rank leaves at once: Python's last garbage collections walk every
        # object torch made (2 s for a rank that trained, on a loaded 2-core machine), and its
        # launcher stops the other ranks only once it has left. Objects alive now stay as
        # they are, as Python already promises no finalizer of an object alive at exit.
        gc.freeze()


def _register_exit_hook():
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_shutdown_at_exit)
        _exit_hook_registered = True


def _create_backend(store, rank, world_size, timeout):
    global _ahead
    ext = load()
    _register_exit_hook()
    if _ahead is not None:
        connecting, _ahead = _ahead, None
        backend = connecting.result(timeout=timeout.total_seconds())
        if (backend.rank(), backend.size()) != (rank, world_size):
            raise RuntimeError(f"ringdist: rank {rank}: init_process_group(world_size="
                               f"{world_size}) was given a group connected ahead as rank "
                               f"{backend.rank()} of {backend.size()}")
        return backend
    # Listens where torch_ringdist::createBackend says: RINGDIST_SOCKET_IFNAME, else the
    # address that routes to the store's host (MASTER_ADDR), loopback on one host.
    return ext.create_backend(store, rank, world_size, timeout)


def connect_ahead(store, rank: int, world_size: int, timeout) -> "concurrent.futures.Future":
    """Starts connecting this rank's ringdist backend of a group to come (every rank of it
    calls this with the same ``store``), on a thread: the connect's store and network round
    trips overlap what the caller does meanwhile. Returns the future backend, for
    :func:`adopting`."""
    _register_exit_hook()
    future = concurrent.futures.Future()

    def connect():
        try:
            future.set_result(load().create_backend(store, rank, world_size, timeout))
        except Exception as exc:  # noqa: BLE001 (raised where the backend is taken)
            future.set_exception(exc)

    threading.Thread(target=connect, name="ringdist-connect-ahead", daemon=True).start()
    return future


@contextlib.contextmanager
def adopting(connecting: "concurrent.futures.Future"):
    """Within it, init_process_group("ringdist") takes the backend ``connecting``
    (:func:`connect_ahead`) instead of connecting one."""
    global _ahead
    _ahead = connecting
    try:
        yield
    finally:
        _ahead = None


def _devices():
    """The device types to register: "cuda" only where the build has CUDA code."""
    record = build_record()
    return ["cpu", "cuda"] if record is not None and record.CUDA else ["cpu"]


def _mend_shrunk_groups(c10d):
    """dist.shrink_group registers the shrunk backend as GLOO for CPU (torch assumes gloo or
    nccl); DDP's logger then treats our backend as ProcessGroupGloo and crashes. Register it
    as what init_process_group makes of a third-party backend: CUSTOM, on our devices."""
    create = getattr(c10d, "_create_shrunk_process_group", None)
    if create is None or getattr(create, "_ringdist_mended", False):
        return

    def create_shrunk(new_backend, *args, **kwargs):
        metadata = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        spare = take_spare_client(metadata.get("store"))
        if spare is not None:  # torch would clone the store here, while training waits
            args = (args[0], {**metadata, "store": _Cloned(spare)}, *args[2:])
        pg = create(new_backend, *args, **kwargs)
        if new_backend.name() == BACKEND_NAME:
            import torch

            custom = c10d.ProcessGroup.BackendType.CUSTOM
            for device in _devices():
                pg._register_backend(torch.device(device), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    create_shrunk._ringdist_mended = True
    c10d._create_shrunk_process_group = create_shrunk


# A new connection to the store costs a round trip or two (0.2 s at RTT 100 ms): torch clones
# the store for a shrunk group while the survivors wait to train again, and a group connected
# ahead talks to the store over a client of its own. keep_spare_client makes such a clone ahead,
# off the caller's path, and the next user of that store takes it (take_spare_client). A few
# stores at most: one more replaces the oldest.
_spares = {}  # id(store) -> [store, its clone, or None while it is being made]
_spares_lock = threading.Lock()
_MAX_SPARES = 4


def keep_spare_client(store) -> None:
    """Makes (on a thread of its own) a client of ``store`` for its next user, unless there
    is one."""
    with _spares_lock:
        if id(store) in _spares:
            return
        while len(_spares) >= _MAX_SPARES:
            del _spares[next(iter(_spares))]
        entry = _spares[id(store)] = [store, None]

    def make():
        try:
            clone = store.clone()
        except Exception:  # noqa: BLE001 (the store cannot clone, or is gone: cloned when used)
            clone = None
        with _spares_lock:
            if _spares.get(id(store)) is entry:
                if clone is None:
                    del _spares[id(store)]
                else:
                    entry[1] = clone

    threading.Thread(target=make, name="ringdist-spare-client", daemon=True).start()


def take_spare_client(store):
    """The client of ``store`` made ahead (keep_spare_client), once, or None."""
    with _spares_lock:
        entry = _spares.get(id(store))
        if store is None or entry is None or entry[0] is not store or entry[1] is None:
            return None
        del _spares[id(store)]
        return entry[1]


class _Cloned:
    """Stands for a store in torch's shrink, where the store is only cloned: gives the spare."""

    def __init__(self, clone):
        self._clone = clone

    def clone(self):
        return self._clone


def register_backend():
    """Registers "ringdist" once; safe to call repeatedly."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    _mend_shrunk_groups(dist.distributed_c10d)
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=_devices())
    logger.debug("registered torch.distributed backend %r", BACKEND_NAME)
