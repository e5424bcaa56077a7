#!/usr/bin/env python3
"""DiLoCo with peers that come and go across the emulated WAN, every replica checked at every
round end.

    sudo python benchmarks/diloco_churn.py --hosts 4 --rate 100mbit --rtt 100ms --loss 0.001 \\
        --rounds 100 --losses 10 --out churn.json

One rank per emulated host (benchmarks/wan/emulator.py), each training an MLP with
``DiLoCoOptimizer`` (int4 pseudo-gradients, ``on_failure="shrink"``, ``exchange_timeout``, and a
store every process reaches, so joiners are admitted). The job's store is a process of its own in
host 0, so any rank may go. The schedule cycles through hosts 1, 2, ..., 0: a loss every --every
rounds, alternately a SIGKILL and a SIGSTOP (a peer that goes silent; it is killed once the others
have excluded it), and, once the survivors are training again, a fresh process on that host that
joins (``DiLoCoOptimizer.join``). The next loss waits until that joiner is in.

Every process appends, at every round end, the round number, its world size and a SHA-256 digest
of theta_global and the outer momentum to a file of its own. The run fails unless every round
1..R was completed, each process's rounds follow each other without a gap or a repeat (a joiner's
first is the one after the round it joined at), and at every round all replicas hold the same
digest. A recovery the schedule did not cause (a live rank dropped) ends the schedule at once,
and the report names its round.

Then host 1's link runs at a tenth of its rate for --slow-rounds rounds: a slow peer is waited
for (``--slow-peer wait``), or dropped and let back in --rejoin-after seconds later (``drop``;
its rounds from the one it was dropped in until it rejoined are not the job's and are not
checked), and the report gives the round time before, during and after, and the drop.

Reports per loss the time from the kill or stop to the survivors training again (and from the
failed exchange), and per join the admission time (from the round's end to every rank holding
the state) against 2 RTT + 1.1 x state bytes / rate + 0.5 s, with the state the joiner receives
(theta_global and the outer momentum, float32). Needs root (network namespaces).
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "wan"))

STORE_PORT = 29710


# ---------------------------------------------------------------- in the hosts

def serve_store(args):
    """The job's store: outlives every rank (host 0, a process of its own)."""
    import torch.distributed as dist
    store = dist.TCPStore(args.addr0, STORE_PORT, is_master=True, wait_for_workers=False,  # noqa: F841
                          timeout=timedelta(seconds=args.timeout))  # serves while referenced
    open(os.path.join(args.dir, "store.ready"), "w").close()
    time.sleep(args.timeout)


def digest(state) -> str:
    h = hashlib.sha256()
    for f in range(state.fragments):
        h.update(state.anchor[f].numpy().tobytes())
        h.update(state.momentum_buffers[f].numpy().tobytes())
    return h.hexdigest()[:16]


