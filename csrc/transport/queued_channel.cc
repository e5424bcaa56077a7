#include "csrc/transport/queued_channel.h"

#include <algorithm>
#include <atomic>

#include "csrc/common/error.h"

namespace ringdist {

namespace {
// Testing (LinkOptions::corruptSendAt = k): this process's k-th checksummed
// send carries a wrong checksum, as if a byte had flipped in flight.
bool corruptThisSend(uint64_t target) {
  static std::atomic<uint64_t> count{0};
  return target > 0 && ++count == target;
}
}  // namespace

void QueuedChannel::pushSendTrailer(const void* data, size_t bytes) {
  Request t{nullptr, sizeof(uint32_t), 0, true, nullptr};
  t.trailer = true;
  t.checksum = crc32c(data, bytes) ^ (corruptThisSend(corruptSendAt_) ? 1u : 0u);
  sends_.push_back(t);
  sends_.back().data = reinterpret_cast<char*>(&sends_.back().checksum);
}

void QueuedChannel::pushRecvTrailer(Callback done, bool counted, bool front) {
  Request t{nullptr, sizeof(uint32_t), 0, counted, std::move(done)};
  t.trailer = true;
  if (front) {
    recvs_.push_front(t);
    recvs_.front().data = reinterpret_cast<char*>(&recvs_.front().checksum);
  } else {
    recvs_.push_back(t);
    recvs_.back().data = reinterpret_cast<char*>(&recvs_.back().checksum);
  }
}

uint64_t QueuedChannel::postSend(const void* data, size_t bytes, Callback done) {
  if (!checksums_) {
    sends_.push_back(Request{const_cast<char*>(static_cast<const char*>(data)), bytes, 0, true,
                             std::move(done)});
    return ++sendsPosted_;
  }
  // The ticket and callback belong to the trailer: done means all bytes left.
  sends_.push_back(Request{const_cast<char*>(static_cast<const char*>(data)), bytes, 0, false,
                           nullptr});
  pushSendTrailer(data, bytes);
  sends_.back().callback = std::move(done);
  return ++sendsPosted_;
}

uint64_t QueuedChannel::postRecv(void* data, size_t bytes, Callback done) {
  recvs_.push_back(Request{static_cast<char*>(data), bytes, 0, !checksums_,
                           checksums_ ? nullptr : std::move(done)});
  if (checksums_) {
    pushRecvTrailer(std::move(done), true, false);
  }
  return ++recvsPosted_;
}

uint64_t QueuedChannel::postRecvNext(void* data, size_t bytes, Callback done) {
  if (checksums_) {
    pushRecvTrailer(std::move(done), false, true);  // in front, then its payload before it
    done = nullptr;
  }
  recvs_.push_front(Request{static_cast<char*>(data), bytes, 0, false, std::move(done)});
  return 0;
}

uint64_t QueuedChannel::postRecvReduce(void* dst, const void* other, size_t bytes,
                                       size_t elementBytes, Combine combine, bool incomingFirst) {
  Request r{static_cast<char*>(dst), bytes, 0, !checksums_, nullptr};
  r.other = static_cast<const char*>(other);
  r.elementBytes = elementBytes;
  r.combine = combine;
  r.incomingFirst = incomingFirst;
  recvs_.push_back(r);
  if (checksums_) {
    pushRecvTrailer(nullptr, true, false);
  }
  return ++recvsPosted_;
}

void QueuedChannel::completeSend() {
  Callback callback = std::move(sends_.front().callback);
  bool counted = sends_.front().counted;
  sends_.pop_front();
  if (counted) {
    ++sendsDone_;
  }
  if (callback) {
    callback();
  }
}

void QueuedChannel::completeRecv() {
  Request& r = recvs_.front();
  if (r.trailer) {
    RINGDIST_CHECK(r.checksum == r.expected, "checksum mismatch on data received from rank ",
                   peer_, " (link ", peer_, " -> this rank): the payload was corrupted in flight");
  } else if (checksums_) {
    // Plain payloads are checked where they landed; receive-and-reduce
    // payloads were absorbed on arrival. The trailer follows right behind.
    uint32_t crc = r.combine != nullptr ? r.checksum : crc32c(r.data, r.bytes);
    recvs_[1].expected = crc;
  }
  Callback callback = std::move(r.callback);
  bool counted = r.counted;
  recvs_.pop_front();
  if (counted) {
    ++recvsDone_;
  }
  if (callback) {
    callback();
  }
}

bool QueuedChannel::credit(std::deque<Request>& queue, size_t bytes, int posts) {
  for (int i = 0; i < posts; ++i) {
    Request& r = queue.front();
    size_t take = std::min(bytes, r.bytes - r.done);
    r.done += take;
    bytes -= take;
    if (r.done < r.bytes) {
      return false;
    }
    if (&queue == &sends_) {
      completeSend();
    } else {
      completeRecv();
    }
  }
  return true;
}

void QueuedChannel::clearQueues() {
  sends_.clear();
  recvs_.clear();
}

void QueuedChannel::dropQueued() {
  clearQueues();
  sendsDone_ = sendsPosted_;
  recvsDone_ = recvsPosted_;
}

}  // namespace ringdist
