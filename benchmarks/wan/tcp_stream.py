"""Raw TCP through the emulated WAN: the bound a transport can reach on a link, without ringdist.

    python benchmarks/wan/emulator.py run --hosts 2 --delay 50ms --rate 1gbit -- \\
        python benchmarks/wan/tcp_stream.py --bytes 16MiB --streams 1 --cc bbr --buffer 32MiB

Host 1 sends --bytes split evenly over --streams TCP connections to host 0, which answers one
byte on each connection once that connection's share arrived; host 1 times each round from the
first send to the last answer, --rounds times, with --gap seconds of idle between rounds. Ideal
per round: 8 * bytes / rate + one round trip (the same as a two-rank allreduce's, whose two
directions carry that much each at once). --cc sets each socket's congestion control (else it
keeps what the emulator's shim gave it: cubic); --buffer sets SO_SNDBUF and SO_RCVBUF with
SO_*BUFFORCE (needs CAP_NET_ADMIN, which the emulator's root has) before connecting. Host 1
prints one JSON line: the settings, each round's seconds and the median of rounds after the
first (which includes the connections' slow start).
"""
import argparse
import json
import os
import selectors
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulator import parse_size  # noqa: E402

SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # linux/asm-generic/socket.h


def tune(s, args):
    if args.cc:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, args.cc.encode())
    if args.buffer:
        s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, args.buffer)
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, args.buffer)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def receive(args, address, share):
    listener = socket.socket()
    tune(listener, args)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, args.port))
    listener.listen(64)
    conns = [listener.accept()[0] for _ in range(args.streams)]
    buf = bytearray(1 << 20)
    for _ in range(args.rounds):
        sel, got = selectors.DefaultSelector(), {}
        for c in conns:
            sel.register(c, selectors.EVENT_READ)
            got[c] = 0
        while got:
            for key, _ in sel.select():
                c = key.fileobj
                n = c.recv_into(buf, min(len(buf), share - got[c]))
                if n <= 0:
                    sys.exit("the sender closed early")
                got[c] += n
                if got[c] == share:
                    sel.unregister(c)
                    c.send(b"k")
                    del got[c]


def send(args, address, share):
    time.sleep(1.0)  # the receiver listens first
    conns = []
    for _ in range(args.streams):
        s = socket.socket()
        tune(s, args)
        s.connect((address, args.port))
        s.setblocking(False)
        conns.append(s)
    data = memoryview(bytearray(share))
    times = []
    for _ in range(args.rounds):
        start, sel, sent, answers = time.monotonic(), selectors.DefaultSelector(), {}, 0
        for c in conns:
            sel.register(c, selectors.EVENT_WRITE)
            sent[c] = 0
        while answers < len(conns):
            for key, events in sel.select():
                c = key.fileobj
                if events & selectors.EVENT_WRITE:
                    try:
                        sent[c] += c.send(data[sent[c]:sent[c] + (4 << 20)])
                    except BlockingIOError:
                        pass
                    if sent[c] == share:
                        sel.modify(c, selectors.EVENT_READ)
                elif c.recv(1):
                    answers += 1
                    sel.unregister(c)
        times.append(time.monotonic() - start)
        time.sleep(args.gap)
    cc = conns[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    print(json.dumps({"bytes": share * len(conns), "streams": len(conns), "gap_s": args.gap,
                      "cc": cc.split(b"\0")[0].decode(), "buffer": args.buffer,
                      "rounds_s": [round(t, 4) for t in times],
                      "median_s": statistics.median(times[1:] or times)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="16MiB")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.0, help="idle seconds between rounds")
    ap.add_argument("--cc", default="", help="congestion control per socket (default: keep)")
    ap.add_argument("--buffer", default="0", help="SO_SNDBUF/SO_RCVBUF, forced (0: autotuned)")
    ap.add_argument("--port", type=int, default=29800)
    args = ap.parse_args()
    args.buffer = parse_size(args.buffer)
    share = parse_size(args.bytes) // args.streams
    address = os.environ["WAN_ADDRS"].split(",")[0]
    if os.environ["WAN_HOST"] == "0":
        receive(args, address, share)
    elif os.environ["WAN_HOST"] == "1":
        send(args, address, share)


if __name__ == "__main__":
    main()
