"""Emulated WAN: N hosts (network namespaces) joined by a userspace delay line (wanline.c).

    python benchmarks/wan/emulator.py check --hosts 4 --delay 50ms --rate 1gbit [--loss 0.001]
        build the hosts, measure round trip time, rate and loss, print them, remove everything.
    python benchmarks/wan/emulator.py run --hosts 2 --delay 50ms --rate 1gbit -- CMD [ARGS...]
        the same, then CMD in every host at once (see "Commands in the hosts"); exits with the
        first non-zero status (the other hosts' commands are then ended). In CMD, {host}
        becomes the host's index and {addr0} host 0's address.
    python benchmarks/wan/emulator.py clean
        remove what runs that died without cleaning up left behind.

Layout. Host i is the namespace rdwan-PID-hI with one interface, `wan`, address
10.79.0.(i+1)/32 and a route for 10.79.0.0/24 through it. `wan` is a TUN device owned by the
delay line, which runs in a namespace of its own, rdwan-PID-core (no other interface). Nothing is
added to the root namespace, so no packet can leave the machine. Each host has an uplink (what
it sends) and a downlink (what it receives), each with the host's rate, drop-tail queue, half its
one-way delay and loss q = 1 - sqrt(1 - loss): between two hosts with the same settings a packet
sees the one-way delay, the rate and the loss given (RTT = 2 x delay).

Self-check, on every bring-up, before any command runs (WanCheckFailed otherwise):
  round trip  UDP echo, 20 per pair, median within 5% + 0.5 ms of the setting (plus
              serialisation; the 0.5 ms is the line's own latency);
  rate        a UDP stream sent at 1.1x the rate for ~1 s; its arrival rate (IP bytes) within 5%;
  loss        paced small datagrams, pooled over the pairs, within 5% of the setting; enough of
              them that a correct line passes 99.7% of runs (3 sigma: 3600 expected losses), and
              none lost at all when the loss is 0.
Pairs are host i -> host i+1 (mod N), so every uplink and every downlink is measured. A check
that fails is measured twice more before WanCheckFailed (the VM's host can stall the line).

Commands in the hosts: each runs in its host's namespace with its own hostname (rdwan-PID-hI) and
its own /dev/shm (so ringdist sees separate hosts), with WAN_HOST (its index), WAN_HOSTS,
WAN_ADDRS (every host's address, comma-separated, host 0 first), WAN_IFNAME=wan and
LD_PRELOAD of cc_shim.c (each new TCP socket starts with cubic; --cc none leaves the system's
default, bbr on this VM).

Everything made (namespaces, the delay line, processes in the namespaces, the build directory)
is removed on exit, on error, on Ctrl-C, on SIGTERM and at the --timeout. Needs root, iproute2
(ip), util-linux (unshare), a C compiler (cc) and /dev/net/tun.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/, for bench_common
from bench_common import end_session  # noqa: E402

PREFIX = "rdwan"
SUBNET = "10.79.0"
IFNAME = "wan"
NAME = re.compile(rf"^{PREFIX}-(\d+)-(core|h\d+)$")
TOLERANCE = 0.05
# The line's own part of a round trip (four crossings, each read and written up to TICK_NS late,
# and the VM's wake-ups): 0.25-0.5 ms measured on the idle 2-core VM (2026-12-02), up to 1.4 ms
# under load. A round trip may exceed its setting by this on top of TOLERANCE.
LINE_RTT_S = 0.0005
# A check that fails is measured again this many times: on a VM the line can lose its CPU to the
# host for a moment (arrival rate 88-92% in one check in four on 2026-12-02, twice in a row once).
CHECK_RETRIES = 2
ECHO_PORT, RATE_PORT, LOSS_PORT = 40007, 40008, 40009
PINGS = 20
LOSS_SIGMAS = 3
LOSS_PROBE_BYTES = 64       # IP bytes of one loss-probe datagram
LOSS_PROBE_PPS = 150_000    # all pairs together: what the line forwards on a busy 2-core VM
RATE_OVERDRIVE = 1.1
RATE_PROBE_BYTES = 1500
# The delay line and the probes run at this real-time (SCHED_FIFO) priority: they emulate
# network hardware, which does not wait behind the machine's other work (a compiler on a shared
# 2-core VM delays a normal process by milliseconds; `nice -n -20` did not help, the other work
# sits in other cgroups). The line sleeps between due packets. The kernel stops real-time tasks
# for the rest of a second once they have used 95% of it on a CPU (a 50 ms stall seen when the
# line needed a whole CPU): keep what runs through the line within about 1 Gbit/s each way.
REALTIME = ["chrt", "--fifo", "50"]
# While packets flow, the line wakes at most once per TICK_NS and takes every packet then: each
# wake-up costs a VM several microseconds, a quarter of the line's CPU at 1 Gbit/s without it.
# A packet is read, and written, up to TICK_NS later than it could be (round trips ~0.1 ms longer).
TICK_NS = 50_000


class WanCheckFailed(RuntimeError):
    """The emulated links do not match their settings: nothing measured on them is reported."""


def parse_rate(text):
    """'1gbit', '100mbit', '500kbit' or bits per second -> bits per second."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(bit|bps)?", str(text).strip().lower())
    if not m:
        raise ValueError(f"bad rate {text!r} (e.g. 1gbit, 100mbit)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def parse_time(text):
    """'50ms', '0.05s', '200us' or seconds -> seconds."""
    m = re.fullmatch(r"([0-9.]+)\s*(s|ms|us)?", str(text).strip().lower())
    if not m:
        raise ValueError(f"bad time {text!r} (e.g. 50ms)")
    return float(m.group(1)) * {None: 1, "s": 1, "ms": 1e-3, "us": 1e-6}[m.group(2)]


def parse_size(text):
    """'12.5MB', '64KiB', '1500' -> bytes."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(i?)b?", str(text).strip().lower())
    if not m:
        raise ValueError(f"bad size {text!r} (e.g. 4MiB)")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " kmg".index(m.group(2) or " "))


class HostLink:
    """One host's access link: the one-way delay it adds between it and a host with the same
    settings, its rate and queue (each direction) and the loss it adds on such a path."""

    def __init__(self, delay_s, rate_bps, queue_bytes=None, loss=0.0):
        if not (0 <= loss <= 1 and rate_bps > 0 and delay_s >= 0):
            raise ValueError("need 0 <= loss <= 1 (1: the host is cut off), rate > 0, delay >= 0")
        self.delay_s, self.rate_bps, self.loss = delay_s, rate_bps, loss
        # Default queue: one bandwidth-delay product of the round trip (the usual rule for a
        # bottleneck router), at least 64 KiB.
        self.queue_bytes = queue_bytes or max(65536, int(rate_bps / 8 * 2 * delay_s))

    def direction_loss(self):
        return 1 - math.sqrt(1 - self.loss)

    def line_spec(self, name):
        """The --host argument of wanline (and a line of its control file, with the host's
        index for name): name, then uplink and downlink (rate, queue, delay, loss), each with
        half the delay and the loss q with (1 - q)^2 = 1 - loss."""
        half = [f"{self.rate_bps:.0f}", str(self.queue_bytes), str(int(self.delay_s / 2 * 1e9)),
                repr(self.direction_loss())]
        return ",".join([name] + half + half)

    def describe(self):
        return {"delay_ms": self.delay_s * 1e3, "rate_bps": self.rate_bps,
                "queue_bytes": self.queue_bytes, "loss": self.loss}


def path(a: HostLink, b: HostLink):
    """What a packet from a host with link a to one with link b sees: one-way delay (s), rate
    (bits/s) and loss."""
    q = 1 - (1 - a.direction_loss()) * (1 - b.direction_loss())
    return (a.delay_s + b.delay_s) / 2, min(a.rate_bps, b.rate_bps), q


def log(msg):
    print(f"[wan] {msg}", file=sys.stderr, flush=True)


def sh(*argv, timeout=30, check=True):
    """Run a command (no shell) and return its stdout; raise with its stderr if it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def our_namespaces():
    """Every namespace named like ours, as (name, pid of the run that made it)."""
    out = sh("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [(n, int(NAME.match(n).group(1))) for n in names if NAME.match(n)]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def end_processes_in(ns, grace=2.0):
    """SIGTERM, then SIGKILL, every process inside one of our namespaces (only our runs start
    processes there)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
            time.sleep(0.05)
        if not pids:
            return


def delete_namespace(ns):
    if not NAME.match(ns):  # never touch anything that is not ours
        raise ValueError(f"refusing to delete namespace {ns}")
    end_processes_in(ns)
    sh("ip", "netns", "del", ns, check=False)


def clean_stale():
    """Remove the namespaces of runs whose process is gone; returns their names."""
    stale = [n for n, pid in our_namespaces() if not alive(pid)]
    for n in stale:
        delete_namespace(n)
    return stale


def compile_tools(into):
    """cc -O2 the delay line, the probes and the congestion-control shim into `into`."""
    for src, out, extra in (("wanline.c", "wanline", []), ("wanprobe.c", "wanprobe", []),
                            ("cc_shim.c", "libcc_shim.so", ["-shared", "-fPIC", "-ldl"])):
        sh("cc", "-O2", "-Wall", "-o", os.path.join(into, out), os.path.join(HERE, src), *extra,
           timeout=120)


class Wan:
    """N emulated hosts joined by the delay line, checked on entry, removed on exit.

        with Wan(hosts=4, links=HostLink(0.05, 1e9)) as wan:   # 50 ms one way, 1 Gbit/s
            print(wan.check)                                     # what the self-check measured
            wan.run(["python", "worker.py"])                     # in every host, at once

    `links` is one HostLink for every host or a list with one per host. `timeout` bounds each
    wait (bring-up, each check, each run)."""

    def __init__(self, hosts, links, timeout=600, seed=None, cc="cubic", check=True):
        if not 2 <= hosts <= 64:
            raise ValueError("hosts must be 2..64")
        self.n = hosts
        self.links = links if isinstance(links, list) else [links] * hosts
        if len(self.links) != hosts:
            raise ValueError("one HostLink per host")
        self.timeout, self.cc, self.do_check = timeout, cc, check
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self.run_id = f"{PREFIX}-{os.getpid()}"
        self.core = f"{self.run_id}-core"
        self.names = [f"{self.run_id}-h{i}" for i in range(hosts)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self.made, self.children, self.line, self.workdir = [], [], None, None
        self.check = None

    # -- bring-up and teardown --------------------------------------------------------------
    def __enter__(self):
        if os.geteuid() != 0:
            raise PermissionError("the WAN emulator needs root (network namespaces, TUN)")
        for tool in ("ip", "unshare", "chrt", "cc"):
            if not shutil.which(tool):
                raise RuntimeError(f"{tool} not found (apt-get install iproute2 util-linux gcc)")
        try:
            self._bring_up()
            if self.do_check:
                self.check = self.checked()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _bring_up(self):
        stale = clean_stale()
        if stale:
            log(f"removed leftovers of dead runs: {' '.join(stale)}")
        taken = {n for n, _ in our_namespaces()} & {self.core, *self.names}
        if taken:
            raise RuntimeError(f"namespaces {sorted(taken)} exist already (another run with this pid?)")
        self.workdir = tempfile.mkdtemp(prefix=f"{self.run_id}-")
        compile_tools(self.workdir)
        for ns in [self.core] + self.names:
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
               "net.ipv6.conf.default.disable_ipv6=1")
        argv = ["ip", "netns", "exec", self.core, *REALTIME, self.tool("wanline"), "--subnet", SUBNET,
                "--seed", str(self.seed), "--stats", os.path.join(self.workdir, "line.json"),
                "--tick-ns", str(TICK_NS), "--control", os.path.join(self.workdir, "changes")]
        for i, link in enumerate(self.links):
            argv += ["--host", link.line_spec(f"{IFNAME}{i}")]
        self.line = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        ready = self.line.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the delay line did not start (rc {self.line.poll()})")
        for i, ns in enumerate(self.names):
            tun = f"{IFNAME}{i}"
            sh("ip", "-n", self.core, "link", "set", tun, "netns", ns)
            sh("ip", "-n", ns, "link", "set", tun, "name", IFNAME)
            # A long TUN queue: packets wait there (not dropped) while the line is descheduled.
            sh("ip", "-n", ns, "link", "set", IFNAME, "mtu", "1500", "txqueuelen", "10000", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/32", "dev", IFNAME)
            sh("ip", "-n", ns, "route", "add", f"{SUBNET}.0/24", "dev", IFNAME,
               "src", self.addrs[i])
        log(f"{self.n} hosts {self.addrs[0]}..{self.addrs[-1]} up: " +
            "; ".join(sorted({json.dumps(link.describe()) for link in self.links})))

    def close(self):
        """End every process this run started, the delay line, our namespaces and build
        directory. Safe to call twice."""
        for p in self.children:
            kill_group(p)
        self.children = []
        if self.line is not None:  # before its devices go with the namespaces
            kill_group(self.line)
            self.line = None
        for ns in reversed(self.made):
            delete_namespace(ns)
        self.made = []
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def tool(self, name):
        return os.path.join(self.workdir, name)

    # -- commands in the hosts --------------------------------------------------------------
    def host_env(self, i, env=None):
        e = dict(os.environ)
        e.update({"WAN_HOST": str(i), "WAN_HOSTS": str(self.n), "WAN_ADDRS": ",".join(self.addrs),
                  "WAN_IFNAME": IFNAME, "TMPDIR": self.host_tmp(i)})
        if self.cc != "none":
            e["LD_PRELOAD"] = " ".join(filter(None, [self.tool("libcc_shim.so"),
                                                     e.get("LD_PRELOAD", "")]))
            e["WAN_TCP_CONGESTION"] = self.cc
        e.update(env or {})
        return e

    def host_tmp(self, i):
        d = os.path.join(self.workdir, f"h{i}")
        os.makedirs(d, exist_ok=True)
        return d

    def spawn(self, i, argv, env=None, **popen):
        """Start argv in host i (own hostname and /dev/shm) in a session of its own."""
        wrapped = ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "--mount",
                   "--propagation", "private", "--", "sh", "-c",
                   'hostname "$0" && mount -t tmpfs rdwan-shm /dev/shm && exec "$@"',
                   self.names[i], *argv]
        p = subprocess.Popen(wrapped, env=self.host_env(i, env), start_new_session=True, **popen)
        self.children.append(p)
        return p

    def sysctl(self, *settings):
        """Set kernel settings ("name=value") in every host's namespace, for the namespace only
        (those the kernel keeps per network namespace, e.g. net.ipv4.tcp_min_rtt_wlen)."""
        for ns in self.names:
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", *settings)

    def set_links(self, links):
        """Give the hosts new links mid-run (one HostLink for every host, or one per host):
        packets already on a link keep their times, later ones see the new rate, delay and
        loss. Returns once the delay line has applied them."""
        links = links if isinstance(links, list) else [links] * self.n
        if len(links) != self.n:
            raise ValueError("one HostLink per host")
        with open(os.path.join(self.workdir, "changes"), "w") as f:
            f.writelines(link.line_spec(str(i)) + "\n" for i, link in enumerate(links))
        before = self.line_stats()["link_changes"]
        self.line.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while self.line_stats()["link_changes"] == before:
            if time.monotonic() > deadline:
                raise RuntimeError("the delay line did not apply the new links")
            time.sleep(0.02)
        self.links = links
        log("links now: " + "; ".join(sorted({json.dumps(link.describe()) for link in links})))

    def run(self, argv_per_host, env=None, timeout=None, logs=None, during=None):
        """Run one command per host at once (argv_per_host: a list with an argv or None per
        host, or one argv for every host); returns the exit codes of those run, in host order.
        The first failure ends the others; so does the timeout (TimeoutError). logs: one path
        per host for stdout and stderr (else inherited). during: called every 50 ms while
        they run (to change the links mid-run, say)."""
        if argv_per_host and isinstance(argv_per_host[0], str):
            argv_per_host = [argv_per_host] * self.n
        files = [open(path, "w") for path in logs] if logs else [None] * self.n
        try:
            procs = [self.spawn(i, argv, env, stdout=f, stderr=subprocess.STDOUT if f else None)
                     for i, (argv, f) in enumerate(zip(argv_per_host, files)) if argv]
            deadline = time.monotonic() + (timeout or self.timeout)
            while True:
                codes = [p.poll() for p in procs]
                if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"commands in the hosts still running after {timeout or self.timeout} s")
                if during:
                    during()
                time.sleep(0.05)
            for p in procs:
                kill_group(p)
            return [p.returncode for p in procs]
        finally:
            for p in self.children:
                kill_group(p)
            self.children = []
            for f in files:
                if f:
                    f.close()

    def probe(self, i, *args, timeout=60):
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], *REALTIME, self.tool("wanprobe"),
                                 *map(str, args)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)

    def line_stats(self):
        """The delay line's counters (per host: packets, bytes, random losses and queue drops
        per link; lateness histogram of writes)."""
        path = os.path.join(self.workdir, "line.json")
        before = os.path.getmtime(path) if os.path.exists(path) else None
        self.line.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if os.path.exists(path) and os.path.getmtime(path) != before:
                with open(path) as f:
                    return json.load(f)
            time.sleep(0.02)
        raise RuntimeError("the delay line did not write its counters")

    # -- self-check -------------------------------------------------------------------------
    def pairs(self):
        return [(0, 1), (1, 0)] if self.n == 2 else [(i, (i + 1) % self.n) for i in range(self.n)]

    def checked(self):
        """self_check(), measured again up to CHECK_RETRIES times while it fails."""
        for retry in range(CHECK_RETRIES + 1):
            try:
                return self.self_check()
            except WanCheckFailed as exc:
                if retry == CHECK_RETRIES:
                    raise
                log(f"{exc}; measuring again")

    def self_check(self):
        """Measure round trip time, rate and loss on every uplink and downlink; raise
        WanCheckFailed unless each is within 5% of its setting (round trips: and LINE_RTT_S).
        Returns the measurements."""
        started = time.monotonic()
        result = {"tolerance": TOLERANCE, "rtt": self.check_rtt(), "rate": self.check_rate(),
                  "loss": self.check_loss(), "loadavg_1min": os.getloadavg()[0],
                  "line": self.line_stats()}
        result["seconds"] = time.monotonic() - started
        failures = [f"{kind} {row['pair']}: measured {row['measured']:.6g}, expected "
                    f"{row['expected']:.6g}" + (f" ({row['why']})" if row.get("why") else "")
                    for kind in ("rtt", "rate", "loss") for row in result[kind] if not row["ok"]]
        result["ok"] = not failures
        for kind, unit, scale in (("rtt", "ms", 1e3), ("rate", "Mbit/s", 1e-6), ("loss", "%", 100)):
            log(f"check {kind}: " + ", ".join(
                f"{row['pair']} {row['measured'] * scale:.4g}/{row['expected'] * scale:.4g} {unit}"
                for row in result[kind]))
        if failures:
            raise WanCheckFailed("the emulated links do not match their settings (load average "
                                 f"{result['loadavg_1min']:.1f}): " + "; ".join(failures))
        log(f"self-check passed in {result['seconds']:.1f} s (load average "
            f"{result['loadavg_1min']:.1f})")
        return result

    def _row(self, pair, measured, expected, slack=0.0, **extra):
        ok = abs(measured - expected) <= TOLERANCE * expected + slack if expected else measured == 0
        if extra.get("why"):
            ok = False
        return {"pair": f"{pair[0]}->{pair[1]}", "measured": measured, "expected": expected,
                "ok": ok, **extra}

    def _collect(self, proc, timeout):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise WanCheckFailed(f"a probe did not finish within {timeout:.0f} s")
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise WanCheckFailed(f"a probe failed (rc {proc.returncode}): {out[-500:]}")
        return json.loads(lines[-1])

    def check_rtt(self):
        pairs = self.pairs()
        longest = max(path(self.links[a], self.links[b])[0] for a, b in pairs) * 2
        interval = 0.02
        run_s = PINGS * interval + 3 * longest + 2
        echoes = [self.probe(i, "echo", ECHO_PORT, math.ceil(run_s + 2)) for i in range(self.n)]
        time.sleep(0.3)
        pings = [self.probe(a, "ping", self.addrs[b], ECHO_PORT, PINGS, int(interval * 1e6),
                            int((2 * longest + 1) * 1e3)) for a, b in pairs]
        rows = []
        for (a, b), p in zip(pairs, pings):
            got = self._collect(p, run_s + 10)
            one_way, rate, _ = path(self.links[a], self.links[b])
            # Each of the four link crossings serialises the 64-byte datagram.
            expected = 2 * one_way + 4 * 64 * 8 / rate
            why = None if got["received"] >= PINGS // 2 else f"{got['received']}/{PINGS} replies"
            measured = statistics.median(got["rtt_us"]) / 1e6 if got["rtt_us"] else float("nan")
            rows.append(self._row((a, b), measured, expected, slack=LINE_RTT_S,
                                  samples=len(got["rtt_us"]), why=why))
        for e in echoes:
            kill_group(e)
        return rows

    def check_rate(self):
        rows = []
        for a, b in self.pairs():
            one_way, rate, _ = path(self.links[a], self.links[b])
            count = int(rate * RATE_OVERDRIVE / (RATE_PROBE_BYTES * 8))  # ~1 s
            recv = self.probe(b, "recv", RATE_PORT, int((2 * one_way + 3) * 1e3))
            recv.stdout.readline()  # {"listening": true}
            send = self.probe(a, "send", self.addrs[b], RATE_PORT, f"{rate * RATE_OVERDRIVE:.0f}",
                              RATE_PROBE_BYTES, count)
            sent = self._collect(send, 30)
            got = self._collect(recv, 30)
            why = None
            if got["socket_drops"]:
                why = f"receiver's socket dropped {got['socket_drops']} (CPU)"
            elif sent["offered_bps"] < rate:
                why = f"the sender offered only {sent['offered_bps'] / 1e6:.0f} Mbit/s (CPU)"
            rows.append(self._row((a, b), got["rate_bps"], rate, received=got["received"],
                                  offered_bps=sent["offered_bps"], why=why))
        return rows

    def check_loss(self):
        pairs = self.pairs()
        expect = [path(self.links[a], self.links[b])[2] for a, b in pairs]
        mean = sum(expect) / len(expect)
        # 3 sigma of a binomial count within 5%: n p = (3 / 0.05)^2 (1 - p).
        total = math.ceil((LOSS_SIGMAS / TOLERANCE) ** 2 * (1 - mean) / mean) if mean else 20000
        per_pair = math.ceil(total / len(pairs))
        pps = min(LOSS_PROBE_PPS / len(pairs),
                  0.5 * min(path(self.links[a], self.links[b])[1] for a, b in pairs)
                  / (LOSS_PROBE_BYTES * 8))
        seconds = per_pair / pps
        recvs = [self.probe(b, "recv", LOSS_PORT, 5000) for _, b in pairs]
        for r in recvs:
            r.stdout.readline()
        sends = [self.probe(a, "send", self.addrs[b], LOSS_PORT,
                            f"{pps * LOSS_PROBE_BYTES * 8:.0f}", LOSS_PROBE_BYTES, per_pair)
                 for a, b in pairs]
        sent = [self._collect(s, seconds * 3 + 30) for s in sends]
        got = [self._collect(r, 30) for r in recvs]
        stats = self.line_stats()
        queue_drops = sum(h["up"]["queue_drops"] + h["down"]["queue_drops"] for h in stats["hosts"])
        n_sent = sum(s["sent"] for s in sent)
        n_lost = sum(g["lost"] for g in got)
        expected = sum(s["sent"] * p for s, p in zip(sent, expect)) / n_sent
        drops = sum(g["socket_drops"] for g in got)
        why = f"receivers' sockets dropped {drops} (CPU)" if drops else None
        return [self._row(("all", "next"), n_lost / n_sent, expected, datagrams=n_sent,
                          lost=n_lost, line_queue_drops_so_far=queue_drops,
                          per_pair=[g["lost"] / max(1, g["sent"]) for g in got], why=why)]


def kill_group(p, grace=3.0):
    """End a process started in a session of its own, and everything in that session."""
    end_session(p, grace)
    if p.stdout:
        p.stdout.close()


def links_from_args(args):
    return HostLink(parse_time(args.delay), parse_rate(args.rate),
                    parse_size(args.queue) if args.queue else None, args.loss)


def add_link_args(p):
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--delay", default="50ms", help="one-way delay between two hosts (RTT = 2x)")
    p.add_argument("--rate", default="1gbit", help="each host's uplink and downlink rate")
    p.add_argument("--queue", help="drop-tail queue per link (default: rate x RTT, >= 64 KiB)")
    p.add_argument("--loss", type=float, default=0.0, help="random loss per packet, host to host")
    p.add_argument("--cc", default="cubic", help="congestion control every TCP socket starts "
                   "with (LD_PRELOAD shim); 'none' keeps the system's default")
    p.add_argument("--timeout", type=float, default=900, help="bound on the whole run (s)")
    p.add_argument("--seed", type=int, help="the delay line's random seed (default: random)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check", help="bring up, self-check, print, remove")
    add_link_args(check)
    check.add_argument("--json", help="write the self-check's measurements here")
    run = sub.add_parser("run", help="bring up, self-check, run a command in every host")
    add_link_args(run)
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("clean", help="remove leftovers of runs that died")
    args = ap.parse_args(argv)

    if args.cmd == "clean":
        stale = clean_stale()
        log(f"removed {' '.join(stale) or 'nothing'}")
        return 0

    def stop(sig, frame):
        raise SystemExit(128 + sig)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, lambda s, f: (_ for _ in ()).throw(
        TimeoutError(f"the run exceeded --timeout {args.timeout:.0f} s")))
    signal.alarm(max(1, int(args.timeout)))
    with Wan(args.hosts, links_from_args(args), timeout=args.timeout, seed=args.seed,
             cc=args.cc) as wan:
        if args.cmd == "check":
            print(json.dumps(wan.check, indent=1))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(wan.check, f, indent=1)
            return 0
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            ap.error("run needs -- CMD [ARGS...]")
        # Per host: {host} becomes its index, {addr0} host 0's address.
        codes = wan.run([[a.replace("{host}", str(i)).replace("{addr0}", wan.addrs[0])
                          for a in command] for i in range(wan.n)])
        # The command's own failure, not the signal with which the others were then ended.
        bad = [c for c in codes if c > 0] or [128 - c for c in codes if c < 0]
        return bad[0] if bad else 0


if __name__ == "__main__":
    sys.exit(main())
