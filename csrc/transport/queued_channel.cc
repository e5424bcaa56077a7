#include "csrc/transport/queued_channel.h"

namespace ringdist {

uint64_t QueuedChannel::postSend(const void* data, size_t bytes, Callback done) {
  sends_.push_back(Request{const_cast<char*>(static_cast<const char*>(data)), bytes, 0, true,
                           std::move(done)});
  return ++sendsPosted_;
}

uint64_t QueuedChannel::postRecv(void* data, size_t bytes, Callback done) {
  recvs_.push_back(Request{static_cast<char*>(data), bytes, 0, true, std::move(done)});
  return ++recvsPosted_;
}

uint64_t QueuedChannel::postRecvNext(void* data, size_t bytes, Callback done) {
  recvs_.push_front(Request{static_cast<char*>(data), bytes, 0, false, std::move(done)});
  return 0;
}

uint64_t QueuedChannel::postRecvReduce(void* dst, const void* other, size_t bytes,
                                       size_t elementBytes, Combine combine) {
  Request r{static_cast<char*>(dst), bytes, 0, true, nullptr};
  r.other = static_cast<const char*>(other);
  r.elementBytes = elementBytes;
  r.combine = combine;
  recvs_.push_back(r);
  return ++recvsPosted_;
}

void QueuedChannel::completeSend() {
  Callback callback = std::move(sends_.front().callback);
  sends_.pop_front();
  ++sendsDone_;
  if (callback) {
    callback();
  }
}

void QueuedChannel::completeRecv() {
  Callback callback = std::move(recvs_.front().callback);
  bool counted = recvs_.front().counted;
  recvs_.pop_front();
  if (counted) {
    ++recvsDone_;
  }
  if (callback) {
    callback();
  }
}

void QueuedChannel::clearQueues() {
  sends_.clear();
  recvs_.clear();
}

}  // namespace ringdist
