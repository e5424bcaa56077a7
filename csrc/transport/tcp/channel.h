#pragma once

#include <deque>

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
  };

  // Max posts gathered into one sendmsg()/readv(); bounded by the stack iovec.
  static constexpr int kMaxIov = 16;

  bool progressSends();
  bool progressRecvs();
  [[noreturn]] void fail(const char* what, int err);

  Socket socket_;
  std::deque<Request> sends_;
  std::deque<Request> recvs_;
  uint64_t sendsPosted_ = 0;
  uint64_t sendsDone_ = 0;
  uint64_t recvsPosted_ = 0;
  uint64_t recvsDone_ = 0;
};

}  // namespace tcp
}  // namespace ringdist
