#pragma once

#include <deque>

#include "csrc/transport/channel.h"

namespace ringdist {

// The posting half of a Channel, shared by every transport: the ordered
// queues of sends and receives, their tickets and completion callbacks.
// A transport adds how bytes move (progress) and how a waiter sleeps.
class QueuedChannel : public Channel {
 public:
  uint64_t postSend(const void* data, size_t bytes, Callback done) override;
  uint64_t postRecv(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvNext(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvReduce(void* dst, const void* other, size_t bytes, size_t elementBytes,
                          Combine combine) override;

  bool sendDone(uint64_t ticket) const override { return sendsDone_ >= ticket; }
  bool recvDone(uint64_t ticket) const override { return recvsDone_ >= ticket; }
  bool hasPending() const override { return !sends_.empty() || !recvs_.empty(); }

 protected:
  explicit QueuedChannel(int peer) : Channel(peer) {}

  struct Request {
    char* data;
    size_t bytes;
    size_t done;
    bool counted;  // false for postRecvNext continuations (they have no ticket)
    Callback callback;
    const char* other = nullptr;  // receive-and-reduce: combine with this
    size_t elementBytes = 0;
    Combine combine = nullptr;
  };

  // Pop the front request once all its bytes moved: count it, then run its
  // callback (which may post more, or continue a receive with postRecvNext).
  void completeSend();
  void completeRecv();
  // Drops everything queued (abort).
  void clearQueues();

  std::deque<Request> sends_;
  std::deque<Request> recvs_;

 private:
  uint64_t sendsPosted_ = 0;
  uint64_t sendsDone_ = 0;
  uint64_t recvsPosted_ = 0;
  uint64_t recvsDone_ = 0;
};

}  // namespace ringdist
