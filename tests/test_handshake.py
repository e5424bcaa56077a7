"""The TCP handshake against foreign clients (issue 5, scenarios 8, 9 and 12).

While ranks sit in their accept loop during init, clients that are not ranks of the
group (garbage, wrong secrets, replayed MACs, other protocol versions, impostor
ranks, pickled payloads, silent connections) are dropped and logged, and the job is
unaffected; the listener binds the chosen address only, never a wildcard. The clients
speak the wire format of harness/wire_client.py; harness/spawned.py describes the worlds.
"""
from __future__ import annotations

import datetime
import os
import pickle
import secrets
import socket
import struct
import sys
import time

import pytest

from harness import wire_client as wire
from harness.procs import Launched, free_port, tail
from harness.spawned import RINGDIST_ONLY, Spawned, proc_sockets, report
from harness.spawned_rank import STORE_TIMEOUT

pytestmark = [pytest.mark.quick, RINGDIST_ONLY]


def _store_key(store, suffix):
    keys = [k for k in store.list_keys() if k.endswith(suffix)]
    return keys[0] if len(keys) == 1 else None


def _probe(addr, payload, *, shut_wr=False, wait=3.0):
    """Connects to a rank's listener (127.0.0.1 only), reads its challenge, sends payload
    (bytes, or a function of the challenge's raw bytes); how did the rank react?"""
    host, port = addr.rsplit(":", 1)
    assert host == "127.0.0.1", addr
    t0 = time.monotonic()
    s = socket.create_connection((host, int(port)), timeout=wait)
    try:
        s.settimeout(wait)
        challenge = wire.read_challenge(s)
        if challenge is None:
            return {"outcome": "closed before its challenge",
                    "after_s": round(time.monotonic() - t0, 3)}
        magic, version = wire.CHALLENGE.unpack(challenge)[:2]
        assert (magic, version) == (wire.MAGIC, wire.VERSION), challenge
        if callable(payload):
            payload = payload(challenge)
        if payload:
            try:
                s.sendall(payload)
            except (ConnectionResetError, BrokenPipeError):
                # The rank judged the first bytes and dropped us mid-send.
                return {"outcome": "dropped", "after_s": round(time.monotonic() - t0, 3)}
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(wait)
        try:
            data = s.recv(64)
        except ConnectionResetError:
            data = b""
        except socket.timeout:
            return {"outcome": "still open", "after_s": round(time.monotonic() - t0, 3)}
        refused = len(data) >= 4 and wire.ACK.unpack(data.ljust(wire.ACK.size, b"\0"))[0] == wire.REFUSED
        return {"outcome": "dropped" if not data else "refused" if refused else f"answered {data.hex()}",
                "after_s": round(time.monotonic() - t0, 3)}
    finally:
        s.close()


