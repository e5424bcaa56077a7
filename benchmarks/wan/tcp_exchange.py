"""Raw TCP among N emulated hosts in an allreduce's pattern, without ringdist: the bound a
transport can reach on this machine's emulated line at N hosts.

    python benchmarks/wan/emulator.py run --hosts 4 --delay 50ms --rate 1gbit -- \\
        python benchmarks/wan/tcp_exchange.py --bytes 16MiB --cc bbr --buffer 32MiB

Every host holds --bytes cut in N chunks, and each round moves what the direct exchange moves:
every host sends chunk q to host q (phase 1); once a host holds its chunk from every peer it
sends that chunk to every peer (phase 2), and the round ends on a host once it holds every
chunk. One connection per pair of hosts, no reduction, no encryption, no framing: only the
kernel's TCP and the delay line. Ideal: 2(N-1)/N * 8 * bytes / rate + 2 one-way trips.
--pattern ring instead sends a ring's bytes (2(N-1)/N * bytes) in one stream to the next host:
one flow into each host, the line's rate without N-1 flows meeting at a host; ideal
2(N-1)/N * 8 * bytes / rate + one one-way trip. --pattern pair (two hosts): each host sends its
whole buffer to the other at once, as ringdist's pair exchange does; the same bytes as the
direct exchange in one round (ideal 8 * bytes / rate + one one-way trip). Rounds start
together: host 0 answers every host's one-byte "ready" once all have sent it and starts
--one-way seconds later, as its answers arrive. --cc and --buffer as in tcp_stream.py. Each host
prints one JSON line: its settings and each round's seconds from its start until it sent and
received everything (the round's time: the largest over the hosts).
"""
import argparse
import json
import os
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulator import parse_size  # noqa: E402
from tcp_stream import tune  # noqa: E402

_PIECE = 4 << 20  # bytes per send() call


def connect_all(args, addrs, me):
    """{peer: socket}, one connection per pair (the higher host dials the lower), and host 0's
    connections double as the round's start signal."""
    listener = socket.socket()
    tune(listener, args)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addrs[me], args.port))
    listener.listen(64)
    time.sleep(1.0)  # every host listens before any dials
    conns = {}
    for peer in range(me):
        s = socket.socket()
        tune(s, args)
        s.connect((addrs[peer], args.port))
        s.sendall(bytes([me]))
        conns[peer] = s
    for _ in range(len(addrs) - 1 - me):
        s, _ = listener.accept()
        conns[s.recv(1)[0]] = s
    listener.close()
    return conns


def start_together(conns, me, n, one_way):
    """Host 0 answers each host's "ready" once all sent it, and starts itself `one_way` seconds
    later, when its answers arrive."""
    if me == 0:
        for peer in range(1, n):
            conns[peer].recv(1)
        for peer in range(1, n):
            conns[peer].sendall(b"g")
        time.sleep(one_way)
    else:
        conns[0].sendall(b"r")
        conns[0].recv(1)


def one_round(conns, plan):
    """Moves one round of `plan` (_plans) over `conns` and returns its seconds: first the
    phase 1 sends; once every connection delivered its phase 1 bytes, the phase 2 sends; done
    once everything is sent and every connection delivered all it carries to this host."""
    first, second, need_first, need = plan
    longest = max([0] + [size for sizes in (first, second) for size in sizes.values()])
    data, buf = memoryview(bytearray(longest)), bytearray(1 << 20)
    sel = selectors.DefaultSelector()
    to_send = {p: [first[p]] if first.get(p) else [] for p in conns}
    sent, got, phase2 = {p: 0 for p in conns}, {p: 0 for p in conns}, False
    for p, c in conns.items():
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ, p)
    start = time.monotonic()
    while any(got[p] < need.get(p, 0) or to_send[p] for p in conns):
        for p, c in conns.items():  # write interest only while something is left to send
            sel.modify(c, selectors.EVENT_READ | (selectors.EVENT_WRITE if to_send[p] else 0), p)
        for key, events in sel.select():
            p, c = key.data, key.fileobj
            if events & selectors.EVENT_READ and got[p] < need.get(p, 0):
                try:
                    got[p] += c.recv_into(buf, min(len(buf), need[p] - got[p]))
                except BlockingIOError:
                    pass
            if events & selectors.EVENT_WRITE and to_send[p]:
                try:
                    sent[p] += c.send(data[sent[p]:min(to_send[p][0], sent[p] + _PIECE)])
                except BlockingIOError:
                    pass
                if sent[p] == to_send[p][0]:
                    to_send[p].pop(0)
                    sent[p] = 0
        if not phase2 and all(got[p] >= need_first.get(p, 0) for p in conns):
            phase2 = True
            for p, size in second.items():
                to_send[p].append(size)
    seconds = time.monotonic() - start
    sel.close()
    for c in conns.values():
        c.setblocking(True)
    return seconds


def _plans(pattern, me, n, total):
    """(phase 1 bytes to each peer, phase 2 bytes to each peer, phase 1 bytes from each peer,
    all bytes from each peer) for this host. direct: the direct exchange's chunks (total/n to
    each peer, twice). ring: a ring's bytes, 2(n-1)/n * total, in one stream to the next host
    (one flow into each host: the line's rate without N-1 flows meeting at a host). pair (two
    hosts): the whole buffer to the other host in one round."""
    peers = [p for p in range(n) if p != me]
    if pattern == "pair":
        if n != 2:
            raise SystemExit(f"tcp_exchange: --pattern pair needs 2 hosts, got {n}")
        return {peers[0]: total}, {}, {}, {peers[0]: total}
    if pattern == "direct":
        chunk = total // n
        each = {p: chunk for p in peers}
        return each, each, each, {p: 2 * chunk for p in peers}
    stream = 2 * (n - 1) * total // n
    return {(me + 1) % n: stream}, {}, {}, {(me - 1) % n: stream}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="16MiB")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pattern", default="direct", choices=("direct", "ring", "pair"))
    ap.add_argument("--one-way", type=float, default=0.05,
                    help="the line's one-way delay (s): host 0 starts that long after its go")
    ap.add_argument("--cc", default="", help="congestion control per socket (default: keep)")
    ap.add_argument("--buffer", default="0", help="SO_SNDBUF/SO_RCVBUF, forced (0: autotuned)")
    ap.add_argument("--port", type=int, default=29801)
    args = ap.parse_args()
    args.buffer = parse_size(args.buffer)
    addrs = os.environ["WAN_ADDRS"].split(",")
    me, n = int(os.environ["WAN_HOST"]), len(addrs)
    total = parse_size(args.bytes)
    conns = connect_all(args, addrs, me)
    plan = _plans(args.pattern, me, n, total)
    times = []
    for _ in range(args.rounds):
        start_together(conns, me, n, args.one_way)
        times.append(one_round(conns, plan))
    cc = next(iter(conns.values())).getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    print(json.dumps({"host": me, "hosts": n, "bytes": total, "pattern": args.pattern,
                      "cc": cc.split(b"\0")[0].decode(),
                      "buffer": args.buffer, "rounds_s": [round(t, 4) for t in times]}),
          flush=True)


if __name__ == "__main__":
    main()
