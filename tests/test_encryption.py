"""Encrypted and authenticated TCP links (issue 44, item 4), on real traffic.

One spawned world of two ranks on TCP (RINGDIST_TRANSPORT=tcp) runs every case on a fresh
``dist.new_group``: the test puts a proxy (harness/record_proxy.py) between rank 1 and rank
0's listener by rewriting rank 0's published address before rank 1 dials it. The proxy relays
the sealed records untouched, or flips a bit, flips a length, replays or drops one record;
the ranks run allreduces and a broadcast whose results have a closed form. Asserted: every
tampering fails the operation on both ranks, the receiver naming the peer and the failed
authentication (the other rank quoting that as the group's first error), and no rank ever
returns a wrong result; a rank given another secret is
refused with an error that says so; a known pattern sent by a rank never appears in the
proxy's bytes (and does appear with RINGDIST_TCP_ENCRYPT=0, which proves the proxy sees it).
"""
from __future__ import annotations

import os
import time

import pytest

from harness.record_proxy import ACCEPTOR, DIALER, RecordProxy
from harness.spawned import RINGDIST_ONLY, Spawned, report, sec
from harness.spawned_rank import init_group

pytestmark = [pytest.mark.quick, RINGDIST_ONLY]

CANARY = b"ringdist-plaintext-canary:"
SECRET_A = "a" * 16 + "-first-secret"
SECRET_B = "b" * 16 + "-other-secret"
AUTH_FAILED = "failed authentication: the link is corrupted or tampered with"

# name -> (proxy action, direction, env of rank 0, env of rank 1, group timeout s)
CASES = {
    "clean": (None, DIALER, {}, {}, 20),
    "same secret": (None, DIALER, {"RINGDIST_SECRET": SECRET_A}, {"RINGDIST_SECRET": SECRET_A}, 20),
    "flip to rank 0": ("flip", DIALER, {}, {}, 20),
    "flip to rank 1": ("flip", ACCEPTOR, {}, {}, 20),
    "flip length": ("flip-length", DIALER, {}, {}, 20),
    "replay": ("replay", DIALER, {}, {}, 20),
    "drop": ("drop", ACCEPTOR, {}, {}, 20),
    "wrong secret": (None, DIALER, {"RINGDIST_SECRET": SECRET_A}, {"RINGDIST_SECRET": SECRET_B}, 4),
    "encryption off on one rank": (None, DIALER, {}, {"RINGDIST_TCP_ENCRYPT": "0"}, 4),
    "encryption off": (None, DIALER, {"RINGDIST_TCP_ENCRYPT": "0"},
                       {"RINGDIST_TCP_ENCRYPT": "0"}, 20),
}
SETTINGS = ("RINGDIST_SECRET", "RINGDIST_TCP_ENCRYPT")


def _ops(rank, ws, group, torch, dist):
    """(name, run) pairs: each run returns whether its result is right (closed forms)."""
    def allreduce(n):
        def run():
            x = torch.arange(n, dtype=torch.float32) + 1000 * rank
            dist.all_reduce(x, group=group)
            return torch.equal(x, torch.arange(n, dtype=torch.float32) * ws + 1000 * sum(range(ws)))
        return run

    def canary():
        pattern = torch.frombuffer(bytearray(CANARY * 2048), dtype=torch.uint8)
        t = pattern.clone() if rank == 1 else torch.zeros_like(pattern)
        dist.broadcast(t, src=1, group=group)
        return torch.equal(t, pattern)

    return [("allreduce 8 B", allreduce(2)), ("allreduce 1 MiB + 12 B", allreduce((1 << 18) + 3)),
            ("broadcast canary", canary), ("allreduce 3 elements", allreduce(3))]


def tls_ranks(rank, ws, store, dist, torch):
    """The default group (direct, no proxy) checks sealed collectives of several sizes; then
    each case runs on a new group once the test says go (rank 0 first: it publishes the
    address the test rewrites; then rank 1, which dials the proxy)."""
    init_group(rank, ws, store, dist)
    direct = [(name, run()) for name, run in _ops(rank, ws, None, torch, dist)]
    store.add("enc/inited", 1)
    cases = []
    for k, (name, (_, _, env0, env1, timeout)) in enumerate(CASES.items()):
        store.wait([f"enc/{k}/go{rank}"], sec(60))
        env = env0 if rank == 0 else env1
        for key in SETTINGS:
            os.environ.pop(key, None)
        os.environ.update(env)
        out = {"case": name, "ops": [], "error": None}
        t0 = time.monotonic()
        try:
            group = dist.new_group([0, 1], timeout=sec(timeout))
            for op, run in _ops(rank, ws, group, torch, dist):
                out["ops"].append((op, run()))
        except Exception as e:  # noqa: BLE001 - what each rank raised is the result
            out["error"] = str(e)
        out["s"] = round(time.monotonic() - t0, 3)
        cases.append(out)
        store.add(f"enc/{k}/done", 1)
    return {"direct": direct, "cases": cases}


def _addr_keys(store):
    return {k for k in store.list_keys() if k.endswith("ringdist/addr/0")}


