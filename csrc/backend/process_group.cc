#include "csrc/backend/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <mutex>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/environment.h"
#include "csrc/backend/sparse_allreduce.h"
#include "csrc/backend/store_rendezvous.h"
#include "csrc/codec/codec.h"
#include "csrc/collectives/collectives.h"
#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/reduce/reduce.h"
#include "csrc/transport/mesh.h"

namespace ringdist {

namespace {

// How long deadPeers waits for the hosts of TCP peers to answer a connect at their doors.
constexpr int64_t kDoorProbeMinMs = 50;
constexpr int64_t kDoorProbeMaxMs = 500;

// Bad input raises in the caller's thread with the op and rank named.
#define RD_CHECK_INPUT(cond, op, ...) \
  TORCH_CHECK(cond, "ringdist ", op, ": rank ", getRank(), ": ", __VA_ARGS__)

// The engine works on flat host memory: a contiguous CPU tensor is used as
// is, any other CPU tensor gets contiguous memory (a copy if the op reads it),
// a CUDA tensor a pinned host twin that `stage` fills if the op reads it
// (gpu/stage/device_stage.h). Outputs (read = false) are written whole by the engine;
// they are written back after the operation (onto the group's stream for
// CUDA).
struct Flat {
  Flat(const at::Tensor& t, DeviceStage* stage, bool read = true)
      : user(t), flat(stage != nullptr ? stage->hostTwin(t, read) : hostFlat(t, read)) {}
  static at::Tensor hostFlat(const at::Tensor& t, bool read) {
    if (t.is_contiguous()) return t;
    return read ? t.contiguous() : at::empty(t.sizes(), t.options());
  }
  void* data() const { return flat.data_ptr(); }
  void writeBack() const {
    if (!flat.is_same(user)) {
      user.copy_(flat, /*non_blocking=*/true);  // host to host: synchronous
    }
  }
  at::Tensor user;
  at::Tensor flat;
};

size_t largestBytes(const std::vector<at::Tensor>& tensors) {
  size_t largest = 0;
  for (const auto& t : tensors) largest = std::max(largest, static_cast<size_t>(t.nbytes()));
  return largest;
}

template <typename T>
std::vector<T*> dataOf(const std::vector<Flat>& flats) {
  std::vector<T*> ptrs;
  for (const auto& f : flats) ptrs.push_back(f.data());
  return ptrs;
}

std::vector<Flat> flatten(const std::vector<at::Tensor>& tensors, DeviceStage* stage,
                          bool read = true) {
  std::vector<Flat> flats;
  flats.reserve(tensors.size());
  for (const auto& t : tensors) {
    flats.emplace_back(t, stage, read);
  }
  return flats;
}

// The op names of torch's flight recorder (its analyser matches ranks by them).
const char* traceName(c10d::OpType type, OpType engineType) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "_all_gather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "all_gather";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::BARRIER: return "barrier";
    case c10d::OpType::COALESCED:
      return engineType == OpType::kAllgather ? "all_gather_into_tensor_coalesced"
                                              : "reduce_scatter_tensor_coalesced";
    default: return opTypeName(engineType);
  }
}

std::vector<at::Tensor> joined(std::initializer_list<std::vector<at::Tensor>> lists) {
  std::vector<at::Tensor> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

}  // namespace

// ---------------------------------------------------------------- set-up

// Registers a group for shutdownAllBackends() (defined with the registry below).
void trackBackend(const c10::intrusive_ptr<ProcessGroupRingdist>& backend);

namespace {

Options checkedOptions(int rank, int size, std::chrono::milliseconds timeout,
                       const std::string& bindIp) {
  try {
    return optionsFromEnvironment(rank, size, timeout, bindIp);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, c10::str("ringdist init: rank ", rank, ": ", e.what()));
  }
}

}  // namespace

ProcessGroupRingdist::ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const std::string& bindIp)
    : ProcessGroupRingdist(store, rank, size, timeout,
                           checkedOptions(rank, size, timeout, bindIp)) {}

ProcessGroupRingdist::ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const ringdist::Options& options)
    : ProcessGroupRingdist(store, rank, size, timeout, options, [&](Rendezvous& rendezvous) {
        return connectMesh(rendezvous, rank, size, options.mesh);
      }) {}

ProcessGroupRingdist::ProcessGroupRingdist(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const ringdist::Options& options,
                                           const Connect& connect)
    : c10d::Backend(rank, size),
      store_(store),
      options_(options),
      recorder_(std::make_shared<FlightRecorder>(options.traceEntries, options.traceDump)),
      timeout_(timeout) {
  auto rendezvous = std::make_shared<StoreRendezvous>(store);
  try {
    setDebugEnabled(options.debug);
    Mesh mesh = connect(*rendezvous);
    transports_ = mesh.transportOf;
    door_ = mesh.door;
    records_ = mesh.records;
    std::vector<int> lanes(mesh.channels.size(), 1);  // each peer's connections
    for (const auto& lane : mesh.lanes) ++lanes[static_cast<size_t>(lane->peer())];
    for (size_t peer = 0; peer < mesh.channels.size(); ++peer) {
      const auto& channel = mesh.channels[peer];
      links_.push_back(channel ? channel->details() : std::map<std::string, std::string>{});
      if (channel) links_.back()["lanes"] = std::to_string(lanes[peer]);
      if (channel && mesh.transportOf[peer] == "tcp") {
        links_.back()["stream_window"] = std::to_string(mesh.windowBytes);
      }
    }
    sameHostCopy_ = mesh.sameHostCopy;
    const bool oneHost = std::all_of(mesh.hostOf.begin(), mesh.hostOf.end(),
                                     [&](int host) { return host == mesh.hostOf[0]; });
    auto comm = std::make_unique<Communicator>(rank, size, std::move(mesh.channels),
                                               std::move(mesh.ring), std::move(mesh.hostOf),
                                               rendezvous, options.collectives,
                                               std::move(mesh.board), std::move(mesh.lanes));
    comm->setLinkRoundTrip(mesh.roundTripUs);
    comm->setReportedRoundTrip(options.mesh.testRoundTripUs);
    worker_ = std::make_unique<Worker>(rank, std::move(comm), recorder_, [this] { dumpTrace(); });
    stages_ = makeDeviceStages(options.collectives);
    deviceAllreduce_ = stages_ != nullptr && size > 1 && oneHost &&
                       options.collectives.deviceBufferBytes > 0;
    deviceMinBytes_ = options.collectives.deviceMinBytes;
    deviceFused_ = options.collectives.deviceFused;
    devicePipelineBytes_ = options.collectives.devicePipelineBytes;
    logDebug(strCat("rank ", rank, "/", size, " ready; kernels: ", kernelFamily(),
                    "; segment bytes: ", options.collectives.segmentBytes));
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, c10::str("ringdist init: rank ", rank, ": ", e.what()));
  }
}

ProcessGroupRingdist::~ProcessGroupRingdist() { shutdown(); }

void ProcessGroupRingdist::shutdown() {
  worker_->stop();
  door_.reset();  // closes the listener, unless a group shrunk from this one still keeps it
}

