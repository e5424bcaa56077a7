"""Fuzzing the wire parsers under AddressSanitizer (issue: nothing trusted from the wire).

The test builds an ASan+UBSan variant of the extension, runs one real rank 0 on it, and
plays rank 1 itself: it completes the real HMAC handshake (reading the group secret
from the store, as a buggy or compromised peer could) and then streams random and
mutated frames: op headers with random types, dtypes, counts and tags, point-to-point
headers announcing absurd sizes, truncated frames, raw noise. Rank 0 must turn every
one into a clean error; any memory error aborts it with an ASan report.
"""
import hashlib
import hmac
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, "tests", "scripts", "fuzz_target.py")
CASES = int(os.environ.get("RINGDIST_FUZZ_CASES", "40"))

MAGIC, VERSION = 0x52444832, 2
CHALLENGE = struct.Struct("<IIi16s")
HELLO = struct.Struct("<IIii16s32s")
OP = struct.Struct("<IBBBBQQii")  # OpHeader: magic, type, dtype, op, reserved, seq, count, root, tag
OP_MAGIC = 0x52444f50


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory):
    """The package with its extension built with -fsanitize=address,undefined."""
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.fail("AddressSanitizer runtime (libasan.so) not found: install gcc's libasan")
    out = tmp_path_factory.mktemp("asan")
    env = dict(os.environ, RINGDIST_DEBUG_BUILD="1")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp",
                    os.path.join(REPO, "build", "asan-temp"), "--build-lib", str(out)],
                   cwd=REPO, env=env, check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    # The Python side of the package next to the instrumented extension.
    for name in os.listdir(os.path.join(REPO, "torch_ringdist")):
        src = os.path.join(REPO, "torch_ringdist", name)
        if name.endswith(".py"):
            shutil.copy(src, out / "torch_ringdist" / name)
        elif os.path.isdir(src) and name != "__pycache__":
            shutil.copytree(src, out / "torch_ringdist" / name, dirs_exist_ok=True)
    return str(out), libasan


def _case_key(store, case, suffix, deadline):
    """The full store key of this case (rank 0 prefixes keys with case<N>/) ending in suffix."""
    while time.monotonic() < deadline:
        keys = [k for k in store.list_keys() if k.startswith(f"case{case}/") and k.endswith(suffix)]
        if keys:
            return keys[0]
        time.sleep(0.01)
    raise TimeoutError(f"case {case}: no store key ending in {suffix}")


def _mac(secret, label, nonce, a, b, c):
    message = label.encode().ljust(8, b"\0") + nonce + struct.pack("<iii", a, b, c)
    return hmac.new(secret, message, hashlib.sha256).digest()


def _frames(rng):
    """A byte stream a misbehaving authenticated rank 1 might send."""
    out = b""
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.15:  # a well-formed message for the tag-7 receive, so parsing goes on
            out += OP.pack(OP_MAGIC, 10, 0, 0, 0, 0, 12, -1, 7) + rng.randbytes(12)
        elif kind < 0.45:  # a plausible header with hostile fields, then some payload
            header = OP.pack(OP_MAGIC if rng.random() < 0.9 else rng.getrandbits(32),
                             rng.choice([1, 2, 9, 10, 11, rng.randint(0, 255)]),
                             rng.choice([0, 6, 7, 8, rng.randint(0, 255)]),
                             rng.randint(0, 255), rng.randint(0, 255),
                             rng.choice([0, 1, 2, rng.getrandbits(64)]),
                             rng.choice([0, 3, 12, 136, 2**31, 2**63, rng.getrandbits(64)]),
                             rng.choice([-1, 0, 1, rng.randint(-2**31, 2**31 - 1)]),
                             rng.choice([0, 7, 1, 2, rng.randint(-2**31, 2**31 - 1)]))
            out += header + rng.randbytes(rng.choice([0, 4, 12, 64, 200]))
        elif kind < 0.75:  # a truncated header
            out += OP.pack(OP_MAGIC, 10, 6, 0, 0, 0, 12, -1, 7)[: rng.randint(1, 31)]
        else:  # noise
            out += rng.randbytes(rng.randint(1, 300))
    return out


def _play_rank1(store, case, rng, deadline):
    addr_key = _case_key(store, case, "ringdist/addr/0", deadline)
    secret = store.get(_case_key(store, case, "ringdist/secret", deadline))
    host_key = addr_key.replace("addr/0", "host/1")
    host, port = store.get(addr_key).decode().rsplit(":", 1)
    assert host == "127.0.0.1"
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.settimeout(5)
        challenge = b""
        while len(challenge) < CHALLENGE.size:
            challenge += s.recv(CHALLENGE.size - len(challenge))
        _, _, acceptor, nonce = CHALLENGE.unpack(challenge)
        s.sendall(HELLO.pack(MAGIC, VERSION, 1, 2, os.urandom(16), _mac(secret, "hello", nonce, 1, 2, acceptor)))
        ack = b""
        while len(ack) < 36:
            chunk = s.recv(36 - len(ack))
            if not chunk:
                return "dropped at handshake"
            ack += chunk
        # Another "host", so rank 0 keeps this TCP link.
        store.set(host_key, b"fuzzer-host\nauto|nocrc")
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

    port = _free_port()
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
    log = open(tmp_path / "target.log", "w+")
    target = subprocess.Popen([sys.executable, "-P", "-c",
                               "import torch_ringdist, runpy, sys; sys.argv = sys.argv[1:]; "
                               "runpy.run_path(sys.argv[0], run_name='__main__')",
                               TARGET, "127.0.0.1", str(port), str(CASES)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    rng = random.Random(20261121)
    outcomes = []
    try:
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
        target.wait(timeout=120)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    log.seek(0)
    output = log.read()
    assert "ERROR: AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    assert target.returncode == 0, f"rank 0 exited {target.returncode}:\n{output[-6000:]}"
    assert "ALL CASES DONE" in output, output[-3000:]
    results = [line for line in output.splitlines() if line.startswith("CASE ")]
    assert len(results) == CASES, output[-3000:]
    # The fuzzer's garbage must have been rejected as errors, not accepted as data.
    assert sum(" ok" in line for line in results) < CASES // 2, results


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
