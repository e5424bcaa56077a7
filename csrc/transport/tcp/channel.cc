#include "csrc/transport/tcp/channel.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "csrc/common/error.h"

namespace ringdist {
namespace tcp {

TcpChannel::TcpChannel(int peer, Socket socket, const LinkOptions& link,
                       const SocketTuning& tuning, const SessionKeys* keys)
    : QueuedChannel(peer, link), socket_(std::move(socket)) {
  setNonBlocking(socket_.fd());
  setNoDelay(socket_.fd());
  details_ = describeSocket(socket_.fd(), tuning);
  details_["cipher"] = keys != nullptr ? "aes-256-gcm" : "none";
  if (keys != nullptr) {
    writer_ = std::make_unique<RecordWriter>(keys->send);
    reader_ = std::make_unique<RecordReader>(keys->receive, peerName());
  }
}

std::string TcpChannel::peerName() const {
  return strCat("rank ", peer_, " (", peerAddress(socket_.fd()).toString(), ")");
}

ssize_t TcpChannel::sendSome(const iovec* iov, int count) {
  if (writer_ != nullptr) {
    return writer_->writev(socket_.fd(), iov, count);
  }
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  return ::sendmsg(socket_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t TcpChannel::readSome(const iovec* iov, int count) {
  if (reader_ != nullptr) {
    return reader_->readv(socket_.fd(), iov, count);
  }
  return ::readv(socket_.fd(), iov, count);
}

TcpChannel::~TcpChannel() = default;

bool TcpChannel::progressRecvReduce(Request& r, bool* complete) {
  if (staging_.empty()) {
    staging_.resize(kStagingBytes);
  }
  size_t room = std::min(kStagingBytes, r.bytes - r.done) - stagedBytes_;
  const iovec iov{staging_.data() + stagedBytes_, room};
  ssize_t n = readSome(&iov, 1);
  if (!received(n)) {
    return false;
  }
  absorb(r, staging_.data() + stagedBytes_, static_cast<size_t>(n));
  size_t have = stagedBytes_ + static_cast<size_t>(n);
  size_t whole = have / r.elementBytes * r.elementBytes;
  combineArrived(r, r.done, staging_.data(), whole / r.elementBytes);
  r.done += whole;
  stagedBytes_ = have - whole;
  if (stagedBytes_ > 0) {
    std::memmove(staging_.data(), staging_.data() + whole, stagedBytes_);
  }
  *complete = r.done == r.bytes;
  return true;
}

bool TcpChannel::received(ssize_t n) {
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      return false;
    }
    fail("recv", errno);
  }
  if (n == 0) {
    fail("recv", 0);
  }
  bytesReceived_ += static_cast<uint64_t>(n);
  return true;
}

void TcpChannel::closeSocket() {
  std::lock_guard<std::mutex> lock(socketMutex_);
  socket_.reset();
}

void TcpChannel::fail(const char* what, int err) {
  closeSocket();
  if (err == 0) {
    RINGDIST_FAIL("connection to rank ", peer_, " closed by the peer (", what, ")");
  }
  RINGDIST_FAIL("connection to rank ", peer_, " failed (", what, "): ", std::strerror(err));
}

bool TcpChannel::progressSends() {
  bool moved = false;
  while (!sends_.empty()) {
    iovec iov[kMaxIov];
    int count = 0;
    size_t wanted = 0;
    for (auto it = sends_.begin(); it != sends_.end() && count < kMaxIov; ++it, ++count) {
      iov[count].iov_base = it->data + it->done;
      iov[count].iov_len = it->bytes - it->done;
      wanted += iov[count].iov_len;
    }
    ssize_t n = 0;
    if (wanted > 0) {
      n = sendSome(iov, count);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          return moved;
        }
        fail("send", errno);
      }
      moved = true;
      bytesSent_ += static_cast<uint64_t>(n);
    }
    // Hand the written bytes to the batch's posts in order. Callbacks may
    // post more sends; those wait for the next batch.
    if (!credit(sends_, static_cast<size_t>(n), count)) {
      return moved;  // socket buffer full
    }
  }
  return moved;
}