def train(args):
    """One rank (args.rank >= 0) or a joiner (args.rank < 0) on host args.host."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import torch_ringdist.hooks as hooks
    from ddp_step import make_model

    torch.set_num_threads(1)
    out = open(os.path.join(args.dir, f"{os.getpid()}.jsonl"), "a", buffering=1)

    def record(event, **fields):
        out.write(json.dumps({"event": event, "pid": os.getpid(), "host": args.host,
                              "t": time.time(), **fields}) + "\n")

    store = dist.TCPStore(args.addr0, STORE_PORT, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = make_model(args.width, args.width, args.width)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.rank < 0:
        record("join_request")
        opt = hooks.DiLoCoOptimizer.join(model, inner, store, timeout=args.timeout)
        record("joined", rounds=opt.state.rounds, world=dist.get_world_size())
    else:
        dist.init_process_group("ringdist", store=store, rank=args.rank, world_size=args.world,
                                timeout=timedelta(seconds=60))
        opt = hooks.DiLoCoOptimizer(model, inner, store=store, period=args.period,
                                    codec=args.codec, on_failure="shrink",
                                    lost_wait=args.lost_wait,
                                    exchange_timeout=args.exchange_timeout,
                                    send_ahead=args.send_ahead, slow_peer=args.slow_peer,
                                    rejoin_after=args.rejoin_after)
    teacher = torch.randn(args.width, args.width, generator=torch.Generator().manual_seed(1))
    seen = [0, 0, 0]
    try:
        while opt.state.iteration < args.rounds * args.period:
            state = opt.state  # a rank dropped as the slow peer rejoins with a new one
            g = torch.Generator().manual_seed(state.iteration * 1000 + args.host)
            x = torch.randn(args.batch, args.width, generator=g)
            opt.zero_grad()
            F.mse_loss(model(x), torch.tanh(x @ teacher)).backward()
            opt.step()
            if len(opt.rejoins) > seen[2]:  # dropped as the slow peer, then joined again
                seen = [0, 0, len(opt.rejoins)]
                state = opt.state
                record("rejoined", rounds=state.rounds, world=dist.get_world_size(),
                       **opt.rejoins[-1])
                continue
            if state.iteration % args.period == 0:  # this step ended with a round
                record("round", round=state.rounds, world=dist.get_world_size(),
                       rank=dist.get_rank(), digest=digest(state),
                       recoveries=state.recoveries[seen[0]:],
                       admissions=opt.admissions[seen[1]:])
                seen = [len(state.recoveries), len(opt.admissions), seen[2]]
    except RuntimeError as e:  # excluded after arriving late (lost_ranks): leaves
        record("left", error=str(e)[:300])
        raise
    dist.destroy_process_group()
    record("done")


# ---------------------------------------------------------------- the controller

class Run:
    """The emulated hosts, one process per host, and what they wrote."""

    def __init__(self, wan, args):
        self.wan, self.args = wan, args
        self.dir = os.path.join(wan.workdir, "churn")
        os.makedirs(self.dir)
        self.procs = {}           # host -> its current process
        self.records = []
        self._offsets = {}
        self.gone = set()         # hosts whose process was ended on purpose, not yet replaced
        self.caused = None        # recoveries the schedule has caused (None: not counted)

    def spawn(self, host, rank, role="train"):
        log = open(os.path.join(self.dir, f"h{host}-{len(self.records)}-{time.time():.0f}.log"),
                   "w")
        argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--host", str(host),
                "--rank", str(rank), "--world", str(self.wan.n), "--dir", self.dir,
                "--addr0", self.wan.addrs[0]] + self.args.pass_on
        p = self.wan.spawn(host, argv, stdout=log, stderr=subprocess.STDOUT)
        if role == "train":
            self.procs[host] = p
        return p

    def poll(self):
        """New records of every process (appended lines)."""
        for path in glob.glob(os.path.join(self.dir, "*.jsonl")):
            with open(path) as f:
                f.seek(self._offsets.get(path, 0))
                while (line := f.readline()).endswith("\n"):
                    self.records.append(json.loads(line))
                    self._offsets[path] = f.tell()
        return self.records

    def last_round(self):
        return max((r["round"] for r in self.records if r["event"] == "round"), default=0)

    def round_interval(self):
        times = sorted(round_starts(self.records).items())
        return times[-1][1] - times[-2][1] if len(times) > 1 else 1.0

    def wait_for(self, predicate, what, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            ended = bool(self.procs) and all(p.poll() is not None for p in self.procs.values())
            self.poll()  # after: an ended process's last records are read
            self.check_recoveries()
            found = predicate()
            if found:
                return found
            if self.failed():
                raise RuntimeError(f"a rank failed while waiting for {what}: {self.failed()}")
            if ended:
                raise RuntimeError(f"the training ended before {what}")
            time.sleep(0.05)
        raise TimeoutError(f"no {what} within {limit:.0f} s (last round {self.last_round()})")

    def check_recoveries(self):
        """Raises OffSchedule once the ranks recorded more recoveries than the schedule caused:
        a live rank was dropped, and waiting for the next scheduled one would wait out the
        timeout."""
        if self.caused is None:
            return
        rounds = sorted({r["round"] for r in self.records
                         if r["event"] == "round" and r["recoveries"]})
        if len(rounds) > self.caused:
            lost = next(r["recoveries"][0]["lost"] for r in self.records
                        if r["event"] == "round" and r["round"] == rounds[self.caused]
                        and r["recoveries"])
            raise OffSchedule(f"round {rounds[self.caused]}: ranks {lost} dropped with no loss "
                              f"of the schedule pending (a live rank excluded)")

    def failed(self):
        return {h: p.returncode for h, p in self.procs.items()
                if p.poll() not in (None, 0) and h not in self.gone}


class OffSchedule(RuntimeError):
    """The ranks recovered from a loss the schedule did not cause."""


def run_schedule(run, args, events):
    """Losses and joins, one host at a time; appends the events with their times."""
    hosts = run.wan.n
    run.caused = 0
    for k in range(args.losses):
        at = args.first + k * args.every
        if at >= args.rounds - 2:
            break
        run.wait_for(lambda: run.last_round() >= at, f"round {at}", args.timeout)
        time.sleep(0.5 * run.round_interval())  # mid-period
        host, how = (k + 1) % hosts, ("kill", "stop")[k % 2]
        victim = run.procs[host]
        run.gone.add(host)
        run.caused += 1
        t = time.time()
        os.killpg(victim.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        event = {"loss": k, "host": host, "how": how, "t": t, "round": run.last_round()}
        events.append(event)
        back = run.wait_for(lambda: [r for r in run.records if r["event"] == "round"
                                     and r["t"] > t and r["recoveries"]],
                            f"the survivors' recovery from loss {k}", args.timeout)[0]
        event["recovery"] = back["recoveries"][0]
        if how == "stop":  # silent to the end
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        run.gone.discard(host)
        run.spawn(host, -1)
        joined = run.wait_for(lambda: [r for r in run.records if r["event"] == "joined"
                                       and r["host"] == host and r["t"] > t],
                              f"the joiner on host {host}", args.timeout)[0]
        event["joined"] = joined
    run.caused = None  # from here on (a slow peer dropped), not counted


def round_starts(records):
    """Round number -> the earliest time any replica recorded its end."""
    ends = {}
    for r in records:
        if r["event"] == "round":
            ends[r["round"]] = min(ends.get(r["round"], r["t"]), r["t"])
    return ends


def slow_link(run, args, link):
    """Host 1's link at a tenth of its rate for --slow-rounds rounds (slow peers are waited
    for): the median round time before, during and after."""
    import emulator

    begin = run.last_round()
    if not args.slow_rounds or begin + 2 * 3 + args.slow_rounds >= args.rounds:
        return None
    run.wait_for(lambda: run.last_round() >= begin + 3, "rounds before the slow link",
                 args.timeout)
    slow_from = run.last_round()
    slow = emulator.HostLink(link.delay_s, link.rate_bps / 10, loss=link.loss)
    run.wan.set_links([slow if i == 1 else link for i in range(run.wan.n)])
    run.wait_for(lambda: run.last_round() >= slow_from + args.slow_rounds, "the slow rounds",
                 args.timeout)
    slow_to = run.last_round()
    run.wan.set_links(link)
    run.wait_for(lambda: run.last_round() >= slow_to + 3, "rounds after the slow link",
                 args.timeout)
    drops = [{"round": r["round"], "lost": rec["lost"], "seconds": rec["seconds"],
              "ratios": rec.get("ratios")} for r in run.records
             if r["event"] == "round" and r["rank"] == 0 for rec in r["recoveries"]
             if rec.get("slow")]
    rejoined = None
    if drops:  # the dropped rank asks again rejoin_after seconds later
        rejoined = run.wait_for(lambda: [r for r in run.records if r["event"] == "rejoined"],
                                "the dropped rank's rejoin", args.rejoin_after + 120)[0]
    ends = round_starts(run.records)

    def median_round(first, last):  # rounds first+1 .. last
        return statistics.median(ends[n] - ends[n - 1] for n in range(first + 1, last + 1))
    return {"host": 1, "rate_bps": slow.rate_bps, "rounds": [slow_from + 1, slow_to],
            "before_s": median_round(slow_from - 3, slow_from),
            "slow_s": median_round(slow_from + 1, slow_to),
            "after_s": median_round(slow_to + 1, slow_to + 3),
            "drops": drops, "rejoined": rejoined}


def end_training(run, grace=30.0):
    """Waits (bounded) for every process to end after the last round; a process dropped as the
    slow peer late in the run may still wait for an admission no period will give: ended, its
    host returned. Returns those hosts."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in run.procs.values()):
        time.sleep(0.1)
    waiting = [h for h, p in run.procs.items() if p.poll() is None]
    for h in waiting:
        run.gone.add(h)
        os.killpg(run.procs[h].pid, signal.SIGKILL)
        run.procs[h].wait()
    run.poll()
    return waiting


