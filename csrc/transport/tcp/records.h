#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csrc/common/crypto.h"

namespace ringdist {
namespace tcp {

// Sealed records: how an encrypted TcpChannel's bytes travel. Each direction
// of a connection is cut into records, each
//   length      4 bytes, little-endian: the plaintext's, 1..kMaxRecordBytes
//   ciphertext  length bytes
//   tag         16 bytes
// sealed with AES-256-GCM under that direction's key (handshake.h), with the
// length as associated data and the record's number in its direction (0, 1,
// 2, ...) as nonce. So a flipped bit fails the record's tag, and so does a
// record replayed, reordered or dropped (its successor arrives under the
// wrong number): the reader throws, naming the peer; no byte of a record
// reaches a receive before its tag matched.
//
// A record holds what the sender had queued when it sealed, up to
// kMaxRecordBytes: a small message and its header are one record in one
// packet, a large transfer is cut into full records.
//
// A fence is a record with kFenceBit set in its length (authenticated with
// it): where a link kept for a shrunk group (TcpChannel::beginFence) ends the
// aborted group's bytes. readv and peek stop at a fence, as if nothing more had
// arrived: the peer shrank first, and this end's operation of the old group
// waits on (it is stalled) until this rank's own shrink aborts it and fences.

// Large enough that the per-record costs (a nonce, a tag, 20 bytes of
// framing) vanish next to the sealing itself, small enough to stay in L2 and
// to let the receiver open record i while record i+1 is on the wire.
constexpr size_t kMaxRecordBytes = 64 * 1024;
constexpr size_t kRecordHeaderBytes = 4;
constexpr size_t kRecordOverhead = kRecordHeaderBytes + Aead::kTagBytes;
constexpr uint32_t kFenceBit = 0x80000000u;
// A fence's plaintext: a digest both ends derive from the shrunk group's key.
constexpr size_t kFenceBytes = 32;

// The keys of one connection, one per direction (derived in the handshake).
struct SessionKeys {
  Key send;
  Key receive;
};

// The sending half: sendmsg(2) for plaintext.
class RecordWriter {
 public:
  explicit RecordWriter(const Key& key)
      : aead_(key, true), out_(new uint8_t[kOutBytes]) {}

  // On a non-blocking socket: seals the front of iov into records and writes
  // them. Returns how many bytes of iov are in records wholly written, or -1
  // with errno (EAGAIN: none). The rest of a record partly written stays
  // here: the caller calls again with iov starting where the count ended.
  ssize_t writev(int fd, const iovec* iov, int count);
  // For a fence: forgets which sends the records sealed so far carry (those
  // sends are dropped) but keeps their bytes, which must still be written
  // (the reader counts records). Then flush() writes them.
  void dropSends() { records_.clear(); }
  // Writes what is sealed; 1 once nothing is left, 0 if the socket is full,
  // -1 with errno.
  int flush(int fd);
  // Seals a fence carrying `digest` (kFenceBytes); only once flush() left
  // nothing.
  void sealFence(const uint8_t* digest);

 private:
  // Seals `bytes` of iov from `offset` on into records at the end of out_.
  void seal(const iovec* iov, int count, size_t offset, size_t bytes);
  // Writes a record's length field (`field`) at the end of out_ and begins
  // sealing it; returns where its ciphertext goes.
  uint8_t* beginRecord(uint32_t field);

  // Most plaintext sealed ahead of the socket per writev: a few records.
  static constexpr size_t kSealAheadBytes = 4 * kMaxRecordBytes;
  static constexpr size_t kOutBytes = kSealAheadBytes + 4 * kRecordOverhead;

  Aead aead_;
  uint64_t number_ = 0;  // of the next record
  // Records sealed: out_[sent_..outEnd_) not yet written. Not a vector: growing
  // one would zero every byte before the cipher writes it.
  std::unique_ptr<uint8_t[]> out_;
  size_t outEnd_ = 0;
  size_t sent_ = 0;
  // Of each record in out_: where it ends in out_, and its plaintext bytes.
  std::deque<std::pair<size_t, size_t>> records_;
};

// The receiving half: readv(2) and a peek for plaintext.
class RecordReader {
 public:
  // `peer` names the sender in errors: "rank 3 (10.0.0.2:1234)".
  RecordReader(const Key& key, std::string peer)
      : aead_(key, false), peer_(std::move(peer)), in_(new uint8_t[kReadAheadBytes]),
        plain_(new uint8_t[kPlainBytes]) {}

  // Fills iov with plaintext of the records that arrived, reading the socket
  // at most once. Returns the bytes filled; 0 once the peer closed; -1 with
  // errno (EAGAIN: nothing yet). Throws when a record fails authentication.
  ssize_t readv(int fd, const iovec* iov, int count);
  // Copies the next `bytes` of plaintext into dst without consuming them;
  // false if fewer have arrived.
  bool peek(int fd, void* dst, size_t bytes);
  // Whether plaintext, or a whole record, waits here: bytes already off the
  // socket, which a poll of it would not announce.
  bool buffered() const {
    return plainStart_ < plainEnd_ || (recordArrived() && !fenceAhead());
  }
  // For a fence: drops every plaintext byte and record up to the peer's fence,
  // reading the socket until it has no more. True once the fence is read (the
  // records after it stay for the next receive); false if it has not arrived.
  // Throws when the peer closed, the read failed, or the fence carries another
  // digest than `digest` (the peer shrank to another group).
  bool skipToFence(int fd, const uint8_t* digest);
  void rename(std::string peer) { peer_ = std::move(peer); }

 private:
  // The length field of the record at the front of in_ (kRecordHeaderBytes there).
  uint32_t nextField() const;
  // Whether the record at the front of in_ is a fence.
  bool fenceAhead() const {
    return inEnd_ - inStart_ >= kRecordHeaderBytes && (nextField() & kFenceBit) != 0;
  }
  bool recordArrived() const;
  // The plaintext length of the record at the front of in_ (checked).
  size_t nextLength();
  // Opens the record at the front of in_ into out (nextLength() bytes).
  void open(uint8_t* out);
  // Opens the record at the front of in_, of `length` plaintext bytes, into out.
  void openRecord(uint8_t* out, size_t length);
  // One recv(2) into in_: its result.
  ssize_t fill(int fd);
  [[noreturn]] void failAuthentication();

  // Ciphertext read ahead: enough for a few records.
  static constexpr size_t kReadAheadBytes = 4 * (kMaxRecordBytes + kRecordOverhead);
  // Plaintext opened ahead of the receives: what a peek leaves (less than a
  // record) and one more record.
  static constexpr size_t kPlainBytes = 2 * kMaxRecordBytes;

  Aead aead_;
  std::string peer_;
  uint64_t number_ = 0;  // of the next record
  bool failed_ = false;
  std::unique_ptr<uint8_t[]> in_;  // in_[inStart_..inEnd_): ciphertext not opened yet
  size_t inStart_ = 0;
  size_t inEnd_ = 0;
  std::unique_ptr<uint8_t[]> plain_;  // plain_[plainStart_..plainEnd_): opened, not received
  size_t plainStart_ = 0;
  size_t plainEnd_ = 0;
};

}  // namespace tcp
}  // namespace ringdist
