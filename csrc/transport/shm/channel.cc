#include "csrc/transport/shm/channel.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <thread>

#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/common/logging.h"

namespace ringdist {
namespace shm {

namespace {
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Copies n bytes into/out of a ring at logical position pos (wrapping).
void copyIn(char* ring, uint64_t size, uint64_t pos, const char* src, size_t n) {
  size_t at = static_cast<size_t>(pos % size);
  size_t first = std::min(n, static_cast<size_t>(size) - at);
  copyBytes(ring + at, src, first);
  copyBytes(ring, src + first, n - first);
}

void copyOut(char* dst, const char* ring, uint64_t size, uint64_t pos, size_t n) {
  size_t at = static_cast<size_t>(pos % size);
  size_t first = std::min(n, static_cast<size_t>(size) - at);
  copyBytes(dst, ring + at, first);
  copyBytes(dst + first, ring, n - first);
}
}  // namespace

uint32_t LocalDoorbell::arm() {
  uint32_t seq = bell_->seq.load(std::memory_order_acquire);
  bell_->sleeping.store(1, std::memory_order_seq_cst);
  // Before the caller's last look: a wakeIfSleeping() that missed `sleeping`
  // wrote before it, so that look sees what it wrote.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return seq;
}

void LocalDoorbell::sleep(uint32_t armed, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>((timeout.count() % 1000000) * 1000)};
  futex(&bell_->seq, FUTEX_WAIT, armed, &ts);  // returns at once if seq moved
}

void LocalDoorbell::disarm() { bell_->sleeping.store(0, std::memory_order_relaxed); }

void LocalDoorbell::ring() { shm::ring(bell_); }

void ring(Bell* bell) {
  bell->seq.fetch_add(1, std::memory_order_seq_cst);
  if (bell->sleeping.load(std::memory_order_seq_cst) != 0) {
    futex(&bell->seq, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void wakeIfSleeping(Bell* bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // our writes before the look (arm())
  if (bell->sleeping.load(std::memory_order_relaxed) != 0) {
    ring(bell);
  }
}

ShmChannel::ShmChannel(int peer, std::shared_ptr<Segment> segment, int localSelf, int localPeer,
                       std::shared_ptr<LocalDoorbell> doorbell, const LinkOptions& link,
                       bool singleCopy)
    : QueuedChannel(peer, link),
      segment_(std::move(segment)),
      out_(segment_->control(localSelf, localPeer)),
      in_(segment_->control(localPeer, localSelf)),
      outData_(segment_->data(localSelf, localPeer)),
      inData_(segment_->data(localPeer, localSelf)),
      ringBytes_(segment_->ringBytes()),
      peerBell_(segment_->bell(localPeer)),
      doorbell_(std::move(doorbell)),
      singleCopy_(singleCopy),
      writeDelay_(link.writeDelay) {}

ShmChannel::~ShmChannel() = default;

size_t ShmChannel::reduceFromRing(Request& r, uint64_t tail, size_t n) {
  const size_t elem = r.elementBytes;
  size_t consumed = 0;
  while (n - consumed >= elem) {
    size_t at = static_cast<size_t>((tail + consumed) % ringBytes_);
    size_t run = std::min(n - consumed, static_cast<size_t>(ringBytes_) - at) / elem * elem;
    size_t offset = r.done + consumed;
    if (run > 0) {
      absorb(r, inData_ + at, run);
      combineArrived(r, offset, inData_ + at, run / elem);
      consumed += run;
    } else {
      // One element straddles the end of the ring: assemble it aside.
      alignas(16) char element[16];
      copyOut(element, inData_, ringBytes_, tail + consumed, elem);
      absorb(r, element, elem);
      combineArrived(r, offset, element, 1);
      consumed += elem;
    }
  }
  return consumed;
}

void ShmChannel::failClosed() const {
  RINGDIST_FAIL("shared-memory link to rank ", peer_, " was closed by the peer");
}

void ShmChannel::failIfGone() const {
  const int error = errno;
  if (in_->closed.load(std::memory_order_acquire) != 0 ||
      out_->closed.load(std::memory_order_acquire) != 0) {
    failClosed();
  }
  checkAlive();
  if (error == ESRCH) {  // exiting: its memory is gone before /proc shows it dead
    RINGDIST_FAIL("rank ", peer_, " (pid ", peerBell_->pid, ", same host) exited");
  }
}

bool ShmChannel::peerDead() const {
  const pid_t pid = peerBell_->pid;
  return pid > 0 && processStartTime(pid) != peerBell_->startTime;
}

void ShmChannel::checkAlive() const {
  if (peerDead()) {
    RINGDIST_FAIL("rank ", peer_, " (pid ", peerBell_->pid, ", same host) died");
  }
}

void ShmChannel::checkOpen() const {
  if (in_->closed.load(std::memory_order_acquire) != 0) {
    failClosed();
  }
}

bool ShmChannel::progressSends() {
  bool moved = false;
  while (!sends_.empty()) {
    Request& r = sends_.front();
    if (r.done < r.bytes) {
      uint64_t head = out_->head.load(std::memory_order_relaxed);
      uint64_t tail = out_->tail.load(std::memory_order_acquire);
      size_t n = std::min(static_cast<size_t>(ringBytes_ - (head - tail)), r.bytes - r.done);
      if (n == 0) {
        break;  // ring full: the reader frees space and rings us
      }
      copyIn(outData_, ringBytes_, head, r.data + r.done, n);
      out_->head.store(head + n, std::memory_order_release);
      r.done += n;
      moved = true;
      if (r.done < r.bytes) {
        break;
      }
    }
    completeSend();
  }
  return moved;
}

bool ShmChannel::progressRecvs() {
  bool moved = false;
  while (!recvs_.empty()) {
    Request& r = recvs_.front();
    if (r.done < r.bytes) {
      uint64_t tail = in_->tail.load(std::memory_order_relaxed);
      uint64_t head = in_->head.load(std::memory_order_acquire);
      size_t n = std::min(static_cast<size_t>(head - tail), r.bytes - r.done);
      if (n == 0) {
        if (in_->closed.load(std::memory_order_acquire) != 0) {
          failClosed();
        }
        break;
      }
      if (r.combine != nullptr) {
        n = reduceFromRing(r, tail, n);
        if (n == 0) {
          break;  // less than one element so far
        }
      } else {
        copyOut(r.data + r.done, inData_, ringBytes_, tail, n);
      }
      in_->tail.store(tail + n, std::memory_order_release);
      r.done += n;
      moved = true;
      if (r.done < r.bytes) {
        break;
      }
    }
    completeRecv();
  }
  return moved;
}

bool ShmChannel::peek(void* dst, size_t bytes) {
  if (receiving()) {
    return false;
  }
  uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  uint64_t head = in_->head.load(std::memory_order_acquire);
  if (head - tail < bytes) {
    return false;
  }
  copyOut(static_cast<char*>(dst), inData_, ringBytes_, tail, bytes);
  return true;
}

bool ShmChannel::progress() {
  if (closed_) {
    RINGDIST_CHECK(!hasPending(), "shared-memory link to rank ", peer_, " is closed");
    return false;
  }
  if (out_->closed.load(std::memory_order_acquire) != 0 && !sends_.empty()) {
    failClosed();
  }
  uint64_t sentBefore = out_->head.load(std::memory_order_relaxed);
  uint64_t readBefore = in_->tail.load(std::memory_order_relaxed);
  bool moved = progressSends();
  moved = progressRecvs() || moved;
  if (moved) {
    bytesSent_ += out_->head.load(std::memory_order_relaxed) - sentBefore;
    bytesReceived_ += in_->tail.load(std::memory_order_relaxed) - readBefore;
    ring(peerBell_);  // new data for it, or space it may be waiting for
  }
  return moved;
}

void ShmChannel::readPeerMemory(uint64_t from, void* dst, size_t bytes) {
  RINGDIST_CHECK(singleCopy_ && !closed_, "ringdist: no single-copy reads from rank ", peer_);
  char* to = static_cast<char*>(dst);
  for (size_t done = 0; done < bytes;) {
    iovec local{to + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(from + done), bytes - done};
    ssize_t n = ::process_vm_readv(peerBell_->pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      failIfGone();
      RINGDIST_FAIL("reading rank ", peer_, "'s buffer (", bytes, " bytes at 0x", std::hex, from,
                    std::dec, ") failed: ", n < 0 ? std::strerror(errno) : "nothing read");
    }
    done += static_cast<size_t>(n);
  }
  // A peer that aborted closed the link before its op returned and its
  // buffer could be reused. (One killed mid-read cannot reuse it: the read
  // holds its memory until done.)
  if (in_->closed.load(std::memory_order_acquire) != 0 ||
      out_->closed.load(std::memory_order_acquire) != 0) {
    failClosed();
  }
  bytesReceived_ += bytes;
}

void ShmChannel::writePeerMemory(uint64_t to, const void* src, size_t bytes) {
  RINGDIST_CHECK(singleCopy_ && !closed_, "ringdist: no single-copy writes to rank ", peer_);
  // Flag first, then look at closed: the peer closes first, then looks at
  // the flag (both seq_cst), so either it waits for this write or this
  // write sees it closed and never starts.
  out_->writing.store(1, std::memory_order_seq_cst);
  if (in_->closed.load(std::memory_order_seq_cst) != 0 ||
      out_->closed.load(std::memory_order_seq_cst) != 0) {
    out_->writing.store(0, std::memory_order_release);
    failClosed();
  }
  if (writeDelay_.count() > 0) {
    std::this_thread::sleep_for(writeDelay_);
  }
  const char* from = static_cast<const char*>(src);
  for (size_t done = 0; done < bytes;) {
    iovec local{const_cast<char*>(from + done), bytes - done};
    iovec remote{reinterpret_cast<void*>(to + done), bytes - done};
    ssize_t n = ::process_vm_writev(peerBell_->pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      out_->writing.store(0, std::memory_order_release);
      failIfGone();
      RINGDIST_FAIL("writing rank ", peer_, "'s buffer (", bytes, " bytes at 0x", std::hex, to,
                    std::dec, ") failed: ", n < 0 ? std::strerror(errno) : "nothing written");
    }
    done += static_cast<size_t>(n);
  }
  out_->writing.store(0, std::memory_order_release);
  bytesSent_ += bytes;
}

void ShmChannel::close() {
  if (closed_) {
    return;
  }
  closed_ = true;
  // Both directions: the peer's pending sends and receives fail at once.
  out_->closed.store(1, std::memory_order_seq_cst);
  in_->closed.store(1, std::memory_order_seq_cst);
  ring(peerBell_);
  clearQueues();
  // A write of the peer's into our memory that began before it could see
  // the close ends within one piece (kSingleCopyPieceBytes); wait for it,
  // so our caller may free the buffer it lent.
  const auto until = std::chrono::steady_clock::now() + kWriteDrainLimit;
  while (in_->writing.load(std::memory_order_seq_cst) != 0 && !peerDead()) {
    if (std::chrono::steady_clock::now() > until) {
      logWarning(strCat("ringdist: rank ", peer_, " still writes into this process's memory ",
                        kWriteDrainLimit.count(), " ms after the link closed"));
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace shm
}  // namespace ringdist
