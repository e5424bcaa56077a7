#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "csrc/backend/flight_recorder.h"
#include "csrc/backend/worker.h"
#include "csrc/common/options.h"
#include "csrc/gpu/stage/device_stage.h"
#include "csrc/transport/host_identity.h"
#include "torch_ringdist/export.h"

namespace ringdist {

class Rendezvous;
struct Mesh;
namespace tcp {
struct Door;
}

// The c10d::Backend registered as "ringdist". Calls validate their tensors
// at once (bad input raises in the caller), then queue the operation on the
// group's Worker (worker.h), which runs queued operations in issue order,
// the same on every rank, over the engine's Communicator.
//
// Exported (the Python module binds it): members the module may call are
// defined in process_group.cc, as the Worker behind them is not exported.
class TORCH_RINGDIST_API ProcessGroupRingdist : public c10d::Backend {
 public:
  // Settings from the RINGDIST_* environment variables.
  ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& bindIp);
  ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const ringdist::Options& options);
  // Connected by `connect` (given the group's rendezvous on `store`) instead of connectMesh:
  // what shrink makes.
  using Connect = std::function<Mesh(Rendezvous&)>;
  ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const ringdist::Options& options,
                       const Connect& connect);
  ~ProcessGroupRingdist() override;

  const std::string getBackendName() const override { return "ringdist"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void shutdown() override;
  // Needed by TORCH_DISTRIBUTED_DEBUG=DETAIL (ProcessGroupWrapper): the
  // number of collectives issued, identical on every rank of a healthy group.
  void setSequenceNumberForGroup() override { sequenceNumber_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequenceNumber_; }
  void abort() override;
#ifdef RINGDIST_HAVE_SHRINK
  // dist.shrink_group: a new group of the ranks not excluded (new consecutive
  // ranks in the old order), with this group's settings. Their TCP links
  // connect through the listeners each rank kept open (tcp::Door), under a
  // proof key derived from this group's and the exclusions (excluded ranks
  // cannot join it), without a store round trip; shared memory and lanes
  // rendezvous under a new store prefix. The old group is left to be
  // destroyed; with SHRINK_ABORT its queued operations fail first, and its
  // sealed TCP links between survivors carry on into the new group (fenced:
  // tcp::reconnect) instead of connecting afresh.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
      const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) override;