@pytest.fixture(scope="module")
def tampered(tmp_path_factory):
    """Runs the world; returns the ranks' results, the proxies' observations and logs."""
    tmp = tmp_path_factory.mktemp("encryption")
    seen = {}
    with Spawned(tls_ranks, 2, tmp, env={"RINGDIST_TRANSPORT": "tcp"}) as w:
        store = w.store
        w.wait_until("the default group", lambda: store.add("enc/inited", 0) >= 2, timeout=60)
        known = _addr_keys(store)
        for k, (name, (action, direction, env0, env1, _)) in enumerate(CASES.items()):
            store.set(f"enc/{k}/go0", "1")
            key = w.wait_until(f"rank 0's address for case {name!r}",
                               lambda: next(iter(_addr_keys(store) - known), None), timeout=30)
            known.add(key)
            sealed = env0.get("RINGDIST_TCP_ENCRYPT") != "0" and env1.get("RINGDIST_TCP_ENCRYPT") != "0"
            proxy = RecordProxy(store.get(key).decode(), action, direction, sealed=sealed)
            store.set(key, proxy.address)
            store.set(f"enc/{k}/go1", "1")
            try:
                last = k == len(CASES) - 1  # then the ranks may exit as soon as they are done
                w.wait_until(f"case {name!r}", lambda: store.add(f"enc/{k}/done", 0) >= 2,
                             timeout=60, allow_dead=(0, 1) if last else ())
            finally:
                proxy.stop()
            seen[name] = {"tampered": proxy.tampered, "records": dict(proxy.records),
                          "canary_on_wire": any(CANARY in bytes(b) for b in proxy.captured.values()),
                          "bytes": {d: len(b) for d, b in proxy.captured.items()}}
        results = w.results(timeout=60)
        logs = [open(path, errors="replace").read() for path in w.logs]
    return results, seen, logs


def _case(results, name):
    return [next(c for c in results[r]["cases"] if c["case"] == name) for r in (0, 1)]


def test_sealed_collectives_are_correct(tampered, record_property):
    results, seen, logs = tampered
    for r in (0, 1):
        assert all(ok for _, ok in results[r]["direct"]), results[r]["direct"]
    for name in ("clean", "same secret"):
        for r, case in enumerate(_case(results, name)):
            report(record_property, f"{name}: rank {r}", case)
            assert case["error"] is None and all(ok for _, ok in case["ops"]), case
        assert seen[name]["records"][DIALER] > 10 and seen[name]["records"][ACCEPTOR] > 10, seen[name]


def test_plaintext_never_on_the_wire(tampered, record_property):
    results, seen, _ = tampered
    report(record_property, "proxied bytes", {n: s["bytes"] for n, s in seen.items()})
    for name in ("clean", "same secret"):
        assert not seen[name]["canary_on_wire"], f"{name}: the broadcast's plaintext crossed the wire"
    # The control: with encryption off the same broadcast is visible, and correct.
    assert seen["encryption off"]["canary_on_wire"], seen["encryption off"]
    for case in _case(results, "encryption off"):
        assert case["error"] is None and all(ok for _, ok in case["ops"]), case


@pytest.mark.parametrize("name,victim", [("flip to rank 0", 0), ("flip to rank 1", 1),
                                         ("flip length", 0), ("replay", 0), ("drop", 1)])
def test_tampering_fails_every_rank_naming_the_peer(tampered, record_property, name, victim):
    results, seen, _ = tampered
    assert seen[name]["tampered"], f"the proxy never reached the record to tamper with: {seen[name]}"
    cases = _case(results, name)
    for r, case in enumerate(cases):
        report(record_property, f"rank {r}", case)
        assert all(ok for _, ok in case["ops"]), f"rank {r} returned a wrong result: {case}"
        assert case["error"] is not None, f"rank {r} did not fail: {case}"
        assert case["s"] < 15, f"rank {r} took {case['s']} s to fail"
    # The receiver names the sender; the other rank's error quotes it as the group's first.
    other = 1 - victim
    for r in (victim, other):
        assert f"record from rank {other} (127.0.0.1:" in cases[r]["error"], cases[r]
        assert AUTH_FAILED in cases[r]["error"], cases[r]
    assert f"rank {victim}" in cases[other]["error"], cases[other]


def test_wrong_secret_is_refused(tampered, record_property):
    results, _, _ = tampered
    rank0, rank1 = _case(results, "wrong secret")
    report(record_property, "rank 0", rank0)
    report(record_property, "rank 1", rank1)
    assert rank1["error"] and "refused this rank's proof" in rank1["error"], rank1
    assert "RINGDIST_SECRET" in rank1["error"], rank1
    assert rank0["error"] and "proved another secret" in rank0["error"], rank0
    assert not rank0["ops"] and not rank1["ops"]


def test_encryption_setting_must_agree(tampered, record_property):
    results, _, _ = tampered
    rank0, rank1 = _case(results, "encryption off on one rank")
    report(record_property, "rank 1", rank1)
    # Both ends of the link fail at once, naming the setting (the dialer's proven hello
    # carries its settings to the acceptor).
    for case in (rank0, rank1):
        assert case["error"] and "RINGDIST_TCP_ENCRYPT must be the same on every rank" in \
            case["error"], case
        assert case["s"] < 15, case


def test_unauthenticated_peers_said_once(tampered):
    _, _, logs = tampered
    for r, log in enumerate(logs):
        assert log.count("peers are not authenticated") == 1, f"rank {r}:\n{log[-3000:]}"