def check_rounds(records, total):
    """Every round 1..total completed, once per process, in order; one digest per round."""
    by_round, problems = {}, []
    by_pid = {}
    for r in records:
        by_pid.setdefault(r["pid"], []).append(r)
    for pid, rs in by_pid.items():
        kept = {id(r) for r in _kept_rounds(rs)}
        rounds, expected, first = [], [], 1
        for r in rs:  # consecutive from 1, from a join's round + 1, and again after a rejoin
            if r["event"] in ("joined", "rejoined"):
                first = r["rounds"] + 1
            elif id(r) in kept:
                by_round.setdefault(r["round"], set()).add(r["digest"])
                rounds.append(r["round"])
                expected.append(first)
                first += 1
        if rounds != expected:
            problems.append(f"process {pid}: rounds {rounds[:5]}... not consecutive from "
                            f"{expected[:1]}")
    missing = [n for n in range(1, total + 1) if n not in by_round]
    split = {n: sorted(d) for n, d in by_round.items() if len(d) > 1}
    if missing:
        problems.append(f"rounds never completed: {missing[:10]}")
    if split:
        problems.append(f"rounds whose replicas differ: {dict(list(split.items())[:5])}")
    replicas = sum(1 for r in records if r["event"] == "round")
    return {"rounds": len(by_round), "replica_round_digests": replicas,
            "processes": len(by_pid), "problems": problems}


