#pragma once

// Allreduce among ranks that share one GPU, queued on the GPU with no host
// wait (stream_signals.h) and done by one kernel of the group's leader that
// reads every rank's tensor and writes every rank's result
// (fused_allreduce.h) through mappings of the callers' own tensors
// (peer_memory.h). 2·P·S bytes move on the device and nothing crosses the
// host but one small exchange of records per call.
//
// Written against SameGpuPlatform, so the same code runs the GPU (CUDA IPC,
// stream memory operations, csrc/cuda/same_gpu.cu) and, in tests, host
// memory with a thread per stream (csrc/backend/testing_same_gpu.cc).

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "csrc/collectives/communicator.h"
#include "csrc/collectives/peer_memory.h"
#include "csrc/collectives/stream_signals.h"

namespace ringdist {

class SameGpuPlatform : public PeerMemoryOpener {
 public:
  // Names the `bytes` at `data` for the leader; false, with the reason, when
  // the memory cannot be lent (memory from expandable segments has no IPC
  // handle), and the call then takes the staged path on every rank.
  virtual bool lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) = 0;
  // Makes the signal page reachable from this rank's queue.
  virtual void attach(SharedPage& page) = 0;
  virtual void detach(SharedPage& page) noexcept = 0;
  // 16 bytes naming the device (the GPU's UUID): the ranks go this way only if
  // they all name the same one.
  virtual std::array<uint8_t, 16> deviceId() = 0;
};

class SameGpuAllreduce {
 public:
  explicit SameGpuAllreduce(std::unique_ptr<SameGpuPlatform> platform);
  ~SameGpuAllreduce();

  // Queues the allreduce of `count` elements at `data` on `queue` and
  // returns true without waiting for the device; or returns false, having
  // queued nothing, when the call cannot go this way (every rank decides the
  // same: ranks on different GPUs, more than kMaxFusedRanks of them, memory
  // that cannot be lent, result checks on). Results are bit for bit the host
  // path's. Throws Error once the group's hand-offs were aborted.
  bool run(Communicator& comm, SignalQueue& queue, void* data, size_t count, DataType dtype,
           ReduceOp op);

  uint64_t opens() const { return cache_ ? cache_->opens() : 0; }
  size_t cached() const { return cache_ ? cache_->size() : 0; }
  uint32_t lastSeq() const { return signals_ ? signals_->lastSeq() : 0; }

 private:
  enum class State { kNew, kReady, kUnusable };
  void setUp(Communicator& comm);
  void unusable(Communicator& comm, const std::string& why);

  // Fails the group if an operation's device part misses its deadline: a
  // thread that sleeps until the earliest deadline of the operations still
  // on the device (no polling while they finish in time).
  class Watch {
   public:
    Watch(StreamSignals& signals, int rank);
    ~Watch();
    void add(uint32_t seq, std::chrono::steady_clock::time_point deadline);

   private:
    void loop();
    StreamSignals& signals_;
    const int rank_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::pair<uint32_t, std::chrono::steady_clock::time_point>> pending_;
    bool stop_ = false;
    std::thread thread_;
  };

  std::unique_ptr<SameGpuPlatform> platform_;
  State state_ = State::kNew;
  SharedPage page_;
  bool attached_ = false;
  std::unique_ptr<StreamSignals> signals_;
  std::unique_ptr<PeerMemoryCache> cache_;  // the leader's
  std::unique_ptr<Watch> watch_;
  bool warnedUnlent_ = false;
};

}  // namespace ringdist