void ProcessGroupRingdist::abort() {
  dumpTrace();  // what was queued and running when the group was aborted
  worker_->abort();
}

#ifdef RINGDIST_HAVE_SHRINK
c10::intrusive_ptr<c10d::Backend> ProcessGroupRingdist::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  constexpr int kShrinkAbort = 1;  // torch.distributed.SHRINK_ABORT
  std::vector<int64_t> excluded = ranksToExclude;
  std::sort(excluded.begin(), excluded.end());
  RD_CHECK_INPUT(!excluded.empty(), "shrink", "no rank to exclude");
  RD_CHECK_INPUT(std::adjacent_find(excluded.begin(), excluded.end()) == excluded.end(), "shrink",
                 "rank ", *std::adjacent_find(excluded.begin(), excluded.end()),
                 " is excluded twice");
  RD_CHECK_INPUT(excluded.front() >= 0 && excluded.back() < getSize(), "shrink",
                 "excluded ranks must be in [0, ", getSize(), "), got ", c10::Join(",", excluded));
  RD_CHECK_INPUT(!std::binary_search(excluded.begin(), excluded.end(), getRank()), "shrink",
                 "this rank is excluded; only the survivors call shrink");
  RD_CHECK_INPUT(static_cast<int>(excluded.size()) < getSize(), "shrink", "every rank excluded");
  RD_CHECK_INPUT((shrinkFlags & ~kShrinkAbort) == 0, "shrink", "unknown flags ", shrinkFlags);
  const bool aborting = (shrinkFlags & kShrinkAbort) != 0;
  if (aborting) {
    dumpTrace();
    worker_->abort(/*keepLinks=*/true);  // the survivors' TCP links may serve the new group
  }
  const int newRank = getRank() - static_cast<int>(std::lower_bound(excluded.begin(),
                                                                    excluded.end(), getRank()) -
                                                   excluded.begin());
  const int newSize = getSize() - static_cast<int>(excluded.size());
  std::vector<int> survivors;
  for (int r = 0; r < getSize(); ++r) {
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) survivors.push_back(r);
  }
  // Survivors that were given the same exclusions meet under the same label: a fresh store
  // prefix, and a proof key derived with it at the doors, that excluded ranks never hold.
  const std::string label =
      c10::str("ringdist/shrink", shrinks_++, "/without", c10::Join(",", excluded), "/");
  auto store = c10::make_intrusive<c10d::PrefixStore>(label, store_);
  // Its operation stopped, the old group hands over its sealed TCP links to survivors: warm
  // (their congestion windows grown), where a fresh connection across a WAN starts slow.
  std::vector<std::unique_ptr<Channel>> kept;
  if (aborting) kept = worker_->releaseLinks(survivors);
  ringdist::Options options = options_;
  options.collectives = worker_->options();  // settings changed since init included
  options.mesh.timeout = std::min(timeout_, std::chrono::milliseconds(options.shrinkTimeout));
  c10::intrusive_ptr<ProcessGroupRingdist> shrunk;
  try {
    // A group that can shrink has two ranks or more, so it kept a door.
    shrunk = c10::make_intrusive<ProcessGroupRingdist>(
        store, newRank, newSize, timeout_, options, [&](Rendezvous& rendezvous) {
          return reconnectMesh(rendezvous, *door_, records_, survivors, newRank, label,
                               options.mesh, std::move(kept));
        });
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("ringdist shrink: rank ", getRank(), " (new rank ", newRank, " of ",
                             newSize, "): the survivors (ranks ", c10::Join(",", survivors),
                             ") did not all connect within ",
                             options.mesh.timeout.count(), " ms; a survivor died, or was given "
                             "other ranks to exclude (RINGDIST_SHRINK_TIMEOUT): ", e.what()));
  }
  // torch destroys this group next; the excluded ranks will not say goodbye.
  worker_->closeWithoutWaiting();
  trackBackend(shrunk);
  return shrunk;
}
#endif

size_t ProcessGroupRingdist::segmentBytes() const { return worker_->options().segmentBytes; }

std::vector<std::vector<int>> ProcessGroupRingdist::allreduceRings() const {
  return worker_->allreduceRings();
}

std::map<std::string, std::string> ProcessGroupRingdist::allreduceRoute(size_t bytes) const {
  return worker_->allreduceRoute(bytes);
}

std::map<std::string, std::string> ProcessGroupRingdist::modelAllreduce(int ranks, size_t bytes,
                                                                       uint32_t roundTripUs,
                                                                       double bitsPerSecond) {
  RINGDIST_CHECK(ranks >= 1 && bitsPerSecond > 0,
                 "ringdist route model: ranks must be >= 1 and the link's rate > 0, got ", ranks,
                 " and ", bitsPerSecond);
  const RouteModel model = RouteModel::forLink(roundTripUs, bitsPerSecond);
  std::map<std::string, std::string> out = {
      {"route", routeName(model.best(ModelledOp::kAllreduce, ranks, bytes))}};
  addAllreduceTimes(model, ranks, bytes, &out);
  return out;
}

std::map<std::string, OpStats> ProcessGroupRingdist::stats() const { return worker_->stats(); }

void ProcessGroupRingdist::resetStats() { worker_->resetStats(); }

void ProcessGroupRingdist::closeWithoutWaiting() { worker_->closeWithoutWaiting(); }

std::vector<std::array<uint64_t, 4>> ProcessGroupRingdist::linkSends() const {
  std::vector<std::array<uint64_t, 4>> sends;
  for (const auto& t : worker_->sendTotals()) {
    sends.push_back({t.bytesAcked, t.busyUs, t.roundTripUs, t.unacknowledged});
  }
  return sends;
}

std::vector<int64_t> ProcessGroupRingdist::linkQuietMs() const { return worker_->quietMs(); }

int ProcessGroupRingdist::capSendRate(uint64_t bytesPerSecond) {
  return worker_->capSendRate(bytesPerSecond);
}

std::vector<int> ProcessGroupRingdist::deadPeers() const {
  std::vector<int> dead = worker_->deadPeers();
  if (door_ == nullptr) return dead;
  std::vector<int> unknown;  // peers on TCP: their hosts are asked at their doors
  for (int r = 0; r < getSize(); ++r) {
    if (transports_[static_cast<size_t>(r)] == "tcp" &&
        std::find(dead.begin(), dead.end(), r) == dead.end()) {
      unknown.push_back(r);
    }
  }
  // Two round trips answer a live host; longer is a host cut off, or very far.
  uint32_t roundTripUs = 0;  // the group's longest link, as agreed at connect
  for (const auto& record : records_) roundTripUs = std::max(roundTripUs, record.roundTripUs);
  const auto limit = std::chrono::milliseconds(
      std::min<int64_t>(kDoorProbeMaxMs, 2 * int64_t{roundTripUs} / 1000 + kDoorProbeMinMs));
  for (int r : goneAtDoors(*door_, unknown, limit)) dead.push_back(r);
  std::sort(dead.begin(), dead.end());
  return dead;
}

