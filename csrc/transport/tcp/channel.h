#pragma once

#include <deque>
#include <vector>

#include "csrc/transport/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {
namespace tcp {

// A Channel over one connected TCP socket (non-blocking). Queued sends are
// gathered into one sendmsg() of up to kMaxIov posts, so a small header and
// its payload leave in one syscall and one packet.
class TcpChannel final : public Channel {
 public:
  TcpChannel(int peer, Socket socket);
  ~TcpChannel() override;

  uint64_t postSend(const void* data, size_t bytes, Callback done) override;
  uint64_t postRecv(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvNext(void* data, size_t bytes, Callback done) override;
  uint64_t postRecvReduce(void* dst, const void* other, size_t bytes, size_t elementBytes,
                          Combine combine) override;

  bool sendDone(uint64_t ticket) const override { return sendsDone_ >= ticket; }
  bool recvDone(uint64_t ticket) const override { return recvsDone_ >= ticket; }
  bool hasPending() const override { return !sends_.empty() || !recvs_.empty(); }

  bool progress() override;
  int pollFd() const override;
  short pollEvents() const override;
  void close() override;

 private:
  struct Request {
    char* data;
    size_t bytes;
    size_t done;
    bool counted;  // false for postRecvNext continuations (no ticket)
    Callback callback;
    const char* other = nullptr;  // receive-reduce: combine with this
    size_t elementBytes = 0;
    Combine combine = nullptr;
  };

  // Receive-reduce reads into this staging buffer, then combines whole
  // elements into the destination; big enough to amortise the syscall.
  static constexpr size_t kStagingBytes = 256 * 1024;

  // Max posts gathered into one sendmsg()/readv(); bounded by the stack iovec.
  static constexpr int kMaxIov = 16;

  bool progressSends();
  bool progressRecvs();
  // Returns true if bytes moved; sets *complete when the request finished.
  bool progressRecvReduce(Request& r, bool* complete);
  [[noreturn]] void fail(const char* what, int err);

  Socket socket_;
  std::deque<Request> sends_;
  std::deque<Request> recvs_;
  uint64_t sendsPosted_ = 0;
  uint64_t sendsDone_ = 0;
  uint64_t recvsPosted_ = 0;
  uint64_t recvsDone_ = 0;
  std::vector<char> staging_;
  size_t stagedBytes_ = 0;  // a partial element carried to the next read
};

}  // namespace tcp
}  // namespace ringdist
