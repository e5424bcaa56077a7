"""ringdist's TCP wire format, as the tests speak it: the one place to edit when it changes.

The handshake of csrc/transport/tcp/handshake.cc (mutual HMAC-SHA256 over fresh nonces, keyed
with the group secret from the store; the secret never crosses the wire):

    acceptor -> dialer   CHALLENGE {magic, version, acceptor rank, nonceA}
    dialer -> acceptor   HELLO {magic, version, rank, size, nonceD,
                                HMAC(secret, "hello", nonceA, rank, size, acceptor)}
    acceptor -> dialer   ACK {magic, HMAC(secret, "ack", nonceD, acceptor, rank, size)}

then every operation's data is preceded by an op header (OpHeader in
csrc/collectives/op_header.h). Used by the handshake tests (foreign clients) and
the fuzzer (an authenticated rank sending hostile frames).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

MAGIC = 0x52444832                        # kHelloMagic, "RDH2"
VERSION = 6                               # kProtocolVersion
CHALLENGE = struct.Struct("<IIi16s")      # magic, version, acceptor rank, nonce
HELLO = struct.Struct("<IIii16s32s")      # magic, version, rank, size, nonce, mac
ACK = struct.Struct("<I32s")              # magic, mac

OP_MAGIC = 0x52444f50                     # kOpMagic, "RDOP"
# magic, type, dtype, op, variant, seq, count, root, segment bytes, tag, padding
OP = struct.Struct("<IBBBBQQiIiI")
OP_SEND = 10                              # OpType::kSend


def mac(secret: bytes, label: str, nonce: bytes, a: int, b: int, c: int) -> bytes:
    """HMAC-SHA256(secret, label padded to 8 bytes | nonce | a, b, c as int32)."""
    message = label.encode().ljust(8, b"\0") + nonce + struct.pack("<iii", a, b, c)
    return hmac.new(secret, message, hashlib.sha256).digest()


def hello(secret: bytes, nonce: bytes, rank: int, size: int, acceptor: int, *,
          magic: int = MAGIC, version: int = VERSION) -> bytes:
    """The hello answering a challenge's ``nonce``: authentic if ``secret`` is the group's."""
    return HELLO.pack(magic, version, rank, size, os.urandom(16),
                      mac(secret, "hello", nonce, rank, size, acceptor))


def op_header(*, type: int, dtype: int = 0, op: int = 0, variant: int = 0, seq: int = 0,
              count: int = 0, root: int = -1, segment_bytes: int = 0, tag: int = 0,
              padding: int = 0, magic: int = OP_MAGIC) -> bytes:
    """An op header; fields not given take the values of a plain point-to-point send."""
    return OP.pack(magic, type, dtype, op, variant, seq, count, root, segment_bytes, tag, padding)


def peer_record(hostname: str, transport: str = "auto", crc: bool = False) -> bytes:
    """What a rank publishes under ringdist/host/<rank> (PeerRecord in
    csrc/transport/host_identity.h): a hostname no real rank has keeps links on TCP."""
    fields = ["ringdist-peer/1", hostname, "boot", "none", "pid:[0]", "", transport,
              "crc" if crc else "nocrc"]
    return "\n".join(fields).encode()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or fewer if the peer closed the connection first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def read_challenge(sock: socket.socket):
    """(magic, version, acceptor rank, nonce) of the listener's challenge; None if it
    closed the connection first."""
    data = recv_exactly(sock, CHALLENGE.size)
    return CHALLENGE.unpack(data) if len(data) == CHALLENGE.size else None


def connect(host: str, port: int, secret: bytes, rank: int, size: int, timeout: float = 5):
    """A connection to a rank's listener that passed the handshake as ``rank`` of a group
    of ``size`` (challenge read, hello sent, ack read), or None if the listener dropped it."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.settimeout(timeout)
        challenge = read_challenge(sock)
        if challenge is not None:
            _, _, acceptor, nonce = challenge
            sock.sendall(hello(secret, nonce, rank, size, acceptor))
            if len(recv_exactly(sock, ACK.size)) == ACK.size:
                return sock
    except BaseException:
        sock.close()
        raise
    sock.close()
    return None