def _kept_rounds(rs):
    """A process's round records, less those a rejoin discarded: a rank dropped as the slow
    peer in round N completed its own round N (and any after) before it found out, with
    results that were not the job's."""
    kept = []
    for r in rs:
        if r["event"] == "round":
            kept.append(r)
        elif r["event"] == "rejoined" and r.get("round") is not None:
            kept = [k for k in kept if k["round"] < r["round"]]
    return kept


def summarize(events, records, args, params):
    state_bytes = 2 * 4 * params  # theta_global and the outer momentum, float32
    rate = args.rate_bps
    bound = 2 * args.rtt_s + 1.1 * state_bytes * 8 / rate + 0.5
    admissions = [a for r in records if r["event"] == "round" and r["rank"] == 0
                  for a in r["admissions"]]
    losses = []
    for e in (e for e in events if "recovery" in e):  # an off-schedule drop ends the list early
        rec = e["recovery"]
        back = rec["failed_at"] + rec["seconds"]
        losses.append({"how": e["how"], "host": e["host"],
                       "event_to_training_s": back - e["t"],
                       "failure_to_training_s": rec["seconds"], "lost": rec["lost"]})
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {
        "losses": losses,
        "admissions": admissions,
        "join_bound_s": bound, "state_bytes": state_bytes,
        "summary": {
            "losses": len(losses), "joins": len(admissions),
            "kill_to_training_s": [round(x["event_to_training_s"], 3) for x in losses
                                   if x["how"] == "kill"],
            "stop_to_training_s": [round(x["event_to_training_s"], 3) for x in losses
                                   if x["how"] == "stop"],
            "failure_to_training_s_median": med([x["failure_to_training_s"] for x in losses]),
            "admission_s": [round(a["seconds"], 3) for a in admissions],
            "admission_s_median": med([a["seconds"] for a in admissions]),
            "joins_within_bound": sum(a["seconds"] <= bound for a in admissions),
        }}


def controller(args):
    import emulator

    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    link = emulator.HostLink(args.rtt_s / 2, args.rate_bps, loss=args.loss)
    with emulator.Wan(args.hosts, link, timeout=args.timeout + 120) as wan:
        if args.sysctl:
            wan.sysctl(*args.sysctl)
        run = Run(wan, args)
        try:
            report = run_and_check(run, args)
        finally:  # the processes' records and output, kept (the emulator removes its folder)
            shutil.rmtree(args.logs, ignore_errors=True)
            shutil.copytree(run.dir, args.logs)
            print(f"logs: {args.logs}")
    print(json.dumps({**report["summary"], "slow_link": report["slow_link"]}, indent=1))
    print(json.dumps(report["check"], indent=1))
    if args.out:
        from bench_common import write_json
        write_json(args.out, report)
    return 1 if report["check"]["problems"] else 0


