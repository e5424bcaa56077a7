"""How TCP links are set up (issue 44, item 2): congestion control per socket and socket
buffers, as the kernel reports them on the sockets of a real group.

Each rank reads its own TCP sockets back from Python (getsockopt on a duplicate of every
socket descriptor it holds) and matches them to the links the backend reports
(`links`: local and peer address); the expected values come from /proc and the settings,
worked out here. Every world starts its sockets with reno (benchmarks/wan/cc_shim.c, as a
host whose default is reno), so the backend's own choice is visible.
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from harness.spawned import RINGDIST_ONLY

pytestmark = [pytest.mark.quick, RINGDIST_ONLY]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTING_CC = "reno"  # what every socket starts with under the shim


def _proc_words(name):
    with open(f"/proc/sys/net/{name}") as f:
        return f.read().split()


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the congestion-control shim")
    out = tmp_path_factory.mktemp("shim") / "libcc_shim.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out),
                    os.path.join(REPO, "benchmarks", "wan", "cc_shim.c"), "-ldl"], check=True)
    return {"LD_PRELOAD": str(out), "WAN_TCP_CONGESTION": STARTING_CC}


def _sockets_seen_by_python():
    """(local, peer) -> (congestion, SO_SNDBUF, SO_RCVBUF) of every connected TCP socket
    of this process."""
    seen = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with s:
            if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                continue
            try:
                peer = s.getpeername()
            except OSError:
                continue  # a listener
            local = s.getsockname()
            key = (f"{local[0]}:{local[1]}", f"{peer[0]}:{peer[1]}")
            cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
            seen[key] = (cc.split(b"\0")[0].decode(),
                         s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                         s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    return seen


def _links(rank, ws):
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    seen = _sockets_seen_by_python()
    out = []
    for peer, link in enumerate(backend.links):
        if peer == rank:
            assert link == {}, link
            continue
        assert backend.transports[peer] == "tcp", backend.transports
        found = seen.get((link["local"], link["peer"]))
        assert found is not None, (link, sorted(seen))
        out.append({"reported": (link["congestion"], int(link["send_buffer"]),
                                 int(link["recv_buffer"])),
                    "python": found,
                    "set": (link["send_buffer_set"], link["recv_buffer_set"])})
    # Every rank still works over those links.
    t = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(t)
    assert bool((t == ws * (ws + 1) / 2).all())
    return out


def _expected_congestion(setting):
    if setting == "system":
        return STARTING_CC
    if setting == "auto":
        offered = _proc_words("ipv4/tcp_available_congestion_control")
        return "bbr" if "bbr" in offered else STARTING_CC
    return setting


def _has_cap_net_admin():
    with open("/proc/self/status") as f:
        caps = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) & (1 << 12))  # CAP_NET_ADMIN


def _expected_buffer(cap, unprivileged_max, autotune_max):
    """What SO_SNDBUF / SO_RCVBUF should read, or None when autotuning keeps it (any size)."""
    asked = cap if _has_cap_net_admin() else min(cap, unprivileged_max)
    return 2 * asked if cap and 2 * asked > autotune_max else None


@pytest.mark.parametrize("setting", ["auto", "system", "cubic"])
def test_congestion_control_is_what_the_sockets_report(world_factory, shim, setting):
    if setting not in ("auto", "system") and setting not in _proc_words(
            "ipv4/tcp_available_congestion_control"):
        pytest.skip(f"the kernel does not offer {setting}")
    env = {"RINGDIST_TRANSPORT": "tcp", "RINGDIST_TCP_CONGESTION": setting, **shim}
    want = _expected_congestion(setting)
    for rank_links in world_factory(3, env=env).run(_links):
        assert len(rank_links) == 2
        for link in rank_links:
            assert link["reported"][0] == link["python"][0] == want, link


@pytest.mark.parametrize("cap", [0, 24 << 20])
def test_buffers_as_set(world_factory, shim, cap):
    env = {"RINGDIST_TRANSPORT": "tcp", "RINGDIST_TCP_BUFFER_BYTES": str(cap), **shim}
    send = _expected_buffer(cap, int(_proc_words("core/wmem_max")[0]),
                            int(_proc_words("ipv4/tcp_wmem")[2]))
    recv = _expected_buffer(cap, int(_proc_words("core/rmem_max")[0]),
                            int(_proc_words("ipv4/tcp_rmem")[2]))
    for rank_links in world_factory(2, env=env).run(_links):
        for link in rank_links:
            assert link["reported"] == link["python"], link
            assert link["set"] == ("1" if send else "0", "1" if recv else "0"), link
            if send:
                assert link["python"][1] == send, link
            if recv:
                assert link["python"][2] == recv, link


def test_unknown_congestion_control_fails_init_naming_the_setting(tmp_path):
    script = ("import sys, torch.distributed as dist, torch_ringdist\n"
              f"dist.init_process_group('ringdist', init_method='file://{tmp_path}/store', "
              "rank=int(sys.argv[1]), world_size=2)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGDIST_")}
    env["RINGDIST_TCP_CONGESTION"] = "nosuchcc"
    procs = [subprocess.Popen([sys.executable, "-P", "-c", script, str(r)], env=env,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0, err[-2000:]
        assert "RINGDIST_TCP_CONGESTION='nosuchcc'" in err and "does not offer it" in err, \
            err[-2000:]