#endif

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // Sparse COO CPU tensors, SUM: sparse_allreduce.h.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);
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

  // The direct operators (direct_ops.cc): the allreduce / all_gather_into_tensor
  // of the backend itself, synchronous (the latency path), no Work returned.
  void directAllreduce(at::Tensor& tensor, const c10d::ReduceOp& op);
  void directAllgather(at::Tensor& output, const at::Tensor& input);

  // Runs `body` on the worker as one allreduce-like operation bounded by
  // `timeout`, and waits for it: for tests that drive the engine's parts
  // directly (testing_same_gpu.cc).
  void runOnWorker(std::chrono::milliseconds timeout, Worker::Body body);
  // A point-to-point transfer of `tensor` (a CPU tensor) that `post` starts on
  // the worker: for tests of the device messages' matching (testing.cc).
  c10::intrusive_ptr<c10d::Work> transferForTesting(bool send, at::Tensor tensor, Worker::Post post);

  // Tuning and introspection for tests and benchmarks.
  // Transport used to reach each rank ("tcp", "shm", "self").
  const std::vector<std::string>& transports() const { return transports_; }
  // What each link's transport chose, as reported at connect time (TCP:
  // congestion control, socket buffers); empty for self and shared memory.
  const std::vector<std::map<std::string, std::string>>& links() const { return links_; }
  // Whether this host's ranks copy large buffers straight between them, and why.
  const SameHostCopy& sameHostCopy() const { return sameHostCopy_; }
  // Large allreduces on uniform multi-host groups: {ranks of our host, ranks
  // at our position on every host}, each in ring order; empty for one flat ring.
  std::vector<std::vector<int>> allreduceRings() const;
  // The route an allreduce of `bytes` per rank (CPU memory) takes on this group, and the
  // route model's predicted time of each route it allows (csrc/collectives/route_model.h).
  std::map<std::string, std::string> allreduceRoute(size_t bytes) const;
  // The route model's prediction for an allreduce of `bytes` over `ranks` hosts (one rank
  // each) joined by links of `roundTripUs` and `bitsPerSecond`: "route", and "<route>_us"
  // for each route allowed.
  static std::map<std::string, std::string> modelAllreduce(int ranks, size_t bytes,
                                                           uint32_t roundTripUs,
                                                           double bitsPerSecond);
  // Bytes per pipelined segment. The setter applies between the operations
  // issued before and after it (every rank must call it at the same point).
  size_t segmentBytes() const;
  void setSegmentBytes(size_t bytes);

  // Allreduce with a lossy wire codec ("fp16", "bf16", "int8", "int4"; see
  // csrc/codec/codec.h), summed in float32. One dense CPU tensor: float32, or
  // bfloat16/float16 (widened to float32 for the op). average: divide by the
  // world size (AVG) instead of SUM. residual (undefined: none): a contiguous float32 tensor of
  // as many elements on the tensor's device, added to the tensor, then given what the codec
  // lost of this rank's contributions (error feedback; collectives.h).
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(at::Tensor& tensor, const std::string& codec,
                                                     bool average,
                                                     std::chrono::milliseconds timeout,
                                                     const at::Tensor& residual = {});

  // The engine's encoded form of the same operation (collectives.h), which
  // CUDA tensors use around their GPU encode and decode: `encoded` is the
  // encoding of `count` float32 values (a uint8 CPU tensor), the Work's
  // result the encoding of the result. For tests on machines without a GPU.
  c10::intrusive_ptr<c10d::Work> allreduceCompressedEncoded(const at::Tensor& encoded,
                                                            int64_t count,
                                                            const std::string& codec,
                                                            bool average);

  // Per-operation statistics (worker.h), keyed by op name ("allreduce",
  // "compressed_allreduce/int8", ...).
  std::map<std::string, OpStats> stats() const;
  // Ranks whose process is known to be gone: on this host (its process id), or on another
  // whose host refused a connect at the rank's kept listener (tcp::goneBehind, within about
  // two round trips); others: unknown.
  std::vector<int> deadPeers() const;
  // Per rank: [bytes it acknowledged, microseconds with bytes unacknowledged, smallest round
  // trip in microseconds, bytes unacknowledged now] on this rank's TCP links to it
  // (Channel::sendTotals; zeros for shared memory and this rank).
  // Any thread, also while an operation runs: DiLoCo's slow_peer="drop" takes the rate each
  // link delivered during a round from it.
  std::vector<std::array<uint64_t, 4>> linkSends() const;
  // Per rank: milliseconds since data from it last arrived on this rank's TCP links to it
  // (Channel::quietMs; -1 for shared memory, this rank and closed links). Any thread: DiLoCo's
  // heartbeat reports it, so a silent rank's quiet links shorten the wait for it.
  std::vector<int64_t> linkQuietMs() const;
  // Caps the rate this rank sends at on each of its TCP links (bytes per second, 0: no
  // cap); returns the links capped. For tests: a slow link on one machine.
  int capSendRate(uint64_t bytesPerSecond);
  // From now on an error leaves the sealed TCP links open for a shrink to keep
  // (Communicator::keepLinksOnError): for callers whose ranks learn of a failure through the
  // store (DiLoCo with exchange_timeout), so a kill's shrink needs no new connections.
  void keepLinksOnError() { worker_->keepLinksOnError(); }
  // Destroying the group then skips the goodbye through the store (no store round trip): for
  // callers that know every rank finished the same operations and closes the same way
  // (DiLoCo's re-forming at a period's end, a shrink).
  void closeWithoutWaiting();
  // The last operations in torch's flight-recorder dump format (a pickle).
  std::string tracePickle() const;
  void resetStats();

 private:

  DataType checkTensors(const char* op, const std::vector<at::Tensor>& tensors);
  ReduceOp checkReduceOp(const char* op, const c10d::ReduceOp& reduceOp, DataType dtype);
  void checkRoot(const char* op, int64_t root);
  Codec checkCodec(const char* op, const std::string& name);
  // The op's device stage: null for CPU tensors; an error for tensors on
  // different devices.
  std::shared_ptr<DeviceStage> stageFor(const char* op, const std::vector<at::Tensor>& tensors);
  // Every tensor of `list` (each a `what`) has the numel and dtype of `reference`.
  void checkAllMatch(const char* op, const std::vector<at::Tensor>& list, const char* what,
                     const at::Tensor& reference, const char* referenceName);
  c10::intrusive_ptr<c10d::Work> reduceScatterTensors(const char* op, c10d::OpType type,
                                                      std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts);
  // peer -1 (receives only): from any source.
  c10::intrusive_ptr<c10d::Work> sendRecv(bool isSend, std::vector<at::Tensor>& tensors, int peer,
                                          int tag);

  // How an op was called: its deadline, and whether the caller goes on
  // before it completes (torch's async_op; false lets it take the latency path).
  struct Call {
    std::chrono::milliseconds timeout;
    bool async = true;
    // The direct operators: the caller waits and takes no Work, so a host
    // op runs at once (Worker::runNow) and enqueue returns null.
    bool direct = false;
  };
  template <class Opts>
  Call callOf(const Opts& opts) const {
    return {effectiveTimeout(opts.timeout), opts.asyncOp};
  }
  // The allreduce and all_gather_into_tensor behind the public calls and the
  // direct operators.
  c10::intrusive_ptr<c10d::Work> allreduceAs(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts, Call call);
  c10::intrusive_ptr<c10d::Work> allgatherIntoTensors(const char* op, c10d::OpType type,
                                                      std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs, Call call);
  // Queues `body` on the worker and returns its Work (null for a direct
  // call that ran on the host); statsKey defaults to the operation's name.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, OpType engineType,
                                         std::vector<at::Tensor> outputs, Call call,
                                         std::shared_ptr<DeviceStage> stage, Worker::Body body,
                                         std::string statsKey = "",
                                         std::vector<at::Tensor> inputs = {});
  // Whether a collective with this stage goes through the same-GPU path
  // (gpu/stage/device_stage.h); sets it up first if the group has not yet.
  bool onSameGpu(const std::shared_ptr<DeviceStage>& stage, Call call);
  // Whether a staged allreduce, allgather or reduce-scatter of CUDA tensors
  // (the largest `bytes`) copies while its ring runs (DeviceStage::pipelined*).
  bool pipelined(const std::shared_ptr<DeviceStage>& stage, size_t bytes) const {
    return stage != nullptr && devicePipelineBytes_ > 0 && bytes >= devicePipelineBytes_;
  }
  FlightRecorder::Group traceGroup() const;
  void dumpTrace();
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds requested) const;

  c10::intrusive_ptr<c10d::Store> store_;
  ringdist::Options options_;  // as connected (shrink copies them)
  std::shared_ptr<FlightRecorder> recorder_;  // shared with queued ops' bodies
  std::atomic<uint64_t> p2pSequence_{0};
  int shrinks_ = 0;  // shrink() calls so far: each one rendezvous under its own prefix
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<DeviceStages> stages_;  // null without CUDA support
  // CUDA allreduce goes GPU to GPU (every rank on this host, not turned off).
  bool deviceAllreduce_ = false;
  size_t deviceMinBytes_ = 0;  // smaller ones stage through host memory
  bool deviceFused_ = false;   // the same-GPU path is on (RINGDIST_CUDA_FUSED)
  size_t devicePipelineBytes_ = 0;  // staged operations from here copy while the ring runs
  std::mutex sameGpuSetUp_;    // one thread decides per device
  std::vector<std::string> transports_;
  std::shared_ptr<tcp::Door> door_;     // this rank's kept listener (null in a group of one)
  std::vector<PeerRecord> records_;     // every rank's, as connected (shrink reuses them)
  std::vector<std::map<std::string, std::string>> links_;
  SameHostCopy sameHostCopy_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> sequenceNumber_{0};
};

// The ringdist backend behind `group` (its CPU device); for a group of
// another backend an error naming `what`, the group and that backend.
ProcessGroupRingdist& ringdistOf(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                 const char* what);

// A group listening on bindIp, registered for shutdownAllBackends (the C++
// API's torch_ringdist::createBackend chooses the address).
c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                const std::string& bindIp);

// Shuts down every group still alive (what destroy_process_group would do),
// at interpreter exit, before Python finalizes: a worker thread that still
// runs then, and drops a tensor, would need the GIL, which a finalizing
// Python never gives back (the thread is unwound and the process aborts).
// waitForPeers false aborts them instead (a process leaving on an uncaught
// exception): no goodbye wait, whose peers may be blocked in an operation
// with this rank and would keep both waiting until the teardown deadline.
TORCH_RINGDIST_API void shutdownAllBackends(bool waitForPeers = true);

}  // namespace ringdist