class _CreatesFileWhenUnpickled:
    """Unpickling this object creates a file: proof that untrusted bytes were unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hello(key, rank, size, **header):
    """A hello for the challenge: authentic if `key` is the group's proof key
    (``header``: another magic or version)."""
    return lambda challenge: wire.hello(key, challenge, rank, size, **header)


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
    _wait_key(store, "ft/go2")  # the test probes the kept listener after init
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
    store.add("ft/destroyed", 1)
    _wait_key(store, "ft/go3")  # the test probes the listener after destroy
    return out


@pytest.fixture(scope="module")
def handshake_run(tmp_path_factory):
    """A 3-rank world whose rank 2 is held back: ranks 0 and 1 sit in the accept loop while
    foreign clients connect. Returns what was observed; tests 8 and 9 assert on it."""
    ws = 3
    tmp = tmp_path_factory.mktemp("handshake")
    obs = {"probes": {}}
    # The TCP handshake is what is probed: force TCP links even between same-host ranks.
    with Spawned(held_init, ws, tmp, env={"FT_HOLD_FROM": 2, "FT_INIT_TIMEOUT": 20,
                                            "RINGDIST_TRANSPORT": "tcp"}) as w:
        store = w.store
        keys = w.wait_until("ranks 0 and 1 publishing their addresses",
                            lambda: all(_store_key(store, f"ringdist/addr/{r}") for r in (0, 1))
                            and [_store_key(store, f"ringdist/addr/{r}") for r in (0, 1)],
                            timeout=60)
        addrs = [store.get(k).decode() for k in keys]
        secret_key = _store_key(store, "ringdist/secret")
        assert secret_key, store.list_keys()
        token = wire.proof_key(store.get(secret_key))
        obs["published"] = addrs
        port0 = int(addrs[0].rsplit(":", 1)[1])
        # Rank 1 has dialled rank 0 (so rank 0 has accepted it first, in kernel order).
        w.wait_until("rank 1 connected to rank 0",
                     lambda: any(st == "01" and remote.endswith(f":{port0}")
                                 for _, _, remote, st in proc_sockets(w.pids[1])), timeout=30)
        # 9: listening sockets of every worker process during init.
        obs["listening"] = {r: [(fam, local) for fam, local, _, st in proc_sockets(w.pids[r])
                                if st == "0A"] for r in range(ws)}

        # 8: foreign clients on rank 0's listener (it still waits for rank 2).
        p = obs["probes"]
        p["garbage 40 bytes"] = _probe(addrs[0], secrets.token_bytes(wire.HELLO.size))
        p["garbage 1 MiB"] = _probe(addrs[0], secrets.token_bytes(1 << 20))
        p["short hello then EOF"] = _probe(addrs[0], lambda c: _hello(token, 2, ws)(c)[:10],
                                           shut_wr=True)
        # A wrong proof is refused (the dialer learns why), any other bad hello dropped.
        p["wrong secret"] = _probe(addrs[0], _hello(secrets.token_bytes(32), 2, ws))
        p["replayed mac for another challenge"] = _probe(
            addrs[0], lambda c: _hello(token, 2, ws)(c[:16] + secrets.token_bytes(48)))
        p["wrong protocol version"] = _probe(addrs[0], _hello(token, 2, ws, version=99))
        p["duplicate rank 1 (valid secret)"] = _probe(addrs[0], _hello(token, 1, ws))
        p["absurd size 2^31-1"] = _probe(addrs[0], _hello(token, 2, 2**31 - 1))
        p["absurd rank 2^31-1"] = _probe(addrs[0], _hello(token, 2**31 - 1, ws))
        p["negative rank"] = _probe(addrs[0], _hello(token, -5, ws))
        p["own rank 0"] = _probe(addrs[0], _hello(token, 0, ws))
        # ... and on rank 1's listener: a lower rank never dials a higher one.
        p["rank 1: claims rank 0"] = _probe(addrs[1], _hello(token, 0, ws))
        # 12: pickled payloads that would create a file if any rank unpickled them.
        marker = tmp / "unpickled-by-a-rank"
        evil = pickle.dumps(_CreatesFileWhenUnpickled(str(marker)))
        p["pickle payload as hello"] = _probe(addrs[0], evil.ljust(wire.HELLO.size, b"\0"))
        p["rank 1: pickle payload"] = _probe(addrs[1], evil, shut_wr=True)  # shorter than a hello
        obs["marker"] = marker
        obs["ranks_alive_after_probes"] = [w.alive(r) for r in range(ws)]

        # A silent client holds rank 0's accept loop (hello timeout) while rank 2 joins.
        host, port = addrs[0].rsplit(":", 1)
        silent = socket.create_connection((host, int(port)), timeout=10)
        t_go = time.monotonic()
        store.set("ft/go", "1")
        try:
            silent.settimeout(15)
            try:
                # The challenge (a fresh nonce) comes first and reveals nothing; what
                # matters is that nothing follows and the connection is then dropped.
                silent.recv(wire.CHALLENGE.size, socket.MSG_WAITALL)
                data = silent.recv(64)
            except (ConnectionResetError, socket.timeout):
                data = b""
            obs["silent_client_dropped_after_s"] = round(time.monotonic() - t_go, 3)
            obs["silent_client_answered"] = data.hex() if data else None
        finally:
            silent.close()
        w.wait_until("all ranks initialised", lambda: store.add("ft/inited", 0) >= ws, timeout=60)
        obs["all_inited_after_go_s"] = round(time.monotonic() - t_go, 3)
        obs["listening_after_init"] = {r: [(fam, local) for fam, local, _, st in
                                           proc_sockets(w.pids[r]) if st == "0A"]
                                       for r in range(ws)}
        # After init: what does a connect to rank 0's published address do now (the listener
        # is kept for a shrink, served by nobody until one), and after destroy?
        obs["after_init_probe"] = _after_probe(addrs[0], _hello(token, 2, ws))
        store.set("ft/go2", "1")
        w.wait_until("all ranks destroyed the group",
                     lambda: store.add("ft/destroyed", 0) >= ws, timeout=60)
        obs["after_destroy_probe"] = _after_probe(addrs[0], _hello(token, 2, ws))
        store.set("ft/go3", "1")
        obs["results"] = w.results(timeout=60)
        obs["logs"] = [tail(path, 100000) for path in w.logs]
    return obs


def _after_probe(addr, payload):
    """_probe, where a refused connect and a connection nobody serves are outcomes too."""
    try:
        return _probe(addr, payload, wait=2)
    except ConnectionRefusedError:
        return {"outcome": "connection refused"}
    except (socket.timeout, TimeoutError):
        return {"outcome": "no challenge"}


def test_handshake_drops_foreign_clients(handshake_run, record_property):
    obs = handshake_run
    for name, r in obs["probes"].items():
        report(record_property, f"probe[{name}]", r)
    report(record_property, "silent_client_dropped_after_s", obs["silent_client_dropped_after_s"])
    report(record_property, "all_ranks_inited_after_release_s", obs["all_inited_after_go_s"])
    report(record_property, "init_s_per_rank", [obs["results"][r]["init_s"] for r in range(3)])
    report(record_property, "after_init_probe", obs["after_init_probe"])
    report(record_property, "after_destroy_probe", obs["after_destroy_probe"])
    refused = {"wrong secret", "replayed mac for another challenge"}
    problems = [f"{name}: {r}" for name, r in obs["probes"].items()
                if r["outcome"] != ("refused" if name in refused else "dropped")]
    # 12: object collectives ran after the probes (held_init) and nothing
    # a foreign client sent was ever unpickled.
    if obs["marker"].exists():
        problems.append("a rank unpickled bytes sent by a foreign client")
    if obs["silent_client_answered"]:
        problems.append(f"silent client got an answer: {obs['silent_client_answered']}")
    if not all(obs["ranks_alive_after_probes"]):
        problems.append(f"ranks alive after the probes: {obs['ranks_alive_after_probes']}")
    for r, res in sorted(obs["results"].items()):
        if res["errors"]:
            problems.append(f"rank {r}: collectives after the probes wrong: {res['errors']}")
    # Every dropped connection is logged by the rank that dropped it.
    n_rank0 = sum(1 for name in obs["probes"] if not name.startswith("rank 1:")) + 1  # + silent
    logged0 = obs["logs"][0].count("dropped an incoming connection")
    logged1 = obs["logs"][1].count("dropped an incoming connection")
    report(record_property, "dropped_connections_logged_rank0/rank1", (logged0, logged1))
    if logged0 < n_rank0 or logged1 < 1:
        problems.append(f"logged drops: rank 0 {logged0} (want {n_rank0}), rank 1 {logged1} (want 1)")
    # After init the listener is kept for a shrink, and nothing serves it until one (which
    # authenticates as above): a client gets no byte. Destroy closes it.
    if obs["after_init_probe"]["outcome"] != "no challenge":
        problems.append(f"connect to rank 0's address after init: {obs['after_init_probe']}")
    if obs["after_destroy_probe"]["outcome"] != "connection refused":
        problems.append(f"connect to rank 0's address after destroy: {obs['after_destroy_probe']}")
    assert not problems, "\n".join(problems)


def test_listener_binds_chosen_address_only(handshake_run, record_property):
    obs = handshake_run
    report(record_property, "published_addresses", obs["published"])
    report(record_property, "listening_during_init", obs["listening"])
    report(record_property, "listening_after_init", obs["listening_after_init"])
    for r in (0, 1):  # rank 2 was held back, so it had no listener yet
        socks = obs["listening"][r]
        assert socks, f"rank {r}: no listening socket found during init"
        for fam, local in socks:
            host = local.rsplit(":", 1)[0]
            assert host not in ("0.0.0.0", "::", "::ffff:0.0.0.0"), \
                f"rank {r} listens on a wildcard address: {fam} {local}"
            assert host == "127.0.0.1", f"rank {r} listens on {fam} {local}, not on 127.0.0.1"
        assert (("tcp", obs["published"][r]) in socks), \
            f"rank {r} published {obs['published'][r]} but listens on {socks}"
        assert obs["published"][r].startswith("127.0.0.1:"), obs["published"][r]


N_SILENT = 3


def test_handshake_survives_silent_clients(tmp_path, record_property):
    """Foreign clients that connect during init and then say nothing (a port scanner, a
    stuck prober) must not keep the real ranks from connecting within the init timeout."""
    with Spawned(held_init, 2, tmp_path, env={"FT_HOLD_FROM": 1, "FT_INIT_TIMEOUT": 10,
                                                "RINGDIST_TRANSPORT": "tcp"}) as w:
        key = w.wait_until("rank 0 publishing its address",
                           lambda: _store_key(w.store, "ringdist/addr/0"), timeout=60)
        host, port = w.store.get(key).decode().rsplit(":", 1)
        assert host == "127.0.0.1", host
        silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(N_SILENT)]
        try:
            t_go = time.monotonic()
            w.store.set("ft/go", "1")  # rank 1 joins now, queued behind the silent clients
            w.wait_until(f"both ranks initialised with {N_SILENT} silent clients on rank 0's port",
                         lambda: w.store.add("ft/inited", 0) >= 2, timeout=40)
            report(record_property, "init_done_after_release_s", round(time.monotonic() - t_go, 3))
        finally:
            for s in silent:
                s.close()
        w.store.set("ft/go2", "1")
        w.store.set("ft/go3", "1")
        res = w.results(timeout=40)
    for r, out in sorted(res.items()):
        report(record_property, f"rank{r}_init_s", round(out["init_s"], 3))
        assert not out["errors"], f"rank {r}: {out['errors']}"


_RANK0_OF_TWO = """
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, is_master=False,
                      timeout=datetime.timedelta(seconds=60))