void ProcessGroupRingdist::setSegmentBytes(size_t bytes) {
  TORCH_CHECK(bytes > 0, "ringdist: rank ", getRank(), ": segment size must be positive");
  worker_->configure([bytes](CollectiveOptions& options) { options.segmentBytes = bytes; });
}

std::chrono::milliseconds ProcessGroupRingdist::effectiveTimeout(
    std::chrono::milliseconds requested) const {
  return requested.count() > 0 ? requested : timeout_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::enqueue(c10d::OpType type,
                                                             OpType engineType,
                                                             std::vector<at::Tensor> outputs,
                                                             Call call,
                                                             std::shared_ptr<DeviceStage> stage,
                                                             Worker::Body body,
                                                             std::string statsKey,
                                                             std::vector<at::Tensor> inputs) {
  const uint64_t seq = ++sequenceNumber_;
  const uint64_t traceId =
      recorder_->add(traceName(type, engineType), seq, FlightRecorder::kCollective,
                     inputs.empty() ? outputs : inputs, outputs, call.timeout.count());
  std::string key = statsKey.empty() ? opTypeName(engineType) : std::move(statsKey);
  if (call.direct && stage == nullptr) {  // the direct operators: no Work at all
    worker_->runNow(type, engineType, std::move(key), outputs, call.timeout, traceId,
                    std::move(body));
    return nullptr;
  }
  // The latency path: a caller that waits for the result anyway (async_op=False), or any
  // caller of a one-rank group, runs the op itself when the worker is idle. CPU tensors
  // only: a CUDA op's host side must not wait for the GPU on the caller's thread.
  const bool inlineIfIdle = stage == nullptr && (!call.async || getSize() == 1);
  return worker_->enqueue(type, engineType, std::move(key), std::move(outputs), call.timeout,
                          traceId, std::move(body), std::move(stage), inlineIfIdle);
}

void ProcessGroupRingdist::dumpTrace() {
  const char* globalRank = std::getenv("RANK");
  recorder_->dumpOnce(traceGroup(), globalRank != nullptr ? std::atoi(globalRank) : getRank());
}

FlightRecorder::Group ProcessGroupRingdist::traceGroup() const {
  return {getGroupUid().empty() ? "0" : getGroupUid(),
          getGroupDesc().empty() ? "default_pg" : getGroupDesc(), getRank(), getSize()};
}

std::string ProcessGroupRingdist::tracePickle() const { return recorder_->pickled(traceGroup()); }

// ---------------------------------------------------------------- checks

DataType ProcessGroupRingdist::checkTensors(const char* op, const std::vector<at::Tensor>& tensors) {
  RD_CHECK_INPUT(!tensors.empty(), op, "the tensor list is empty");
  DataType dtype = DataType::kFloat32;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    RD_CHECK_INPUT(t.defined(), op, "tensor ", i, " is undefined");
    RD_CHECK_INPUT(t.layout() == at::kStrided, op, "tensor ", i,
                   " is sparse (layout ", t.layout(), "); only dense tensors are supported");
    RD_CHECK_INPUT(t.device().is_cpu() || t.is_cuda(), op, "tensor ", i, " is on ", t.device(),
                   "; ringdist takes CPU and CUDA tensors");
    RD_CHECK_INPUT(!t.is_cuda() || stages_ != nullptr, op, "tensor ", i, " is on ", t.device(),
                   "; this build of ringdist has no CUDA support (rebuild it against a CUDA "
                   "build of torch with TORCH_RINGDIST_CUDA=1, or use "
                   "backend=\"cpu:ringdist,cuda:nccl\")");
    RD_CHECK_INPUT(t.scalar_type() == tensors[0].scalar_type(), op, "tensors have mixed dtypes (",
                   tensors[0].scalar_type(), " and ", t.scalar_type(), ")");
    RD_CHECK_INPUT(toDataType(t.scalar_type(), &dtype), op, "unsupported dtype ",
                   t.scalar_type(), " (supported: float32, float64, float16, bfloat16, int8, "
                   "uint8, int32, int64, bool)");
  }
  return dtype;
}

ReduceOp ProcessGroupRingdist::checkReduceOp(const char* op, const c10d::ReduceOp& reduceOp,
                                             DataType dtype) {
  ReduceOp out = ReduceOp::kSum;
  switch (reduceOp.op_) {
    case c10d::ReduceOp::SUM: out = ReduceOp::kSum; break;
    case c10d::ReduceOp::AVG: out = ReduceOp::kAvg; break;
    case c10d::ReduceOp::PRODUCT: out = ReduceOp::kProduct; break;
    case c10d::ReduceOp::MIN: out = ReduceOp::kMin; break;
    case c10d::ReduceOp::MAX: out = ReduceOp::kMax; break;
    case c10d::ReduceOp::BAND: out = ReduceOp::kBand; break;
    case c10d::ReduceOp::BOR: out = ReduceOp::kBor; break;
    case c10d::ReduceOp::BXOR: out = ReduceOp::kBxor; break;
    default:  // PREMUL_SUM; a number, not a character (RedOpType is a uint8_t)
      RD_CHECK_INPUT(false, op, "reduce op ",
                     reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM
                         ? std::string("PREMUL_SUM (NCCL-only; use SUM and scale)")
                         : std::to_string(static_cast<int>(reduceOp.op_)),
                     " is not supported");
  }
  std::string why = unsupportedReason(dtype, out);
  RD_CHECK_INPUT(why.empty(), op, why);
  return out;
}

void ProcessGroupRingdist::checkAllMatch(const char* op, const std::vector<at::Tensor>& list,
                                         const char* what, const at::Tensor& reference,
                                         const char* referenceName) {
  checkTensors(op, list);
  for (const auto& t : list) {
    RD_CHECK_INPUT(t.numel() == reference.numel() && t.scalar_type() == reference.scalar_type(),
                   op, "each ", what, " must match the ", referenceName, " (", reference.numel(),
                   " x ", reference.scalar_type(), "), got ", t.numel(), " x ", t.scalar_type());
  }
}

// The first time a group's collectives reach a device, its ranks decide
// together whether they share that GPU: an operation of its own, in issue
// order like every other, that the caller waits for (once), so every rank
// routes every later call the same way.
bool ProcessGroupRingdist::onSameGpu(const std::shared_ptr<DeviceStage>& stage, Call call) {
  if (stage == nullptr || !deviceAllreduce_ || !deviceFused_ || options_.collectives.checkResults) {
    return false;
  }
  std::lock_guard<std::mutex> lock(sameGpuSetUp_);
  if (stage->sameGpu() < 0) {
    call.direct = false;  // a Work to wait for, whatever the caller asked
    enqueue(c10d::OpType::UNKNOWN, OpType::kBarrier, {}, call, nullptr,
            [stage](Communicator& comm) { stage->setUpSameGpu(comm); }, "same-GPU set-up")
        ->wait();
  }
  return stage->sameGpu() > 0;
}

