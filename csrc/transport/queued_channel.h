#pragma once

#include <deque>

#include "csrc/common/crc32c.h"
#include "csrc/common/options.h"
#include "csrc/transport/channel.h"

namespace ringdist {

// The posting half of a Channel, shared by every transport: the ordered
// queues of sends and receives, their tickets and completion callbacks.
// A transport adds how bytes move (progress) and how a waiter sleeps.
//
// With link.checksums (RINGDIST_CRC=1, agreed by all ranks at connect time),
// every post is followed on the wire by a 4-byte CRC32C trailer. A receive's
// ticket (and callback) completes only after its trailer matched, so a
// corrupted transfer fails the operation that used it, naming the link.
class QueuedChannel : public Channel {
 public:
  uint64_t postSend(const void* data, size_t bytes, Callback done) override;
  uint64_t postRecv(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvNext(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvReduce(void* dst, const void* other, size_t bytes, size_t elementBytes,
                          Combine combine, bool incomingFirst = true) override;

  bool sendDone(uint64_t ticket) const override { return sendsDone_ >= ticket; }
  bool recvDone(uint64_t ticket) const override { return recvsDone_ >= ticket; }
  bool hasPending() const override { return !sends_.empty() || !recvs_.empty(); }
  bool receiving() const override { return !recvs_.empty(); }

 protected:
  QueuedChannel(int peer, const LinkOptions& link)
      : Channel(peer), checksums_(link.checksums), corruptSendAt_(link.corruptSendAt) {}

  struct Request {
    char* data;
    size_t bytes;
    size_t done;
    bool counted;  // false for postRecvNext continuations (they have no ticket)
    Callback callback;
    const char* other = nullptr;  // receive-and-reduce: combine with this
    size_t elementBytes = 0;
    Combine combine = nullptr;
    bool incomingFirst = true;
    // Checksums: a trailer's data points at `checksum`; `expected` is the
    // CRC of the payload it follows; receive-and-reduce payloads accumulate
    // their CRC in `checksum` as bytes arrive (before they are combined).
    bool trailer = false;
    uint32_t checksum = 0;
    uint32_t expected = 0;
  };

  // Receive-and-reduce: data[offset..] = combine of `count` arrived elements
  // with other[offset..], in the order the post asked for.
  static void combineArrived(Request& r, size_t offset, const char* arrived, size_t count) {
    if (r.incomingFirst) {
      r.combine(r.data + offset, arrived, r.other + offset, count);
    } else {
      r.combine(r.data + offset, r.other + offset, arrived, count);
    }
  }

  // Transports call this with each piece of a receive-and-reduce payload
  // before combining it.
  void absorb(Request& r, const char* bytes, size_t n) {
    if (checksums_) r.checksum = crc32cExtend(r.checksum, bytes, n);
  }

  // Pop the front request once all its bytes moved: count it, then run its
  // callback (which may post more, or continue a receive with postRecvNext).
  void completeSend();
  void completeRecv();
  // Credits `bytes` that just moved to the first `posts` requests of `queue`
  // (sends_ or recvs_) in order, completing each that became whole; false
  // if one was left partly done.
  bool credit(std::deque<Request>& queue, size_t bytes, int posts);
  // Drops everything queued (abort).
  void clearQueues();
  // Drops everything queued and counts it as done, so the tickets of later
  // posts complete (a link kept for a shrunk group).
  void dropQueued();

  std::deque<Request> sends_;
  std::deque<Request> recvs_;

 private:
  void pushSendTrailer(const void* data, size_t bytes);
  void pushRecvTrailer(Callback done, bool counted, bool front);

  const bool checksums_;
  const uint64_t corruptSendAt_;
  uint64_t sendsPosted_ = 0;
  uint64_t sendsDone_ = 0;
  uint64_t recvsPosted_ = 0;
  uint64_t recvsDone_ = 0;
};

}  // namespace ringdist
