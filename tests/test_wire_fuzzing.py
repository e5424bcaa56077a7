"""Fuzzing the wire parsers under AddressSanitizer (issue: nothing trusted from the wire).

The test builds an ASan+UBSan variant of the extension, runs one real rank 0 on it, and
plays rank 1 itself: it completes the real handshake (reading the group secret
from the store, as a buggy or compromised peer could) and then streams random and
mutated frames: op headers with random types, dtypes, counts and tags, point-to-point
headers announcing absurd sizes, truncated frames, raw noise. Rank 0 must turn every
one into a clean error; any memory error aborts it with an ASan report.
"""
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from harness import wire_client as wire
from harness.procs import Launched, free_port

pytestmark = [pytest.mark.own_build, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, "tests", "scenarios", "wire_fuzzing.py")
CASES = int(os.environ.get("RINGDIST_FUZZ_CASES", "40"))


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory):
    """The package with its extension built with -fsanitize=address,undefined."""
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.fail("AddressSanitizer runtime (libasan.so) not found: install gcc's libasan")
    out = tmp_path_factory.mktemp("asan")
    # CPU code only: the fuzzed parsers are host code, and nvcc would only add minutes.
    # Without the test hooks: the parsers as a release builds them.
    env = dict(os.environ, RINGDIST_DEBUG_BUILD="1", TORCH_RINGDIST_CUDA="0",
               TORCH_RINGDIST_TESTING="0")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp",
                    os.path.join(REPO, "build", "asan-temp"), "--build-lib", str(out)],
                   cwd=REPO, env=env, check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    # The Python side of the package next to the instrumented extension (not what an in-place
    # build put in the source folder: its library and headers would replace the ASan ones).
    for name in os.listdir(os.path.join(REPO, "torch_ringdist")):
        src = os.path.join(REPO, "torch_ringdist", name)
        if name.endswith(".py") and name != "_build_config.py":
            shutil.copy(src, out / "torch_ringdist" / name)
        elif os.path.exists(os.path.join(src, "__init__.py")):  # a subpackage (hooks/)
            shutil.copytree(src, out / "torch_ringdist" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
    return str(out), libasan


def _case_key(store, case, suffix, deadline):
    """The full store key of this case (rank 0 prefixes keys with case<N>/) ending in suffix."""
    while time.monotonic() < deadline:
        keys = [k for k in store.list_keys() if k.startswith(f"case{case}/") and k.endswith(suffix)]
        if keys:
            return keys[0]
        time.sleep(0.01)
    raise TimeoutError(f"case {case}: no store key ending in {suffix}")


def _frames(rng):
    """A byte stream a misbehaving authenticated rank 1 might send."""
    out = b""
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.15:  # a well-formed message for the tag-7 receive, so parsing goes on
            out += wire.op_header(type=wire.OP_SEND, count=12, tag=7) + rng.randbytes(12)
        elif kind < 0.45:  # a plausible header with hostile fields, then some payload
            # (keyword arguments are evaluated in the order written: the stream depends on it)
            header = wire.op_header(
                magic=wire.OP_MAGIC if rng.random() < 0.9 else rng.getrandbits(32),
                type=rng.choice([1, 2, 9, 10, 11, rng.randint(0, 255)]),
                dtype=rng.choice([0, 6, 7, 8, rng.randint(0, 255)]),
                op=rng.randint(0, 255), variant=rng.randint(0, 255),
                seq=rng.choice([0, 1, 2, rng.getrandbits(64)]),
                count=rng.choice([0, 3, 12, 136, 2**31, 2**63, rng.getrandbits(64)]),
                root=rng.choice([-1, 0, 1, rng.randint(-2**31, 2**31 - 1)]),
                segment_bytes=rng.choice([0, 262144, rng.getrandbits(32)]),
                tag=rng.choice([0, 7, 1, 2, rng.randint(-2**31, 2**31 - 1)]),
                padding=rng.choice([0, 0, rng.getrandbits(32)]))
            out += header + rng.randbytes(rng.choice([0, 4, 12, 64, 200]))
        elif kind < 0.75:  # a truncated header
            out += wire.op_header(type=wire.OP_SEND, dtype=6, count=12,
                                  tag=7)[: rng.randint(1, wire.OP.size - 1)]
        else:  # noise
            out += rng.randbytes(rng.randint(1, 300))
    return out


def _play_rank1(store, case, rng, deadline):
    addr_key = _case_key(store, case, "ringdist/addr/0", deadline)
    secret = store.get(_case_key(store, case, "ringdist/secret", deadline))
    host, port = store.get(addr_key).decode().rsplit(":", 1)
    assert host == "127.0.0.1"
    s = wire.connect(host, int(port), wire.proof_key(secret), rank=1, size=2, timeout=5)
    if s is None:
        return "dropped at handshake"
    with s:
        try:
            s.sendall(_frames(rng))
        except OSError:
            pass  # rank 0 already rejected what it read and closed the link
        time.sleep(0.05)
    return "sent"


def test_wire_parsers_survive_fuzzing_under_asan(asan_build, tmp_path):
    lib, libasan = asan_build
    import torch.distributed as dist
    import datetime

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    # libstdc++ right after the ASan runtime, so ASan's exception interceptors find
    # the real __cxa_throw (python itself does not link libstdc++).
    libstdcxx = subprocess.run(["gcc", "-print-file-name=libstdc++.so.6"], capture_output=True,
                               text=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=lib, LD_PRELOAD=f"{libasan} {libstdcxx}",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:handle_segv=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", OMP_NUM_THREADS="1")
    env.pop("RINGDIST_CRC", None)
    # A plaintext link: the fuzzer's frames reach the parsers as a compromised peer's would
    # reach them out of its sealed records (the records themselves: test_encryption.py).
    env["RINGDIST_TCP_ENCRYPT"] = "0"
    log = tmp_path / "target.log"
    cmd = [sys.executable, "-P", "-c",
           "import torch_ringdist, runpy, sys; sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')",
           TARGET, "127.0.0.1", str(port), str(CASES)]
    rng = random.Random(20261121)
    outcomes = []
    with Launched([cmd], [env], logs=[log]) as launched:
        target = launched.procs[0]
        deadline = time.monotonic() + 600
        for case in range(CASES):
            outcomes.append(_play_rank1(store, case, rng, deadline))
            # Next case only after rank 0 finished this one (its keys live under case<N>).
            while store.add(f"case{case}/done", 0) < 1:
                if target.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            if target.poll() is not None:
                break
        exited = launched.wait(120)
    output = log.read_text(errors="replace")
    assert exited, f"rank 0 did not exit within 120 s after the last case (killed):\n{output[-6000:]}"
    assert "ERROR: AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    assert target.returncode == 0, f"rank 0 exited {target.returncode}:\n{output[-6000:]}"
    assert "ALL CASES DONE" in output, output[-3000:]
    results = [line for line in output.splitlines() if line.startswith("CASE ")]
    assert len(results) == CASES, output[-3000:]
    # The fuzzer's garbage must have been rejected as errors, not accepted as data.
    assert sum(" ok" in line for line in results) < CASES // 2, results