std::shared_ptr<DeviceStage> ProcessGroupRingdist::stageFor(const char* op,
                                                            const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    RD_CHECK_INPUT(t.device() == tensors[0].device(), op, "tensors are on different devices (",
                   tensors[0].device(), " and ", t.device(), ")");
  }
  if (tensors.empty() || !tensors[0].is_cuda()) {
    return nullptr;
  }
  auto stage = stages_->begin(tensors[0].device());
  RD_CHECK_INPUT(!stage->callerCapturing(), op, "the current CUDA stream is capturing a graph; "
                 "ringdist collectives hand off through the host at every call and cannot be "
                 "captured (run them outside the captured region)");
  return stage;
}

Codec ProcessGroupRingdist::checkCodec(const char* op, const std::string& name) {
  Codec codec = Codec::kInt8;
  RD_CHECK_INPUT(codecFromName(name, &codec), op, "unknown codec '", name,
                 "' (known: fp16, bf16, int8, int4)");
  return codec;
}

void ProcessGroupRingdist::checkRoot(const char* op, int64_t root) {
  RD_CHECK_INPUT(root >= 0 && root < getSize(), op, "root rank ", root,
                 " is out of range for a group of size ", getSize());
}

// ---------------------------------------------------------------- collectives

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  DataType dtype = checkTensors(op, tensors);
  RD_CHECK_INPUT(tensors.size() == 1, op, "expected one tensor, got ", tensors.size());
  checkRoot(op, opts.rootRank);
  RD_CHECK_INPUT(opts.rootTensor == 0, op, "rootTensor must be 0");
  auto stage = stageFor(op, tensors);
  int root = static_cast<int>(opts.rootRank);
  if (onSameGpu(stage, callOf(opts))) {
    at::Tensor tensor = tensors[0];
    return enqueue(c10d::OpType::BROADCAST, OpType::kBroadcast, tensors, callOf(opts), stage,
                   [stage, tensor, dtype, root](Communicator& comm) {
                     stage->sameGpuBroadcast(comm, tensor, dtype, root);
                   });
  }
  Flat flat(tensors[0], stage.get());
  size_t count = static_cast<size_t>(flat.flat.numel());
  return enqueue(c10d::OpType::BROADCAST, OpType::kBroadcast, tensors,
                 callOf(opts), stage, [flat, count, dtype, root](Communicator& comm) {
                   ringdist::broadcast(comm, flat.data(), count, dtype, root);
                   flat.writeBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return allreduceAs(tensors, opts, callOf(opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduceAs(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts, Call call) {
  const char* op = "allreduce";
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    return allreduceSparse(tensors[0], opts);
  }
  DataType dtype = checkTensors(op, tensors);
  RD_CHECK_INPUT(tensors.size() == 1, op, "expected one tensor, got ", tensors.size(),
                 " (use allreduce_coalesced for several)");
  ReduceOp reduceOp = checkReduceOp(op, opts.reduceOp, dtype);
  auto stage = stageFor(op, tensors);
  if (onSameGpu(stage, call)) {
    at::Tensor tensor = tensors[0];
    return enqueue(c10d::OpType::ALLREDUCE, OpType::kAllreduce, tensors, call, stage,
                   [stage, tensor, dtype, reduceOp](Communicator& comm) {
                     stage->sameGpuAllreduce(comm, tensor, dtype, reduceOp);
                   });
  }
  const size_t bytes = static_cast<size_t>(tensors[0].numel() * tensors[0].element_size());
  if (stage != nullptr && deviceAllreduce_ && bytes >= deviceMinBytes_) {
    // GPU to GPU, on this host
    at::Tensor tensor = tensors[0];
    return enqueue(c10d::OpType::ALLREDUCE, OpType::kAllreduce, tensors,
                   call, stage,
                   [stage, tensor, dtype, reduceOp](Communicator& comm) {
                     stage->allreduce(comm, tensor, dtype, reduceOp);
                   });
  }
  if (pipelined(stage, bytes)) {
    // through host memory, the copies overlapping the ring
    at::Tensor tensor = tensors[0];
    return enqueue(c10d::OpType::ALLREDUCE, OpType::kAllreduce, tensors, call, stage,
                   [stage, tensor, dtype, reduceOp](Communicator& comm) {
                     stage->pipelinedAllreduce(comm, tensor, dtype, reduceOp);
                   });
  }
  Flat flat(tensors[0], stage.get());
  size_t count = static_cast<size_t>(flat.flat.numel());
  return enqueue(c10d::OpType::ALLREDUCE, OpType::kAllreduce, tensors,
                 call, stage, [flat, count, dtype, reduceOp](Communicator& comm) {
                   ringdist::allreduce(comm, flat.data(), count, dtype, reduceOp);
                   flat.writeBack();
                 });
}

void ProcessGroupRingdist::directAllreduce(at::Tensor& tensor, const c10d::ReduceOp& op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  opts.asyncOp = false;
  Call call = callOf(opts);
  call.direct = true;
  // CUDA and sparse tensors still come back with a Work.
  if (auto work = allreduceAs(tensors, opts, call)) {
    work->wait();
  }
}

void ProcessGroupRingdist::directAllgather(at::Tensor& output, const at::Tensor& input) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;
  Call call = callOf(opts);
  call.direct = true;
  if (auto work = allgatherIntoTensors("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE,
                                       outputs, inputs, call)) {
    work->wait();
  }
}

void ProcessGroupRingdist::runOnWorker(std::chrono::milliseconds timeout, Worker::Body body) {
  enqueue(c10d::OpType::UNKNOWN, OpType::kAllreduce, {}, Call{timeout}, nullptr, std::move(body),
          "test")
      ->wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::transferForTesting(bool send,
                                                                        at::Tensor tensor,
                                                                        Worker::Post post) {
  return worker_->enqueueTransfer(send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                  send ? "send" : "recv", tensor, tensor, timeout_,
                                  recorder_->add(send ? "send" : "recv", ++p2pSequence_, 0, {tensor},
                                                 {tensor}, timeout_.count()),
                                  std::move(post), nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduceSparse(
    at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  RD_CHECK_INPUT(tensor.layout() == at::kSparse, op, "sparse tensors must be COO (layout ",
                 tensor.layout(), ")");
  RD_CHECK_INPUT(tensor.device().is_cpu(), op, "sparse tensors must be on the CPU, got ",
                 tensor.device());
  DataType dtype = DataType::kFloat32;
  RD_CHECK_INPUT(toDataType(tensor.scalar_type(), &dtype) && dtype != DataType::kBool, op,
                 "unsupported dtype ", tensor.scalar_type(), " for a sparse tensor");
  RD_CHECK_INPUT(opts.reduceOp.op_ == c10d::ReduceOp::SUM, op,
                 "sparse tensors support SUM only, got reduce op ", opts.reduceOp.op_);
  std::vector<at::Tensor> outputs{tensor};
  return enqueue(c10d::OpType::ALLREDUCE, OpType::kAllreduce, outputs,
                 callOf(opts), nullptr,
                 [tensor](Communicator& comm) { sparseAllreduce(comm, tensor); }, "allreduce_sparse");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  DataType dtype = checkTensors(op, tensors);
  ReduceOp reduceOp = checkReduceOp(op, opts.reduceOp, dtype);
  // One allreduce over the concatenation: one pipeline instead of many
  // latency-bound small ones.
  auto stage = stageFor(op, tensors);
  auto flats = flatten(tensors, stage.get());
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, OpType::kAllreduce, tensors,
                 callOf(opts), stage, [flats, dtype, reduceOp](Communicator& comm) {
                   std::vector<at::Tensor> parts;
                   for (const auto& f : flats) parts.push_back(f.flat.reshape({-1}));
                   at::Tensor packed = at::cat(parts);
                   ringdist::allreduce(comm, packed.data_ptr(),
                                       static_cast<size_t>(packed.numel()), dtype, reduceOp);
                   int64_t offset = 0;
                   for (const auto& f : flats) {
                     f.flat.copy_(packed.narrow(0, offset, f.flat.numel()).view(f.flat.sizes()));
                     offset += f.flat.numel();
                     f.writeBack();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  DataType dtype = checkTensors(op, tensors);
  RD_CHECK_INPUT(tensors.size() == 1, op, "expected one tensor, got ", tensors.size());
  checkRoot(op, opts.rootRank);
  ReduceOp reduceOp = checkReduceOp(op, opts.reduceOp, dtype);
  auto stage = stageFor(op, tensors);
  int root = static_cast<int>(opts.rootRank);
  if (onSameGpu(stage, callOf(opts))) {
    at::Tensor tensor = tensors[0];
    return enqueue(c10d::OpType::REDUCE, OpType::kReduce, tensors, callOf(opts), stage,
                   [stage, tensor, dtype, reduceOp, root](Communicator& comm) {
                     stage->sameGpuReduce(comm, tensor, dtype, reduceOp, root);
                   });
  }
  Flat flat(tensors[0], stage.get());
  size_t count = static_cast<size_t>(flat.flat.numel());
  bool isRoot = root == getRank();
  return enqueue(c10d::OpType::REDUCE, OpType::kReduce, tensors, callOf(opts),
                 stage, [flat, count, dtype, reduceOp, root, isRoot](Communicator& comm) {
                   ringdist::reduce(comm, flat.data(), count, dtype, reduceOp, root);
                   if (isRoot) {
                     flat.writeBack();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather";
  DataType dtype = checkTensors(op, inputs);
  RD_CHECK_INPUT(inputs.size() == 1 && outputs.size() == 1, op,
                 "expected one input tensor and one output list");
  RD_CHECK_INPUT(static_cast<int>(outputs[0].size()) == getSize(), op, "the output list has ",
                 outputs[0].size(), " tensors; the group has ", getSize(), " ranks");
  checkAllMatch(op, outputs[0], "output", inputs[0], "input");
  auto stage = stageFor(op, joined({inputs, outputs[0]}));
  if (onSameGpu(stage, callOf(opts))) {
    return enqueue(c10d::OpType::ALLGATHER, OpType::kAllgather, outputs[0], callOf(opts), stage,
                   [stage, input = inputs[0], list = outputs[0], dtype](Communicator& comm) {
                     stage->sameGpuAllgather(comm, input, list, dtype);
                   }, "", inputs);
  }
  Flat in(inputs[0], stage.get());
  auto outs = flatten(outputs[0], stage.get(), /*read=*/false);
  size_t count = static_cast<size_t>(in.flat.numel());
  return enqueue(c10d::OpType::ALLGATHER, OpType::kAllgather, outputs[0],
                 callOf(opts), stage, [in, outs, count, dtype](Communicator& comm) {
                   auto ptrs = dataOf<void>(outs);
                   ringdist::allgather(comm, in.data(), ptrs.data(), count, dtype);
                   for (const auto& o : outs) o.writeBack();
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return allgatherIntoTensors("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, outputs,
                              inputs, callOf(opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  DataType dtype = checkTensors(op, inputs);
  RD_CHECK_INPUT(static_cast<int>(outputLists.size()) == getSize(), op, "expected ", getSize(),
                 " output lists (one per rank), got ", outputLists.size());
  std::vector<at::Tensor> allOutputs;
  for (const auto& list : outputLists) {
    RD_CHECK_INPUT(list.size() == inputs.size(), op, "each output list must hold ",
                   inputs.size(), " tensors");
    for (size_t i = 0; i < list.size(); ++i) {
      RD_CHECK_INPUT(list[i].numel() == inputs[i].numel() &&
                         list[i].scalar_type() == inputs[i].scalar_type(),
                     op, "output ", i, " does not match input ", i);
      allOutputs.push_back(list[i]);
    }
  }
  checkTensors(op, allOutputs);
  auto stage = stageFor(op, joined({inputs, allOutputs}));
  auto ins = flatten(inputs, stage.get());
  std::vector<std::vector<Flat>> lists;
  for (const auto& list : outputLists) lists.push_back(flatten(list, stage.get(), false));
  int size = getSize();
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, OpType::kAllgather, allOutputs,
                 callOf(opts), stage, [ins, lists, dtype, size](Communicator& comm) {
                   std::vector<at::Tensor> parts;
                   for (const auto& f : ins) parts.push_back(f.flat.reshape({-1}));
                   at::Tensor packed = at::cat(parts);
                   at::Tensor gathered = at::empty({size, packed.numel()}, packed.options());
                   std::vector<void*> ptrs;
                   for (int r = 0; r < size; ++r) ptrs.push_back(gathered[r].data_ptr());
                   ringdist::allgather(comm, packed.data_ptr(), ptrs.data(),
                                       static_cast<size_t>(packed.numel()), dtype);
                   for (int r = 0; r < size; ++r) {
                     int64_t offset = 0;
                     for (const auto& out : lists[static_cast<size_t>(r)]) {
                       out.flat.copy_(gathered[r]
                                          .narrow(0, offset, out.flat.numel())
                                          .view(out.flat.sizes()));
                       offset += out.flat.numel();
                       out.writeBack();
                     }
                   }
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return allgatherIntoTensors("allgather_into_tensor_coalesced", c10d::OpType::COALESCED, outputs,
                              inputs, callOf(opts));
}

// Output i holds every rank's input i, rank by rank.
c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allgatherIntoTensors(
    const char* op, c10d::OpType type, std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, Call call) {
  RD_CHECK_INPUT(outputs.size() == inputs.size(), op, "got ", outputs.size(), " outputs for ",
                 inputs.size(), " inputs");
  std::vector<DataType> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(checkTensors(op, {inputs[i], outputs[i]}));
    RD_CHECK_INPUT(outputs[i].numel() == inputs[i].numel() * getSize(), op, "output ", i,
                   " has ", outputs[i].numel(), " elements; expected input numel ",
                   inputs[i].numel(), " x world size ", getSize());
  }
  auto stage = stageFor(op, joined({inputs, outputs}));
  if (onSameGpu(stage, call)) {
    return enqueue(type, OpType::kAllgather, outputs, call, stage,
                   [stage, inputs, outputs, dtypes](Communicator& comm) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       stage->sameGpuAllgather(comm, inputs[i], {outputs[i]}, dtypes[i]);
                     }
                   }, "", inputs);
  }
  if (pipelined(stage, largestBytes(outputs))) {
    return enqueue(type, OpType::kAllgather, outputs, call, stage,
                   [stage, inputs, outputs, dtypes](Communicator& comm) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       stage->pipelinedAllgather(comm, inputs[i], outputs[i], dtypes[i]);
                     }
                   }, "", inputs);
  }
  auto ins = flatten(inputs, stage.get());
  auto outs = flatten(outputs, stage.get(), /*read=*/false);
  const int size = getSize();
  return enqueue(type, OpType::kAllgather, outputs, call, stage,
                 [ins, outs, dtypes, size](Communicator& comm) {
                   for (size_t i = 0; i < ins.size(); ++i) {
                     const size_t count = static_cast<size_t>(ins[i].flat.numel());
                     auto blocks = blocksOf(outs[i].data(), size, count * elementSize(dtypes[i]));
                     ringdist::allgather(comm, ins[i].data(), blocks.data(), count, dtypes[i]);
                     outs[i].writeBack();
                   }
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  DataType dtype = checkTensors(op, inputs);
  RD_CHECK_INPUT(inputs.size() == 1, op, "expected one input tensor, got ", inputs.size());
  checkRoot(op, opts.rootRank);
  int root = static_cast<int>(opts.rootRank);
  bool isRoot = root == getRank();
  std::vector<at::Tensor> results;
  if (isRoot) {
    RD_CHECK_INPUT(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), op,
                   "the root needs one output list of ", getSize(), " tensors");
    checkAllMatch(op, outputs[0], "output", inputs[0], "input");
    results = outputs[0];
  } else {
    RD_CHECK_INPUT(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), op,
                   "only the root (rank ", root, ") may pass output tensors");
  }
  auto stage = stageFor(op, joined({inputs, results}));
  auto outs = flatten(results, stage.get(), /*read=*/false);
  Flat in(inputs[0], stage.get());
  size_t count = static_cast<size_t>(inputs[0].numel());
  int size = getSize();
  return enqueue(c10d::OpType::GATHER, OpType::kGather, results, callOf(opts),
                 stage, [in, outs, count, dtype, root, size](Communicator& comm) {
                   std::vector<void*> ptrs(static_cast<size_t>(size), nullptr);
                   for (size_t r = 0; r < outs.size(); ++r) ptrs[r] = outs[r].data();
                   ringdist::gather(comm, in.data(), ptrs.data(), count, dtype, root);
                   for (const auto& o : outs) o.writeBack();
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  DataType dtype = checkTensors(op, outputs);
  RD_CHECK_INPUT(outputs.size() == 1, op, "expected one output tensor, got ", outputs.size());
  checkRoot(op, opts.rootRank);
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> sources;
  if (root == getRank()) {
    RD_CHECK_INPUT(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), op,
                   "the root needs one input list of ", getSize(), " tensors");
    checkAllMatch(op, inputs[0], "input", outputs[0], "output");
    sources = inputs[0];
  } else {
    RD_CHECK_INPUT(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), op,
                   "only the root (rank ", root, ") may pass input tensors");
  }
  auto stage = stageFor(op, joined({outputs, sources}));
  auto ins = flatten(sources, stage.get());
  Flat out(outputs[0], stage.get(), /*read=*/false);
  size_t count = static_cast<size_t>(outputs[0].numel());
  int size = getSize();
  return enqueue(c10d::OpType::SCATTER, OpType::kScatter, outputs, callOf(opts),
                 stage, [ins, out, count, dtype, root, size](Communicator& comm) {
                   std::vector<const void*> ptrs(static_cast<size_t>(size), nullptr);
                   for (size_t r = 0; r < ins.size(); ++r) ptrs[r] = ins[r].data();
                   ringdist::scatter(comm, ptrs.data(), out.data(), count, dtype, root);
                   out.writeBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  DataType dtype = checkTensors(op, outputs);
  RD_CHECK_INPUT(outputs.size() == 1 && inputs.size() == 1, op,
                 "expected one output tensor and one input list");
  RD_CHECK_INPUT(static_cast<int>(inputs[0].size()) == getSize(), op, "the input list has ",
                 inputs[0].size(), " tensors; the group has ", getSize(), " ranks");
  checkAllMatch(op, inputs[0], "input", outputs[0], "output");
  ReduceOp reduceOp = checkReduceOp(op, opts.reduceOp, dtype);
  auto stage = stageFor(op, joined({outputs, inputs[0]}));
  auto ins = flatten(inputs[0], stage.get());
  Flat out(outputs[0], stage.get(), /*read=*/false);
  size_t count = static_cast<size_t>(outputs[0].numel());
  return enqueue(c10d::OpType::REDUCE_SCATTER, OpType::kReduceScatter, outputs,
                 callOf(opts), stage, [ins, out, count, dtype, reduceOp](Communicator& comm) {
                   auto ptrs = dataOf<const void>(ins);
                   ringdist::reduceScatter(comm, ptrs.data(), out.data(), count, dtype, reduceOp);
                   out.writeBack();
                 }, "", inputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return reduceScatterTensors("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, outputs,
                              inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return reduceScatterTensors("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, outputs,
                              inputs, opts);
}

// Output i is the reduction of block `rank` of every rank's input i.
c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::reduceScatterTensors(
    const char* op, c10d::OpType type, std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  RD_CHECK_INPUT(outputs.size() == inputs.size(), op, "got ", outputs.size(), " outputs for ",
                 inputs.size(), " inputs");
  std::vector<DataType> dtypes;
  std::vector<ReduceOp> ops;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(checkTensors(op, {inputs[i], outputs[i]}));
    ops.push_back(checkReduceOp(op, opts.reduceOp, dtypes.back()));
    RD_CHECK_INPUT(inputs[i].numel() == outputs[i].numel() * getSize(), op, "input ", i, " has ",
                   inputs[i].numel(), " elements; expected output numel ", outputs[i].numel(),
                   " x world size ", getSize());
  }
  auto stage = stageFor(op, joined({inputs, outputs}));
  if (onSameGpu(stage, callOf(opts))) {
    return enqueue(type, OpType::kReduceScatter, outputs, callOf(opts), stage,
                   [stage, inputs, outputs, dtypes, ops](Communicator& comm) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       stage->sameGpuReduceScatter(comm, inputs[i], outputs[i], dtypes[i], ops[i]);
                     }
                   }, "", inputs);
  }
  if (pipelined(stage, largestBytes(inputs))) {
    return enqueue(type, OpType::kReduceScatter, outputs, callOf(opts), stage,
                   [stage, inputs, outputs, dtypes, ops](Communicator& comm) {
                     for (size_t i = 0; i < inputs.size(); ++i) {
                       stage->pipelinedReduceScatter(comm, inputs[i], outputs[i], dtypes[i],
                                                     ops[i]);
                     }
                   }, "", inputs);
  }
  auto ins = flatten(inputs, stage.get());
  auto outs = flatten(outputs, stage.get(), /*read=*/false);
  const int size = getSize();
  return enqueue(type, OpType::kReduceScatter, outputs, callOf(opts), stage,
                 [ins, outs, dtypes, ops, size](Communicator& comm) {
                   for (size_t i = 0; i < ins.size(); ++i) {
                     const size_t count = static_cast<size_t>(outs[i].flat.numel());
                     auto blocks = blocksOf(static_cast<const void*>(ins[i].data()), size,
                                            count * elementSize(dtypes[i]));
                     ringdist::reduceScatter(comm, blocks.data(), outs[i].data(), count,
                                             dtypes[i], ops[i]);
                     outs[i].writeBack();
                   }
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  DataType dtype = checkTensors(op, {input, output});
  const int size = getSize();
  // Split sizes count rows of dim 0; an empty list means equal rows.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<uint64_t> out(static_cast<size_t>(size));
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
    if (splits.empty()) {
      RD_CHECK_INPUT(rows % size == 0, op, which, " has ", rows,
                     " rows, not divisible by the world size ", size,
                     "; pass split sizes");
      for (auto& c : out) c = static_cast<uint64_t>(rows / size * rowElems);
    } else {
      RD_CHECK_INPUT(static_cast<int>(splits.size()) == size, op, which, " split sizes have ",
                     splits.size(), " entries; the group has ", size, " ranks");
      int64_t sum = 0;
      for (size_t r = 0; r < splits.size(); ++r) {
        RD_CHECK_INPUT(splits[r] >= 0, op, which, " split size ", r, " is negative");
        out[r] = static_cast<uint64_t>(splits[r] * rowElems);
        sum += splits[r];
      }
      RD_CHECK_INPUT(sum == rows, op, which, " split sizes sum to ", sum, " but dim 0 has ", rows,
                     " rows");
    }
    return out;
  };
  auto sendCounts = counts(input, inputSplitSizes, "input");
  auto recvCounts = counts(output, outputSplitSizes, "output");
  auto stage = stageFor(op, {input, output});
  if (onSameGpu(stage, callOf(opts))) {
    return enqueue(c10d::OpType::ALLTOALL_BASE, OpType::kAlltoall, {output}, callOf(opts), stage,
                   [stage, input, output, sendCounts, recvCounts, dtype](Communicator& comm) {
                     stage->sameGpuAlltoall(comm, {input}, sendCounts, {output}, recvCounts,
                                            dtype);
                   }, "", {input});
  }
  Flat in(input, stage.get());
  Flat out(output, stage.get(), /*read=*/false);
  return enqueue(c10d::OpType::ALLTOALL_BASE, OpType::kAlltoall, {output},
                 callOf(opts), stage,
                 [in, out, sendCounts, recvCounts, dtype, size](Communicator& comm) {
                   size_t elem = elementSize(dtype);
                   std::vector<const void*> ins;
                   std::vector<void*> outs;
                   size_t sendOffset = 0, recvOffset = 0;
                   for (int r = 0; r < size; ++r) {
                     ins.push_back(static_cast<const char*>(in.data()) + sendOffset * elem);
                     outs.push_back(static_cast<char*>(out.data()) + recvOffset * elem);
                     sendOffset += sendCounts[static_cast<size_t>(r)];
                     recvOffset += recvCounts[static_cast<size_t>(r)];
                   }
                   ringdist::alltoall(comm, ins.data(), sendCounts, outs.data(), recvCounts, dtype);
                   out.writeBack();
                 }, "", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  const int size = getSize();
  RD_CHECK_INPUT(static_cast<int>(inputs.size()) == size && static_cast<int>(outputs.size()) == size,
                 op, "expected ", size, " input and output tensors, got ", inputs.size(), " and ",
                 outputs.size());
  DataType dtype = checkTensors(op, inputs);
  DataType outType = checkTensors(op, outputs);
  RD_CHECK_INPUT(dtype == outType, op, "inputs and outputs have different dtypes");
  std::vector<uint64_t> sendCounts, recvCounts;
  for (int r = 0; r < size; ++r) {
    sendCounts.push_back(static_cast<uint64_t>(inputs[static_cast<size_t>(r)].numel()));
    recvCounts.push_back(static_cast<uint64_t>(outputs[static_cast<size_t>(r)].numel()));
  }
  auto stage = stageFor(op, joined({inputs, outputs}));
  if (onSameGpu(stage, callOf(opts))) {
    return enqueue(c10d::OpType::ALLTOALL, OpType::kAlltoall, outputs, callOf(opts), stage,
                   [stage, inputs, outputs, sendCounts, recvCounts, dtype](Communicator& comm) {
                     stage->sameGpuAlltoall(comm, inputs, sendCounts, outputs, recvCounts, dtype);
                   }, "", inputs);
  }
  auto ins = flatten(inputs, stage.get());
  auto outs = flatten(outputs, stage.get(), /*read=*/false);
  return enqueue(c10d::OpType::ALLTOALL, OpType::kAlltoall, outputs, callOf(opts),
                 stage, [ins, outs, sendCounts, recvCounts, dtype](Communicator& comm) {
                   std::vector<const void*> inPtrs;
                   std::vector<void*> outPtrs;
                   for (const auto& i : ins) inPtrs.push_back(i.data());
                   for (const auto& o : outs) outPtrs.push_back(o.data());
                   ringdist::alltoall(comm, inPtrs.data(), sendCounts, outPtrs.data(), recvCounts,
                                      dtype);
                   for (const auto& o : outs) o.writeBack();
                 }, "", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(c10d::OpType::BARRIER, OpType::kBarrier, {}, callOf(opts),
                 nullptr, [](Communicator& comm) { ringdist::barrier(comm); });
}

// ---------------------------------------------------------------- point-to-point

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::sendRecv(bool isSend,
                                                              std::vector<at::Tensor>& tensors,
                                                              int peer, int tag) {
  const bool anySource = peer < 0;
  const char* op = isSend ? "send" : anySource ? "recv (any source)" : "recv";
  DataType dtype = checkTensors(op, tensors);
  RD_CHECK_INPUT(tensors.size() == 1, op, "expected one tensor, got ", tensors.size());
  RD_CHECK_INPUT(anySource || (peer < getSize() && peer != getRank()), op, "peer rank ", peer,
                 " is invalid (group size ", getSize(), ", own rank ", getRank(), ")");
  RD_CHECK_INPUT(!anySource || getSize() > 1, op, "a group of one rank has no other source");
  const auto type = isSend ? c10d::OpType::SEND
                           : anySource ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV;
  auto stage = stageFor(op, tensors);
  const uint64_t traceId =
      recorder_->add(isSend ? "send" : "recv", ++p2pSequence_,
                     anySource ? FlightRecorder::kAnySource : peer, tensors, tensors,
                     timeout_.count());
  at::Tensor user = tensors[0];
  const auto timeout = timeout_;
  if (isSend && stage && stage->sameGpuSendable(user)) {  // device to device, no host twin
    return worker_->enqueueTransfer(
        type, op, user, user, timeout_, traceId,
        [stage, user, dtype, peer, tag, timeout](PointToPoint& p2p, Worker::Moved moved) {
          stage->sameGpuSend(p2p, user, dtype, peer, tag, timeout, [moved] { moved(-1); });
        },
        stage);
  }
  at::Tensor flat = Flat(user, stage.get(), /*read=*/isSend).flat;
  const size_t bytes = static_cast<size_t>(flat.numel()) * elementSize(dtype);
  void* data = flat.data_ptr();
  // A CUDA receive takes a GPU message from a sender on its GPU, too.
  PointToPoint::OnDevice onDevice;
  if (stage) {
    onDevice = [stage, user, dtype, timeout](const DeviceMessage& message, int source) {
      stage->sameGpuReceive(message, source, user, dtype, timeout);
    };
  }
  return worker_->enqueueTransfer(
      type, op, user, flat, timeout_, traceId,
      [isSend, anySource, data, bytes, dtype, peer, tag, onDevice](PointToPoint& p2p,
                                                                   Worker::Moved moved) {
        if (isSend) {
          p2p.send(data, bytes, dtype, peer, tag, [moved] { moved(-1); });
        } else if (anySource) {
          p2p.recvAny(data, bytes, dtype, tag, moved, onDevice);
        } else {
          p2p.recv(data, bytes, dtype, peer, tag, [moved, peer] { moved(peer); }, onDevice);
        }
      },
      stage);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::send(std::vector<at::Tensor>& tensors,
                                                          int dstRank, int tag) {
  return sendRecv(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::recv(std::vector<at::Tensor>& tensors,
                                                          int srcRank, int tag) {
  RD_CHECK_INPUT(srcRank >= 0, "recv", "peer rank ", srcRank, " is invalid (group size ",
                 getSize(), ", own rank ", getRank(), ")");
  return sendRecv(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                   int tag) {
  return sendRecv(false, tensors, -1, tag);
}

namespace {

// Every group this process created, for shutdownAllBackends().
std::mutex gLiveMutex;
std::vector<c10::weak_intrusive_ptr<ProcessGroupRingdist>> gLive;

}  // namespace

void trackBackend(const c10::intrusive_ptr<ProcessGroupRingdist>& backend) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.erase(std::remove_if(gLive.begin(), gLive.end(), [](const auto& w) { return w.expired(); }),
              gLive.end());
  gLive.emplace_back(backend);
}

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                const std::string& bindIp) {
  auto backend = c10::make_intrusive<ProcessGroupRingdist>(store, rank, size, timeout, bindIp);
  trackBackend(backend);
  return backend;
}

ProcessGroupRingdist& ringdistOf(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                 const char* what) {
  TORCH_CHECK(group, what, ": the group is null");
  auto backend = group->getBackend(c10::DeviceType::CPU);
  auto* ringdist = dynamic_cast<ProcessGroupRingdist*>(backend.get());
  TORCH_CHECK(ringdist != nullptr, what, ": group '", group->getGroupName(), "' uses backend '",
              backend->getBackendName(), "', not ringdist");
  return *ringdist;
}

void shutdownAllBackends(bool waitForPeers) {
  std::vector<c10::intrusive_ptr<ProcessGroupRingdist>> live;
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    for (auto& weak : gLive) {
      if (auto strong = weak.lock()) live.push_back(std::move(strong));
    }
    gLive.clear();
  }
  for (auto& backend : live) {
    if (waitForPeers) {
      backend->shutdown();
    } else {
      backend->abort();
    }
  }
}


// ---------------------------------------------------------------- compressed allreduce

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduceCompressed(
    at::Tensor& tensor, const std::string& codecName, bool average,
    std::chrono::milliseconds timeout, const at::Tensor& residual) {
  const char* op = "compressed_allreduce";
  const Codec codec = checkCodec(op, codecName);
  checkTensors(op, {tensor});
  const auto type = tensor.scalar_type();
  RD_CHECK_INPUT(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf, op,
                 "the tensor has dtype ", type,
                 "; compressed allreduce takes float32, bfloat16 or float16");
  RD_CHECK_INPUT(!residual.defined() ||
                     (residual.scalar_type() == at::kFloat && residual.is_contiguous() &&
                      residual.numel() == tensor.numel() && residual.device() == tensor.device() &&
                      !residual.is_same(tensor)),
                 op, "the residual must be a contiguous float32 tensor of ", tensor.numel(),
                 " elements on ", tensor.device(), ", not the tensor itself; got ",
                 residual.defined() ? c10::str(residual.scalar_type(), " of ", residual.numel(),
                                               " elements on ", residual.device())
                                    : std::string("none"));
  std::string key = strCat(op, "/", ringdist::codecName(codec));
  auto stage = stageFor(op, {tensor});
  if (stage) {
    return enqueue(c10d::OpType::ALLREDUCE, OpType::kCompressedAllreduce, {tensor},
                   Call{effectiveTimeout(timeout)}, stage,
                   [stage, tensor, codec, average, residual](Communicator& comm) {
                     stage->compressedAllreduce(comm, tensor, codec, average, residual);
                   },
                   key);
  }
  Flat flat(tensor, nullptr);
  const bool widen = type != at::kFloat;
  size_t count = static_cast<size_t>(flat.flat.numel());
  return enqueue(c10d::OpType::ALLREDUCE, OpType::kCompressedAllreduce, {tensor},
                 Call{effectiveTimeout(timeout)}, nullptr,
                 [flat, widen, count, codec, average, residual](Communicator& comm) {
                   // Half inputs are summed in float32 like everything else;
                   // the one rounding back happens here.
                   at::Tensor work = widen ? flat.flat.to(at::kFloat) : flat.flat;
                   ringdist::compressedAllreduce(
                       comm, work.data_ptr<float>(), count, codec, average,
                       residual.defined() ? residual.data_ptr<float>() : nullptr);
                   if (widen) {
                     flat.flat.copy_(work);
                   }
                   flat.writeBack();
                 },
                 key);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingdist::allreduceCompressedEncoded(
    const at::Tensor& encoded, int64_t count, const std::string& codecName, bool average) {
  const char* op = "compressed_allreduce";
  const Codec codec = checkCodec(op, codecName);
  RD_CHECK_INPUT(encoded.device().is_cpu() && encoded.scalar_type() == at::kByte &&
                     encoded.is_contiguous() && count >= 0 &&
                     encoded.numel() == static_cast<int64_t>(
                                            encodedBytes(codec, static_cast<size_t>(count))),
                 op, "the encoding must be a contiguous uint8 CPU tensor of ",
                 encodedBytes(codec, static_cast<size_t>(std::max<int64_t>(count, 0))),
                 " bytes for ", count, " values");
  at::Tensor result = at::empty_like(encoded);
  return enqueue(c10d::OpType::ALLREDUCE, OpType::kCompressedAllreduce, {result},
                 Call{timeout_}, nullptr,
                 [encoded, result, count, codec, average](Communicator& comm) {
                   compressedAllreduceEncoded(comm, encoded.data_ptr(), result.data_ptr(),
                                              static_cast<size_t>(count), codec, average);
                 },
                 strCat(op, "/", ringdist::codecName(codec)));
}

}  // namespace ringdist
