"""The WAN emulator (benchmarks/wan/emulator.py): four hosts behind its userspace delay line
measure the round trip time, rate and loss they were given, a ringdist ring allreduce across two
of them measures the link's round trip (which sizes its data in flight) and gives the float64
reference result, nothing the emulator made outlives it, also when the command it drives
fails, and a host cut off mid-run (its links changed to drop everything) ends every rank's
allreduce with an error that names the silent peers, within the group's timeout."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "wan"))
import emulator  # noqa: E402
from harness.procs import cmdline  # noqa: E402

RANK = os.path.join(REPO, "tests", "scenarios", "wan_emulator.py")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/net/tun")
    or not all(shutil.which(t) for t in ("ip", "unshare", "chrt", "cc")),
    reason="needs root, /dev/net/tun, ip, unshare, chrt and cc (network namespaces, TUN)")


def test_a_check_outside_the_tolerance_fails():
    wan = emulator.Wan(2, emulator.HostLink(0.02, 100e6))
    assert wan._row((0, 1), 0.0419, 0.040)["ok"]
    assert not wan._row((0, 1), 0.0421, 0.040)["ok"]
    assert not wan._row((0, 1), 0.0101, 0.0)["ok"]     # no loss set: any loss fails
    assert not wan._row((0, 1), 0.040, 0.040, why="receiver's socket dropped 3 (CPU)")["ok"]


def test_paths_compose_host_links():
    a, b = emulator.HostLink(0.02, 100e6, loss=0.01), emulator.HostLink(0.06, 1e9, loss=0.01)
    one_way, rate, loss = emulator.path(a, a)
    assert (one_way, rate) == (0.02, 100e6) and loss == pytest.approx(0.01, rel=1e-12)
    one_way, rate, _ = emulator.path(a, b)
    assert (one_way, rate) == (0.04, 100e6)


def leftovers(run_id):
    """Namespaces and processes (by their command line) of one emulator run."""
    names = [n for n, _ in emulator.our_namespaces() if n.startswith(run_id + "-")]
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = cmdline(pid)
        if f"/{run_id}-" in cmd and int(pid) != os.getpid():
            procs.append(cmd)
    return names, procs


def root_links():
    return sorted(line.split(":")[1].strip() for line in
                  subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines())


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_four_hosts_measure_their_settings_and_carry_an_allreduce():
    links_before = root_links()
    with emulator.Wan(4, emulator.HostLink(0.020, 100e6, loss=0.01), timeout=120) as wan:
        check, run_id = wan.check, wan.run_id
        assert len(check["rtt"]) == len(check["rate"]) == 4  # every uplink and downlink
        for row in check["rtt"]:
            assert row["measured"] == pytest.approx(0.040, rel=0.05), row
        for row in check["rate"]:
            assert row["measured"] == pytest.approx(100e6, rel=0.05), row
        assert check["loss"][0]["measured"] == pytest.approx(0.01, rel=0.05), check["loss"]
        assert os.listdir(os.path.join(wan.workdir))  # the tools it built

        before = wan.line_stats()["hosts"][0]["up"]["bytes"]
        port = 29600 + os.getpid() % 1000
        rank = [sys.executable, RANK, str(port), "0.040"]
        assert wan.run([rank, rank, None, None], timeout=90) == [0, 0]
        crossed = wan.line_stats()["hosts"][0]["up"]["bytes"] - before
        assert crossed >= 8 * (65536 + 3) // 2  # host 0 sent at least its half through the line
    assert leftovers(run_id) == ([], [])
    assert not [c for c in map(cmdline, os.listdir("/proc")) if RANK in c]
    assert root_links() == links_before


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_nothing_is_left_when_the_command_fails():
    fail_on_host1 = 'if [ "$WAN_HOST" = 1 ]; then exit 3; fi; exec sleep 287'
    p = subprocess.Popen([sys.executable, os.path.join(REPO, "benchmarks", "wan", "emulator.py"),
                          "run", "--hosts", "2", "--delay", "10ms", "--rate", "100mbit",
                          "--timeout", "60", "--", "sh", "-c", fail_on_host1],
                         stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=90)
    finally:
        p.kill()
    assert p.returncode == 3, err[-3000:]
    assert "self-check passed" in err
    assert leftovers(f"{emulator.PREFIX}-{p.pid}") == ([], [])
    assert not [c for c in map(cmdline, os.listdir("/proc")) if c.startswith("sleep 287")]


def _cut_off_host_2(tmp_path, scenario):
    """Runs tests/scenarios/<scenario> on three hosts at 100 Mbit/s and a 10 ms round trip,
    cutting the third host off (its links drop every packet, no reset reaches anyone) once the
    ranks wait at the scenario's barrier; each rank's JSON line, after checking all exited 0."""
    link = emulator.HostLink(0.005, 100e6)
    with emulator.Wan(3, link, timeout=120) as wan:
        port = 29600 + os.getpid() % 1000
        argv = [sys.executable, os.path.join(REPO, "tests", "scenarios", scenario), str(port),
                str(tmp_path)]
        logs = [str(tmp_path / f"rank{i}.log") for i in range(3)]

        def cut_off():
            if (tmp_path / "ready").exists() and not (tmp_path / "go").exists():
                wan.set_links([link, link, emulator.HostLink(0.005, 100e6, loss=1.0)])
                (tmp_path / "go").touch()

        codes = wan.run(argv, logs=logs, timeout=60, during=cut_off)
        out = [open(p).read() for p in logs]
    assert codes == [0, 0, 0], out
    return [json.loads(o.strip().splitlines()[-1]) for o in out]


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_a_host_cut_off_before_destroy_leaves_every_rank_within_the_teardown_wait(tmp_path):
    """Three hosts at 100 Mbit/s and a 10 ms round trip. After correct allreduces the third
    host's links start dropping every packet, and every rank destroys the group with no
    operation between. The teardown waits at most 10 s for the other ranks (kTeardownWait), and
    the cut-off host's calls to the store it cannot reach are bounded by that wait too: every
    rank's destroy_process_group returns within it (plus one store bound, 2 s), none raises."""
    got = _cut_off_host_2(tmp_path, "wan_close_cut_off.py")
    assert all(g["wrong"] == 0 and g["error"] is None for g in got), got
    assert all(g["seconds"] <= 10 + 2 + 1.5 for g in got), got


@pytest.mark.netns
@pytest.mark.slow
@needs_root
def test_a_host_cut_off_mid_run_fails_every_rank_naming_the_silent_peers(tmp_path):
    """Three hosts at 100 Mbit/s and a 10 ms round trip. After correct allreduces the third
    host's links start dropping every packet (no reset reaches anyone). The allreduce then fails
    on every rank with the group's timeout (8 s): the two connected ranks name rank 2, the cut-off
    one names ranks 0 and 1, and it does not wait past 2 s more for the store it cannot reach
    either (kStoreOnErrorMs); before that bound it waited for as long as TCP kept trying."""
    got = _cut_off_host_2(tmp_path, "wan_silent_peer.py")
    assert all(g["wrong"] == 0 for g in got), got
    for g, silent in zip(got, ["2", "2", "0, 1"]):
        assert g["error"] and "Timed out after 8000 ms" in g["error"], got
        assert f"rank {g['rank']}: Timed out" in g["error"], got
        assert f"waiting for rank(s) {silent}" in g["error"], got
        assert 7.5 <= g["seconds"] <= 8 + 2 + 1.5, got