def run_and_check(run, args):
    """The store, one rank per host, the schedule; then the checks and the report."""
    import torch
    from bench_common import machine_info
    from ddp_step import make_model

    run.spawn(0, 0, role="store")
    run.wait_for(lambda: os.path.exists(os.path.join(run.dir, "store.ready")), "the store", 120)
    for h in range(args.hosts):
        run.spawn(h, h)
    start = time.monotonic()
    events, off_schedule, slowed = [], None, None
    try:
        run_schedule(run, args, events)
        slowed = slow_link(run, args, run.wan.links[0])
        run.wait_for(lambda: run.last_round() >= args.rounds, "the last round", args.timeout)
    except OffSchedule as exc:  # reported with the rounds run so far
        off_schedule = str(exc)
    waiting = end_training(run)
    seconds = time.monotonic() - start
    run.poll()
    check = check_rounds(run.records, args.rounds)
    if off_schedule:
        check["problems"].insert(0, off_schedule)
    check["waiting_to_rejoin_at_the_end"] = waiting
    if run.failed():
        check["problems"].append(f"processes failed: {run.failed()}")
    params = sum(p.numel() for p in make_model(args.width, args.width, args.width).parameters())
    return {"machine": machine_info(), "torch": torch.__version__,
            "args": {k: v for k, v in vars(args).items() if k != "pass_on"},
            "wan_check": run.wan.check, "seconds": seconds, "params": params, "check": check,
            "events": events, "slow_link": slowed,
            **summarize(events, run.records, args, params)}


def main(argv=None):
    import emulator

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--rtt", default="100ms")
    p.add_argument("--loss", type=float, default=0.001)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--losses", type=int, default=10, help="losses (and as many joins)")
    p.add_argument("--first", type=int, default=3, help="round of the first loss")
    p.add_argument("--every", type=int, default=8, help="rounds from one loss to the next")
    p.add_argument("--slow-rounds", type=int, default=4,
                   help="then host 1's link at a tenth of its rate for this many rounds")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out")
    p.add_argument("--sysctl", action="append", default=[], metavar="NAME=VALUE",
                   help="a kernel setting in every host's namespace (repeatable), e.g. "
                        "net.ipv4.tcp_slow_start_after_idle=0")
    p.add_argument("--logs", help="where the processes' records and output are kept "
                   "(default: --out's name + .logs, else ./diloco_churn.logs)")
    # What every process of the job runs with (passed on).
    p.add_argument("--period", type=int, default=20)
    p.add_argument("--width", type=int, default=1024, help="the MLP's width (3 square layers)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--codec", default="int4")
    p.add_argument("--lost-wait", type=float, default=1.0)
    p.add_argument("--exchange-timeout", type=float, default=3.0)
    p.add_argument("--slow-peer", default="wait", choices=("wait", "drop"),
                   help="DiLoCoState's slow_peer: wait for a slow peer, or drop it (it rejoins "
                        "--rejoin-after seconds later)")
    p.add_argument("--rejoin-after", type=float, default=30.0)
    p.add_argument("--send-ahead", action="store_true",
                   help="DiLoCoOptimizer's send_ahead: joiners get the state while the period "
                        "trains (pays where the period outlasts the state on the link)")
    # In the hosts.
    p.add_argument("--role", default="controller", choices=("controller", "store", "train"))
    p.add_argument("--host", type=int, default=0)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--dir")
    p.add_argument("--addr0")
    args = p.parse_args(argv)
    args.logs = args.logs or (args.out or "diloco_churn") + ".logs"
    args.rate_bps = emulator.parse_rate(args.rate)
    args.rtt_s = emulator.parse_time(args.rtt)
    args.pass_on = ["--rounds", str(args.rounds), "--timeout", str(args.timeout),
                    "--period", str(args.period), "--width", str(args.width),
                    "--batch", str(args.batch), "--codec", args.codec,
                    "--lost-wait", str(args.lost_wait),
                    "--exchange-timeout", str(args.exchange_timeout),
                    "--slow-peer", args.slow_peer, "--rejoin-after", str(args.rejoin_after)] + \
        (["--send-ahead"] if args.send_ahead else [])
    if args.role == "store":
        return serve_store(args)
    if args.role == "train":
        return train(args)
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())