try:
    dist.init_process_group("ringdist", rank=0, world_size=2, store=store,
                            timeout=datetime.timedelta(seconds=20))
    print("INIT OK", flush=True)
except Exception as exc:
    print("ERROR", str(exc).replace(chr(10), " "), flush=True)
"""


def test_a_rank_of_another_version_is_named():
    """A peer whose host record carries another version's tag (ringdist-peer/4, the format before
    stream windows) fails rank 0's init with an error that names that rank and both versions.
    Rank 1 is this test: it completes the real handshake (plaintext links), then sends its
    record."""
    import torch.distributed as torch_dist

    port = free_port()
    store = torch_dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, RINGDIST_TCP_ENCRYPT="0")
    with Launched([[sys.executable, "-P", "-c", _RANK0_OF_TWO, str(port)]], [env]) as rank0:
        deadline = time.monotonic() + 60
        while (_store_key(store, "ringdist/addr/0") is None
               or _store_key(store, "ringdist/secret") is None) and time.monotonic() < deadline:
            time.sleep(0.01)
        host, addr_port = store.get(_store_key(store, "ringdist/addr/0")).decode().rsplit(":", 1)
        secret = store.get(_store_key(store, "ringdist/secret"))
        link = wire.connect(host, int(addr_port), wire.proof_key(secret), rank=1, size=2)
        assert link is not None, "rank 0 refused the handshake"
        with link:
            old = "\n".join(["ringdist-peer/4", "other-host", "boot", "none", "pid:[0]", "",
                             "auto", "100", "127.0.0.1:9"]).encode()
            link.sendall(struct.pack("<I", len(old)) + old)
            ((code, out, err),) = rank0.communicate(60)
    assert code == 0 and "ERROR" in out, (out, err)
    assert "rank 1 runs another version of ringdist (its host record is ringdist-peer/4, this " \
           "rank's ringdist-peer/5)" in out, out

