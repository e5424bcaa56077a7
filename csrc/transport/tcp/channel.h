#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "csrc/transport/queued_channel.h"
#include "csrc/transport/tcp/records.h"
#include "csrc/transport/tcp/socket.h"
#include "csrc/transport/tcp/tuning.h"

namespace ringdist {
namespace tcp {

// A Channel over one connected TCP socket (non-blocking). Queued sends are
// gathered into one sendmsg() of up to kMaxIov posts, so a small header and
// its payload leave in one syscall and one packet. With session keys every
// byte travels in sealed records (records.h): the same gathering seals a
// header and its payload into one record.
class TcpChannel final : public QueuedChannel {
 public:
  // keys: null for a plaintext link (RINGDIST_TCP_ENCRYPT=0).
  TcpChannel(int peer, Socket socket, const LinkOptions& link, const SocketTuning& tuning,
             const SessionKeys* keys);
  ~TcpChannel() override;

  bool progress() override;
  bool peek(void* dst, size_t bytes) override;
  int incomingFd() const override { return socket_.fd(); }
  int pollFd() const override;
  short pollEvents() const override;
  size_t unacknowledgedBytes() const override;
  SendTotals sendTotals() const override;
  int64_t quietMs() const override;
  bool capSendRate(uint64_t bytesPerSecond) override;
  bool bufferedInput() const override { return reader_ != nullptr && reader_->buffered(); }
  uint32_t roundTripUs() const override { return minRoundTripUs(socket_.fd()); }
  void close() override;
  std::map<std::string, std::string> details() const override { return details_; }
  bool keepable() const override { return writer_ != nullptr && socket_.valid(); }
  void renumber(int peer) override;

  // A link kept for a shrunk group (keepable()): both ends stop where the aborted group left
  // the stream, drop what it queued, write the records already sealed (the reader counts
  // them), then a fence carrying `digest`, and read and drop the peer's bytes up to its
  // fence. After both fences the link is the shrunk group's, its congestion window and round
  // trip estimate intact (a fresh connection across a WAN starts slow: seconds of slow
  // start for a round's bytes). beginFence, then progressFence until it returns true, polling
  // fenceEvents() on incomingFd(); progressFence throws if the peer closed or fenced for another
  // group.
  void beginFence(const uint8_t* digest);
  bool progressFence();
  short fenceEvents() const;

 private:
  // Receive-reduce reads into this staging buffer, then combines whole
  // elements into the destination; big enough to amortise the syscall.
  static constexpr size_t kStagingBytes = 256 * 1024;

  // Max posts gathered into one sendmsg()/readv(); bounded by the stack iovec.
  static constexpr int kMaxIov = 16;

  bool progressSends();
  bool progressRecvs();
  // Returns true if bytes moved; sets *complete when the request finished.
  bool progressRecvReduce(Request& r, bool* complete);
  // Result n of recv()/readv(): true if bytes arrived (counted), false if
  // none are there yet; throws if the peer is gone or the read failed.
  bool received(ssize_t n);
  // The socket's sendmsg/readv, through the records when sealed.
  ssize_t sendSome(const iovec* iov, int count);
  ssize_t readSome(const iovec* iov, int count);
  [[noreturn]] void fail(const char* what, int err);
  // "rank <peer> (<address>)", as the reader names the sender in its errors.
  std::string peerName() const;
  // Closes the socket under socketMutex_ (the any-thread calls read its descriptor).
  void closeSocket();

  Socket socket_;
  // Held where the socket closes and by the any-thread calls, which must not use its
  // descriptor once closed (the number may already name another file).
  mutable std::mutex socketMutex_;
  std::map<std::string, std::string> details_;  // as the socket reported it when connected
  std::unique_ptr<RecordWriter> writer_;  // both null on a plaintext link
  std::unique_ptr<RecordReader> reader_;
  // A fence (beginFence): its digest, and how far it got.
  uint8_t fenceDigest_[kFenceBytes] = {};
  bool fenceSealed_ = false;
  bool fenceWritten_ = false;
  bool fenceRead_ = false;
  std::vector<char> staging_;
  size_t stagedBytes_ = 0;  // a partial element carried to the next read
};

}  // namespace tcp
}  // namespace ringdist