bool TcpChannel::progressRecvs() {
  bool moved = false;
  while (!recvs_.empty()) {
    if (recvs_.front().combine != nullptr) {
      Request& r = recvs_.front();
      bool complete = r.done == r.bytes;
      if (!complete) {
        if (!progressRecvReduce(r, &complete)) {
          return moved;
        }
        moved = true;
      }
      if (!complete) {
        continue;
      }
      completeRecv();
      continue;
    }
    // Gather posts into one readv, stopping after a post with a callback: its
    // callback may insert a continuation that must be filled first.
    iovec iov[kMaxIov];
    int count = 0;
    for (auto it = recvs_.begin(); it != recvs_.end() && count < kMaxIov; ++it) {
      if (it->combine != nullptr) {
        break;  // goes through the staging buffer
      }
      iov[count].iov_base = it->data + it->done;
      iov[count].iov_len = it->bytes - it->done;
      ++count;
      if (it->callback) {
        break;
      }
    }
    size_t wanted = 0;
    for (int i = 0; i < count; ++i) {
      wanted += iov[i].iov_len;
    }
    ssize_t n = 0;
    if (wanted > 0) {
      n = readSome(iov, count);
      if (!received(n)) {
        return moved;
      }
      moved = true;
    }
    if (!credit(recvs_, static_cast<size_t>(n), count)) {
      return moved;  // socket drained
    }
  }
  return moved;
}

bool TcpChannel::progress() {
  if (!socket_.valid()) {
    RINGDIST_CHECK(!hasPending(), "connection to rank ", peer_, " is closed");
    return false;
  }
  bool moved = progressSends();
  moved = progressRecvs() || moved;
  return moved;
}

bool TcpChannel::peek(void* dst, size_t bytes) {
  if (receiving() || !socket_.valid()) {
    return false;
  }
  if (reader_ != nullptr) {
    return reader_->peek(socket_.fd(), dst, bytes);
  }
  // Nothing is staged between receives, so the socket's next bytes are the stream's.
  ssize_t n = ::recv(socket_.fd(), dst, bytes, MSG_PEEK | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(bytes);
}

int TcpChannel::pollFd() const { return hasPending() ? socket_.fd() : -1; }

size_t TcpChannel::unacknowledgedBytes() const {
  int queued = 0;
  if (socket_.fd() < 0 || ::ioctl(socket_.fd(), SIOCOUTQ, &queued) != 0 || queued < 0) {
    return 0;  // closed or unknown: nothing left to wait for (errors surface in progress())
  }
  return static_cast<size_t>(queued);
}

Channel::SendTotals TcpChannel::sendTotals() const {
  std::lock_guard<std::mutex> lock(socketMutex_);
  auto totals = sendTotalsOf(socket_.fd());
  totals.unacknowledged = unacknowledgedBytes();
  return totals;
}

int64_t TcpChannel::quietMs() const {
  std::lock_guard<std::mutex> lock(socketMutex_);
  return lastDataReceivedMs(socket_.fd());
}

bool TcpChannel::capSendRate(uint64_t bytesPerSecond) {
  std::lock_guard<std::mutex> lock(socketMutex_);
  // Without the fq qdisc TCP paces itself once a maximum pacing rate is set (Linux 4.13).
  uint64_t rate = bytesPerSecond == 0 ? ~uint64_t{0} : bytesPerSecond;
  return socket_.fd() >= 0 &&
         ::setsockopt(socket_.fd(), SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) == 0;
}

short TcpChannel::pollEvents() const {
  short events = POLLRDHUP;
  if (!recvs_.empty()) {
    events |= POLLIN;
  }
  if (!sends_.empty()) {
    events |= POLLOUT;
  }
  return events;
}

void TcpChannel::close() {
  closeSocket();
  clearQueues();
}

void TcpChannel::renumber(int peer) {
  QueuedChannel::renumber(peer);
  if (reader_ != nullptr) {
    reader_->rename(peerName());
  }
}

void TcpChannel::beginFence(const uint8_t* digest) {
  RINGDIST_CHECK(keepable(), "ringdist: the link to rank ", peer_, " cannot be fenced");
  dropQueued();
  stagedBytes_ = 0;
  writer_->dropSends();
  std::memcpy(fenceDigest_, digest, kFenceBytes);
  fenceSealed_ = fenceWritten_ = fenceRead_ = false;
}

bool TcpChannel::progressFence() {
  while (!fenceWritten_) {
    const int flushed = writer_->flush(socket_.fd());
    if (flushed < 0) fail("send (fence)", errno);
    if (flushed == 0) break;
    fenceWritten_ = fenceSealed_;
    if (!fenceSealed_) {
      writer_->sealFence(fenceDigest_);
      fenceSealed_ = true;
    }
  }
  if (!fenceRead_) fenceRead_ = reader_->skipToFence(socket_.fd(), fenceDigest_);
  return fenceWritten_ && fenceRead_;
}

short TcpChannel::fenceEvents() const {
  return static_cast<short>(POLLRDHUP | (fenceRead_ ? 0 : POLLIN) | (fenceWritten_ ? 0 : POLLOUT));
}

}  // namespace tcp
}  // namespace ringdist
