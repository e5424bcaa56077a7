"""ringdist's TCP wire format, as the tests speak it: the one place to edit when it changes.

The handshake of csrc/transport/tcp/handshake.cc (mutual HMAC-SHA256 proofs over the
transcript, keyed with the proof key: HMAC(group secret from the store, user secret), the user
secret from RINGDIST_SECRET, empty without one; each side brings an ephemeral X25519 key):

    acceptor -> dialer   CHALLENGE {magic, version, acceptor rank, flags, nonceA, keyA}
    dialer -> acceptor   HELLO {magic, version, rank, size, flags, nonceD, keyD,
                                HMAC(proof key, "hello\0" | challenge | hello before its mac)}
    acceptor -> dialer   ACK {magic, HMAC(proof key, "ack\0" | the same transcript)},
                         or {REFUSED, zeros} when the hello's proof failed

flags: FLAG_ENCRYPT when the ranks seal their links (RINGDIST_TCP_ENCRYPT, default on),
FLAG_CHECKSUMS with a CRC trailer after every transfer (RINGDIST_CRC); a proven hello whose flags
differ from the acceptor's fails its connect. After the handshake, while the group connects,
each side sends its host record (a little-endian u32 length, then the record; PeerRecord in
csrc/transport/host_identity.h). Then, on encrypted links, every byte travels in sealed records (RECORD_HEADER: the
plaintext length, then ciphertext and a 16-byte tag; csrc/transport/tcp/records.h); on
plaintext links (RINGDIST_TCP_ENCRYPT=0) every operation's data is preceded by an op header
(OpHeader in csrc/collectives/op_header.h). Used by the handshake tests (foreign clients),
the fuzzer (an authenticated rank sending hostile frames on a plaintext link) and the
tampering proxy of test_encryption.py.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

MAGIC = 0x52444833                        # kHelloMagic, "RDH3"
REFUSED = 0x52444858                      # kRefusedMagic, "RDHX"
VERSION = 9                               # kProtocolVersion
FLAG_ENCRYPT = 1                          # kFlagEncrypt
CHALLENGE = struct.Struct("<IIiI16s32s")  # magic, version, acceptor rank, flags, nonce, key
HELLO = struct.Struct("<IIiiI16s32s32s")  # magic, version, rank, size, flags, nonce, key, mac
ACK = struct.Struct("<I32s")              # magic, mac
RECORD_HEADER = struct.Struct("<I")       # a sealed record's plaintext length
RECORD_TAG_BYTES = 16
MAX_RECORD_BYTES = 64 * 1024              # kMaxRecordBytes

OP_MAGIC = 0x52444f50                     # kOpMagic, "RDOP"
# magic, type, dtype, op, variant, seq, count, root, segment bytes, tag, padding
OP = struct.Struct("<IBBBBQQiIiI")
OP_SEND = 10                              # OpType::kSend


def proof_key(group_secret: bytes, user_secret: bytes = b"") -> bytes:
    """The key of the handshake's proofs (HKDF-Extract: an HMAC of the user's secret)."""
    return hmac.new(group_secret, user_secret, hashlib.sha256).digest()


def hello(key: bytes, challenge: bytes, rank: int, size: int, *, flags: int = FLAG_ENCRYPT,
          magic: int = MAGIC, version: int = VERSION) -> bytes:
    """The hello answering ``challenge`` (its raw bytes): authentic if ``key`` is the group's
    proof key. Its X25519 key is random bytes: enough to pass the proof, not to talk after."""
    body = HELLO.pack(magic, version, rank, size, flags, os.urandom(16), os.urandom(32),
                      bytes(32))[:-32]
    message = b"hello\0" + challenge + body
    return body + hmac.new(key, message, hashlib.sha256).digest()


def op_header(*, type: int, dtype: int = 0, op: int = 0, variant: int = 0, seq: int = 0,
              count: int = 0, root: int = -1, segment_bytes: int = 0, tag: int = 0,
              padding: int = 0, magic: int = OP_MAGIC) -> bytes:
    """An op header; fields not given take the values of a plain point-to-point send."""
    return OP.pack(magic, type, dtype, op, variant, seq, count, root, segment_bytes, tag, padding)


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
    """The listener's challenge, raw (CHALLENGE.unpack parses it); None if it closed the
    connection first."""
    data = recv_exactly(sock, CHALLENGE.size)
    return data if len(data) == CHALLENGE.size else None


def connect(host: str, port: int, key: bytes, rank: int, size: int, timeout: float = 5,
            flags: int = 0):
    """A connection to a rank's listener that passed the handshake as ``rank`` of a group
    of ``size`` (challenge read, hello sent, ack read), or None if the listener dropped it.
    Only a plaintext link (flags 0, the ranks run with RINGDIST_TCP_ENCRYPT=0) can be
    talked to afterwards."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.settimeout(timeout)
        challenge = read_challenge(sock)
        if challenge is not None:
            sock.sendall(hello(key, challenge, rank, size, flags=flags))
            ack = recv_exactly(sock, ACK.size)
            if len(ack) == ACK.size and ACK.unpack(ack)[0] == MAGIC:
                return sock
    except BaseException:
        sock.close()
        raise
    sock.close()
    return None
