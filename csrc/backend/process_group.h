#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "csrc/backend/work.h"
#include "csrc/collectives/communicator.h"
#include "csrc/collectives/p2p.h"

namespace ringdist {

// The c10d::Backend registered as "ringdist". Calls validate their tensors
// at once (bad input raises in the caller), then queue the operation; one
// worker thread runs queued operations in issue order, which is the same on
// every rank, over the engine's Communicator.
class ProcessGroupRingdist : public c10d::Backend {
 public:
  ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& bindIp);
  ~ProcessGroupRingdist() override;

  const std::string getBackendName() const override { return "ringdist"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void shutdown() override;
  // Needed by TORCH_DISTRIBUTED_DEBUG=DETAIL (ProcessGroupWrapper): the
  // number of collectives issued, identical on every rank of a healthy group.
  void setSequenceNumberForGroup() override { sequenceNumber_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequenceNumber_; }
  void abort() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;

  // Tuning and introspection for tests and benchmarks.
  // Transport used to reach each rank ("tcp", "shm", "self").
  const std::vector<std::string>& transports() const { return transports_; }
  // Large allreduces on uniform multi-host groups: {ranks of our host, ranks
  // at our position on every host}, each in ring order; empty for one flat ring.
  std::vector<std::vector<int>> allreduceRings() const;
  size_t segmentBytes() const { return segmentBytes_; }
  void setSegmentBytes(size_t bytes);

  // Allreduce with a lossy wire codec ("fp16", "bf16", "int8"; see
  // csrc/codec/codec.h), summed in float32. One dense CPU tensor: float32, or
  // bfloat16/float16 (widened to float32 for the op). average: divide by the
  // world size (AVG) instead of SUM.
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(at::Tensor& tensor, const std::string& codec,
                                                     bool average,
                                                     std::chrono::milliseconds timeout);

  // Per-operation statistics, keyed by op name ("allreduce",
  // "compressed_allreduce/int8", ...): what the worker measured around each
  // operation it ran.
  struct OpStats {
    uint64_t calls = 0;
    uint64_t bytesSent = 0;      // wire bytes, headers included
    uint64_t bytesReceived = 0;
    uint64_t payloadBytes = 0;   // bytes of the operation's output tensors
    double seconds = 0;          // wall time of the operation on the worker
  };
  std::map<std::string, OpStats> stats() const;
  void resetStats();

 private:
  using Body = std::function<void()>;

  // A queued send or receive; `moved` is set by the transport callback and
  // the Work is completed by reapP2P() between operations, never inside the
  // progress loop (completion runs user callbacks).
  struct P2P {
    c10::intrusive_ptr<RingdistWork> work;
    at::Tensor user;
    at::Tensor flat;
    std::shared_ptr<bool> moved;
    std::shared_ptr<int> source;  // receives: the sender, once known
  };

  DataType checkTensors(const char* op, const std::vector<at::Tensor>& tensors);
  ReduceOp checkReduceOp(const char* op, const c10d::ReduceOp& reduceOp, DataType dtype);
  void checkRoot(const char* op, int64_t root);
  // peer -1 (receives only): from any source.
  c10::intrusive_ptr<c10d::Work> sendRecv(bool isSend, std::vector<at::Tensor>& tensors, int peer,
                                          int tag);
  void reapP2P();
  // Point-to-point progress outside any operation: an error aborts the group
  // and fails every pending transfer with it.
  void betweenOps(const std::function<void()>& step);
  // Looks for messages for receives from any source.
  void pollAnySource();

  // Queues `body` (run on the worker, over comm_) and returns its Work.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, OpType engineType,
                                         std::vector<at::Tensor> outputs,
                                         std::chrono::milliseconds timeout, Body body);
  void run(const c10::intrusive_ptr<RingdistWork>& work, OpType engineType,
           std::chrono::milliseconds timeout, const Body& body);
  void fail(const std::exception& error);
  void workerLoop();
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds requested) const;

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<PointToPoint> p2p_;
  std::vector<std::string> transports_;
  std::chrono::milliseconds timeout_;
  size_t segmentBytes_;

  std::mutex mutex_;
  std::condition_variable cv_;
  struct Task {
    c10::intrusive_ptr<RingdistWork> work;
    OpType type = OpType::kBarrier;
    std::chrono::milliseconds timeout{0};
    Body body;
  };
  std::deque<Task> queue_;
  std::vector<P2P> pendingP2P_;  // worker thread only
  bool stop_ = false;
  std::atomic<uint64_t> sequenceNumber_{0};
  std::thread worker_;
  std::thread::id workerId_;

  void recordStats(const c10::intrusive_ptr<RingdistWork>& work,
                   std::chrono::steady_clock::time_point started, uint64_t sent0, uint64_t recv0);
  mutable std::mutex statsMutex_;
  std::map<std::string, OpStats> stats_;
  std::string statsKey_;  // worker thread only; a body may refine its op's key
};

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                const std::string& bindIp);

}  // namespace ringdist
