#pragma once

#include <memory>

#include "csrc/transport/queued_channel.h"
#include "csrc/transport/shm/segment.h"

namespace ringdist {
namespace shm {

// This process's doorbell in the host segment. Peers ring it after they
// wrote bytes for us or freed ring space we wait for.
class LocalDoorbell final : public Doorbell {
 public:
  LocalDoorbell(Bell* bell, int hostCores) : bell_(bell), hostCores_(hostCores) {}
  uint32_t arm() override;
  void sleep(uint32_t armed, std::chrono::microseconds timeout) override;
  void disarm() override;
  void ring() override;
  void publishCpu(int cpu) override {
    if (bell_->cpu.load(std::memory_order_relaxed) != cpu) {  // a write only when it moved
      bell_->cpu.store(cpu, std::memory_order_relaxed);
    }
  }
  int hostCores() const override { return hostCores_; }

 private:
  Bell* bell_;
  const int hostCores_;
};

// Rings a peer's doorbell: bump its sequence; a futex wake only when it
// may be sleeping, so the busy path costs no syscall.
void ring(Bell* bell);
// ring() only if the owner may be sleeping: no write to its line while it
// spins (Board::wake).
void wakeIfSleeping(Bell* bell);

// How long closing a link waits for the peer's write into our memory (a few
// hundred microseconds at most while the peer runs; a stopped peer is given up).
constexpr auto kWriteDrainLimit = std::chrono::milliseconds(2000);

// A Channel over two single-producer single-consumer byte rings in the host
// segment (one per direction). A send copies from the user buffer into the
// ring, the receive copies out of it; both sides work concurrently, with no
// system call on the busy path.
class ShmChannel final : public QueuedChannel {
 public:
  ShmChannel(int peer, std::shared_ptr<Segment> segment, int localSelf, int localPeer,
             std::shared_ptr<LocalDoorbell> doorbell, const LinkOptions& link, bool singleCopy);
  ~ShmChannel() override;

  bool progress() override;
  bool peek(void* dst, size_t bytes) override;
  int pollFd() const override { return -1; }
  short pollEvents() const override { return 0; }
  Doorbell* doorbell() const override { return doorbell_.get(); }
  int peerCpu() const override { return peerBell_->cpu.load(std::memory_order_relaxed); }
  void checkAlive() const override;
  void checkOpen() const override;
  bool peerDead() const override;
  bool copiesPeerMemory() const override { return singleCopy_; }
  void readPeerMemory(uint64_t from, void* dst, size_t bytes) override;
  void writePeerMemory(uint64_t to, const void* src, size_t bytes) override;
  void close() override;

 private:
  // Consumes up to n available bytes of a receive-reduce, reducing straight
  // out of the ring; returns bytes consumed.
  size_t reduceFromRing(Request& r, uint64_t tail, size_t n);

  bool progressSends();
  bool progressRecvs();
  [[noreturn]] void failClosed() const;
  // After a failed single copy (errno set by it): the link closed, the peer
  // dead or exiting each fail with their own message; returns otherwise.
  void failIfGone() const;

  std::shared_ptr<Segment> segment_;
  RingControl* out_;
  RingControl* in_;
  char* outData_;
  char* inData_;
  const uint64_t ringBytes_;
  Bell* peerBell_;
  std::shared_ptr<LocalDoorbell> doorbell_;
  const bool singleCopy_;
  const std::chrono::milliseconds writeDelay_;  // testing (LinkOptions::writeDelay)
  bool closed_ = false;
};

}  // namespace shm
}  // namespace ringdist
