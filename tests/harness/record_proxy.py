"""A TCP proxy between a dialing rank and the listener it dials, for tests that tamper with
real traffic (test_encryption.py).

It forwards the handshake as it is (harness/wire_client.py: the hello one way, the challenge
and the ack the other), then cuts each direction into sealed records (length, ciphertext,
tag) and may do one thing to one record of one direction: flip a bit of its ciphertext or of
its length, send it twice, or leave it out. It keeps every byte it forwarded, so a test can
look for plaintext on the wire. With ``sealed=False`` (ranks with RINGDIST_TCP_ENCRYPT=0) it
only forwards and keeps.
"""
from __future__ import annotations

import socket
import threading

from harness import wire_client as wire

DIALER = "dialer"      # the direction dialer -> acceptor (higher rank -> lower rank)
ACCEPTOR = "acceptor"  # acceptor -> dialer
ACTIONS = ("flip", "flip-length", "replay", "drop")
# The handshake's messages each direction carries before its first record.
_HANDSHAKE = {DIALER: [wire.HELLO.size], ACCEPTOR: [wire.CHALLENGE.size, wire.ACK.size]}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = wire.recv_exactly(sock, n)
    if len(data) < n:
        raise EOFError
    return data


class RecordProxy:
    """Listens on 127.0.0.1 and relays the first connection to ``target`` ("host:port").
    ``action`` (one of ACTIONS, or None) is done to record number ``record`` (from 0) of
    direction ``direction``."""

    def __init__(self, target: str, action: str | None = None, direction: str = DIALER,
                 record: int = 2, sealed: bool = True):
        assert action is None or action in ACTIONS, action
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.action, self.direction, self.record, self.sealed = action, direction, record, sealed
        self.captured = {DIALER: bytearray(), ACCEPTOR: bytearray()}
        self.records = {DIALER: 0, ACCEPTOR: 0}  # records relayed per direction
        self.tampered = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def _accept(self):
        try:
            dialer, _ = self._listener.accept()
        except OSError:
            return  # stopped before a rank dialled
        acceptor = socket.create_connection(self.target)
        self._socks += [dialer, acceptor]
        for src, dst, direction in ((dialer, acceptor, DIALER), (acceptor, dialer, ACCEPTOR)):
            t = threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True)
            t.start()
            self._threads.append(t)

    def _send(self, dst, data: bytes, direction: str):
        self.captured[direction] += data
        dst.sendall(data)

    def _pump(self, src, dst, direction):
        try:
            for size in _HANDSHAKE[direction]:
                self._send(dst, _recv_exactly(src, size), direction)
            while True:
                if not self.sealed:
                    data = src.recv(1 << 16)
                    if not data:
                        raise EOFError
                    self._send(dst, data, direction)
                    continue
                header = _recv_exactly(src, wire.RECORD_HEADER.size)
                (length,) = wire.RECORD_HEADER.unpack(header)
                record = bytearray(header + _recv_exactly(src, length + wire.RECORD_TAG_BYTES))
                self._relay(dst, record, direction)
        except (EOFError, OSError):
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_WR if s is dst else socket.SHUT_RD)
                except OSError:
                    pass

    def _relay(self, dst, record: bytearray, direction: str):
        number = self.records[direction]
        self.records[direction] += 1
        if self.action is None or direction != self.direction or number != self.record:
            self._send(dst, bytes(record), direction)
            return
        self.tampered = True
        if self.action == "flip":
            record[wire.RECORD_HEADER.size + (len(record) - wire.RECORD_HEADER.size) // 2] ^= 0x10
        elif self.action == "flip-length":
            record[0] ^= 0x01
        if self.action != "drop":
            self._send(dst, bytes(record), direction)
        if self.action == "replay":
            self._send(dst, bytes(record), direction)

    def stop(self):
        for s in [self._listener, *self._socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a pump blocked in recv (close does not)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=5)
