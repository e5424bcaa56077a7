#pragma once

// Collectives among ranks that share one GPU, queued on the GPU with no host
// wait (stream_signals.h) and done by one kernel of the group's leader that
// reads every rank's input and writes every rank's output (fused.h) through
// mappings of the callers' own tensors (peer_memory.h): 2·P·S bytes move on
// the device for an allreduce and nothing crosses the host but one small
// exchange of records per call. Ranks on several GPUs of one host that reach
// each other's memory (peer access) run the same way split: each rank's kernel
// does its share (its chunk, its block), reading and writing the others'
// memory over the GPUs' links.
//
// Written against SameGpuPlatform (same_gpu_platform.h), so the same code
// runs the GPU (CUDA IPC, stream memory operations: csrc/gpu/cuda/same_gpu.cu)
// and, in tests, host memory with a thread per stream
// (csrc/backend/testing_same_gpu.cc).

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
#include <vector>

#include "csrc/collectives/communicator.h"
#include "csrc/gpu/platform/peer_memory.h"
#include "csrc/gpu/platform/same_gpu_platform.h"
#include "csrc/gpu/platform/stream_signals.h"

namespace ringdist {

class SameGpu {
 public:
  explicit SameGpu(std::unique_ptr<SameGpuPlatform> platform);
  ~SameGpu();
  SameGpu(const SameGpu&) = delete;
  SameGpu& operator=(const SameGpu&) = delete;

  // Collective, once per group, at the same operation on every rank: whether
  // every rank is on this GPU, or on GPUs that reach each other (at most
  // kMaxFusedRanks ranks), and the hand-offs can be set up. Says why once if they cannot. Later calls return
  // the first answer.
  bool setUp(Communicator& comm);
  bool ready() const { return state_ == State::kReady; }

  // Each queues its collective on `queue` and returns without waiting for the
  // device; results are bit for bit the host path's. `count` is per rank for
  // reduceScatter (output elements) and allgather (input elements). Throws
  // Error once the group's hand-offs were aborted.
  void allreduce(Communicator& comm, SignalQueue& queue, void* data, size_t count, DataType dtype,
                 ReduceOp op);
  void reduceScatter(Communicator& comm, SignalQueue& queue, const void* input, void* output,
                     size_t count, DataType dtype, ReduceOp op);
  void allgather(Communicator& comm, SignalQueue& queue, const void* input, void* output,
                 size_t count, DataType dtype);
  void broadcast(Communicator& comm, SignalQueue& queue, void* data, size_t count, DataType dtype,
                 int root);
  // The root's data becomes the reduction; the others' stays as it was.
  void reduce(Communicator& comm, SignalQueue& queue, void* data, size_t count, DataType dtype,
              ReduceOp op, int root);
  // sendCounts[r] elements of input (rank after rank) go to rank r, whose
  // output receives recvCounts[s] from each rank s, rank after rank. Input
  // and output may overlap: the input is then read from a copy.
  void alltoall(Communicator& comm, SignalQueue& queue, const void* input,
                const std::vector<uint64_t>& sendCounts, void* output,
                const std::vector<uint64_t>& recvCounts, DataType dtype);

  // Point-to-point between two ranks of the group (any of them, leader or
  // not), with no host wait either: the receiver's stream copies straight
  // from the sender's memory. send() lends `data` (false, with the reason,
  // when it cannot be lent: the caller then sends a copy in lendable memory),
  // queues on `post` the message's "in place" signal (the data must be in
  // place on that queue) and on `done` the wait for the receiver's copy,
  // after which the sender may reuse its memory; it fills `message` for the
  // receiver. receive() checks the message against the receive (size and
  // type; a mismatch fails the group's hand-offs and throws), maps the
  // sender's memory (cached) and queues the wait, the copy into `data` and
  // the taken signal on `queue`, one queue per source. Both are bounded by
  // `deadline` (the watch), and throw once the hand-offs were aborted.
  bool send(SignalQueue& post, SignalQueue& done, const void* data, size_t bytes, DataType dtype,
            int peer, std::chrono::steady_clock::time_point deadline, DeviceMessage* message,
            std::string* why);
  void receive(SignalQueue& queue, const DeviceMessage& message, int source, void* data,
               size_t bytes, DataType dtype, std::chrono::steady_clock::time_point deadline);
  // Whether message `index` from `source` to `receiver` was taken.
  bool delivered(int source, int receiver, uint32_t index) const {
    return signals_->delivered(source, receiver, index);
  }

  uint64_t opens() const { return cache_ ? cache_->opens() : 0; }
  uint64_t messageOpens() const { return messageCache_ ? messageCache_->opens() : 0; }
  size_t cached() const { return cache_ ? cache_->size() : 0; }
  uint32_t lastSeq() const { return signals_ ? signals_->lastSeq() : 0; }

 private:
  enum class State { kNew, kReady, kUnusable };
  // One call: what it reads and writes on this rank, and how the leader's
  // kernel covers it.
  struct Call {
    OpHeader header;
    const void* input;
    size_t inputBytes;
    void* output;  // may be input
    size_t outputBytes;
    DataType kernelType;  // what the kernel combines as (bytes for copies)
    ReduceOp op;
    int divisor;
    std::vector<FusedSpan> spans;
    // Alltoall: the counts each pair of ranks must agree on (elements); the
    // spans come from every rank's sends once they are exchanged.
    const std::vector<uint64_t>* sendCounts = nullptr;
    const std::vector<uint64_t>* recvCounts = nullptr;
    bool copyInput = false;  // read the input from a copy (it overlaps the output)
  };
  void run(Communicator& comm, SignalQueue& queue, const Call& call);
  void checkUsable(const char* op) const;

  // Fails the group if a device part misses its deadline: a thread that
  // sleeps until the earliest deadline of what is still on the device (no
  // polling while everything finishes in time). An entry is an operation
  // (seq), or a message (seq = its index, from -> to), finished by its own
  // signal: messages finish in any order.
  class Watch {
   public:
    Watch(StreamSignals& signals, int rank);
    ~Watch();
    void add(uint32_t seq, std::chrono::steady_clock::time_point deadline, int from = -1,
             int to = -1);
    // Whether everything added has finished.
    bool idle();

   private:
    struct Entry {
      uint32_t seq;
      int from;  // -1: an operation
      int to;
      std::chrono::steady_clock::time_point deadline;
    };
    bool finished(const Entry& entry) const;
    void dropFinished();
    void loop();
    StreamSignals& signals_;
    const int rank_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<Entry> pending_;
    bool stop_ = false;
    std::thread thread_;
  };

  std::unique_ptr<SameGpuPlatform> platform_;
  State state_ = State::kNew;
  SharedPage page_;
  bool attached_ = false;
  std::unique_ptr<StreamSignals> signals_;
  std::unique_ptr<PeerMemoryCache> cache_;  // the leader's
  // Senders' memory this rank received messages from, and its receives in
  // flight in issue order (source, index): a mapping's last use is a receive
  // number, over once every receive up to it was taken.
  std::unique_ptr<PeerMemoryCache> messageCache_;
  std::deque<std::pair<int, uint32_t>> receiving_;
  uint32_t receives_ = 0;  // receives queued
  uint32_t receivesDone_ = 0;  // the first receivesDone_ of them were taken
  std::unique_ptr<Watch> watch_;
};

}  // namespace ringdist
