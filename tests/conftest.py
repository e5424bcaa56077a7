"""pytest's setup for the suite: the build check, the fixtures over tests/harness/ (cached
multi-process worlds), the order of the items and --smoke."""
from __future__ import annotations

import os
import sys

import pytest

# tests/ on the import path whatever pytest's import mode: the test files import harness.*
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.world import World, close_all, default_backend  # noqa: E402

# By default a host measures at connect time whether single copy beats the shared-memory
# rings (RINGDIST_SINGLE_COPY=auto), so the path a large same-host transfer takes depends on
# the machine. The suite pins it for every rank it starts: single copy, except where a world
# or test says otherwise (the three-rank "default" world runs the rings; test_copy_probe the
# measurement).
os.environ.setdefault("RINGDIST_SINGLE_COPY", "1")


def pytest_sessionstart(session):
    from torch_ringdist._extension import build_record, source_checkout
    record, checkout = build_record(), source_checkout()
    if record is None and checkout is not None:
        raise pytest.UsageError(
            f"pytest imports torch_ringdist from the unbuilt source folder {checkout}: "
            "build it in place (TORCH_RINGDIST_TESTING=1 pip install --no-build-isolation -e .), "
            "or run `python -P -m pytest` (scripts/run_pytest.sh) to test the installed package")
    if not getattr(record, "TESTING", False):
        raise pytest.UsageError(
            "the suite needs a test build of torch_ringdist (its _C.testing module and fault "
            "injection): TORCH_RINGDIST_TESTING=1 pip install --no-build-isolation -e . "
            "(scripts/test.sh and scripts/quick_check.sh build it so)")


@pytest.fixture(scope="session")
def cpp_example():
    """examples/cpp built against the installed package (build/teardown-example, incremental):
    the path of its program."""
    import subprocess

    import torch_ringdist

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.join(repo, "build", "teardown-example")
    for cmd in (["cmake", "-S", os.path.join(repo, "examples", "cpp"), "-B", build,
                 f"-DCMAKE_PREFIX_PATH={torch_ringdist.cmake_prefix_path}"],
                ["cmake", "--build", build, "--parallel", os.environ.get("MAX_JOBS", "2")]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return os.path.join(build, "ringdist_train")


@pytest.fixture(scope="session")
def backend() -> str:
    return default_backend()


@pytest.fixture(scope="session")
def world_factory():
    """``world_factory(world_size, env=None)`` -> a live World, cached for the session.

    Worlds are keyed by (world_size, backend, env); a world that died (hang, crash)
    is replaced by a fresh one on the next request.
    """
    worlds: dict[tuple, World] = {}  # insertion order doubles as least-recently-used order
    # Idle workers cost ~250 MB each on a shared machine: past this many live worker
    # processes, the least recently used worlds are closed (and respawned if asked again).
    max_procs = int(os.environ.get("RINGDIST_TEST_MAX_PROCS", "24"))

    def get(world_size: int, env: dict | None = None) -> World:
        env = {k: str(v) for k, v in (env or {}).items()}
        key = (world_size, default_backend(), frozenset(env.items()))
        w = worlds.pop(key, None)
        if w is None or not w.alive:
            if w is not None:
                w.close()
            evicted = []
            while worlds and sum(x.world_size for x in worlds.values()) + world_size > max_procs:
                evicted.append(worlds.pop(next(iter(worlds))))
            close_all(evicted)
            w = World(world_size, env=env)
        worlds[key] = w  # now the most recently used
        return w

    yield get
    close_all(worlds.values())


@pytest.hookimpl(trylast=True)  # after -m and -k deselect: --smoke picks among what is left
def pytest_collection_modifyitems(session, config, items):
    """Run each module's tests grouped by world, so every world is spawned once.

    Spawning a world costs seconds on a small machine and live worlds are capped
    (RINGDIST_TEST_MAX_PROCS), so parametrize's default order (all worlds per test
    function) would close and respawn worlds over and over. The sort is stable:
    inside one world the tests keep their written order.
    """
    module_rank = {}
    for item in items:
        module_rank.setdefault(item.module.__name__ if item.module else "", len(module_rank))

    def key(item):
        params = getattr(getattr(item, "callspec", None), "params", {})
        world = (params.get("ws", 0), str(params.get("seg", "")))
        return module_rank[item.module.__name__ if item.module else ""], world

    items.sort(key=key)
    if config.getoption("--smoke"):
        keep = smoke_selection(items)
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = [item for item in items if item in keep]


def pytest_addoption(parser):
    parser.addoption(
        "--smoke", action="store_true",
        help="one case of each test file (a two-rank world where it has one), and every "
             "case marked cuda: CI's CUDA-build stage, whose host code the first stage tested")


def smoke_selection(items):
    """The items --smoke keeps: per test file one case (its first two-rank case, else its first
    case), and all of those marked ``cuda``."""
    chosen: dict[str, tuple] = {}
    keep = set()
    for item in items:
        if item.get_closest_marker("cuda"):
            keep.add(item)
            continue
        module = item.module.__name__ if item.module else item.nodeid.split("::")[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        two_ranks = params.get("ws", params.get("world_size")) == 2
        if module not in chosen or (two_ranks and not chosen[module][1]):
            chosen[module] = (item, two_ranks)
    keep.update(item for item, _ in chosen.values())
    return keep
