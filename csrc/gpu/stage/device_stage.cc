#include "csrc/gpu/stage/device_stage.h"

#ifdef RINGDIST_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/stage_pieces.h"
#include "csrc/common/error.h"
#include "csrc/gpu/cuda/codec.h"
#include "csrc/gpu/cuda/same_gpu.h"
#include "csrc/gpu/device_allreduce.h"
#include "csrc/gpu/same_gpu.h"
#endif

namespace ringdist {

#ifndef RINGDIST_CUDA

std::unique_ptr<DeviceStages> makeDeviceStages(const CollectiveOptions&) { return nullptr; }

#else

namespace {

class Event {
 public:
  explicit Event(c10::DeviceIndex device) : device_(device) {
    c10::cuda::CUDAGuard guard(device_);
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~Event() {
    c10::cuda::CUDAGuard guard(device_);
    (void)cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream) { C10_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  // A never-recorded event counts as done (the CUDA rule): waiting is a no-op.
  void block(cudaStream_t stream) { C10_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  bool query() {
    cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    C10_CUDA_CHECK(status);
    return true;
  }

 private:
  c10::DeviceIndex device_;
  cudaEvent_t event_ = nullptr;
};

// The pinned twins of an operation's CUDA input and output, filled and
// drained while the engine's ring runs (StageGate), in the pieces
// StagePieces gives: each input piece goes to the host on the group's stream
// followed by an event that need() waits for; each full run of final output
// ranges goes back to the GPU. The copies are ATen's, so the caching host
// allocator knows the stream still uses the pinned memory. Where input and
// output are one buffer (allreduce), a range is final only after it was
// read, so its copy back queues after its copy out.
class PipelinedTwin final : public StageGate {
 public:
  static constexpr size_t kPieceBytes = 2 << 20;

  // Device tensors and their host twins; all contiguous, seen as bytes.
  PipelinedTwin(const at::Tensor& in, const at::Tensor& hostIn, const at::Tensor& out,
                const at::Tensor& hostOut, std::chrono::steady_clock::time_point deadline)
      : in_(bytesOf(in)), hostIn_(bytesOf(hostIn)), out_(bytesOf(out)),
        hostOut_(bytesOf(hostOut)), deadline_(deadline), pieces_(kPieceBytes) {}
  ~PipelinedTwin() override {
    for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);
  }

  // Pinned memory shaped like a CUDA tensor.
  static at::Tensor pinned(const at::Tensor& tensor) {
    return at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
  }

  void plan(const std::vector<std::pair<size_t, size_t>>& ranges) override {
    pieces_.plan(ranges, [&](size_t offset, size_t bytes) { copyOut(offset, bytes); });
  }

  void need(size_t offset, size_t) override {
    const size_t piece =
        pieces_.need(offset, [&](size_t at, size_t bytes) { copyOut(at, bytes); });
    cuda::waitForEvent(events_[piece], deadline_, "copy the tensor's next piece to host memory");
  }

  void produced(size_t offset, size_t length) override {
    pieces_.produced(offset, length, [&](size_t at, size_t bytes) { copyBack(at, bytes); });
  }

  // The final ranges still gathered go back to the GPU.
  void finish() {
    pieces_.finish([&](size_t at, size_t bytes) { copyBack(at, bytes); });
  }

 private:
  static at::Tensor bytesOf(const at::Tensor& tensor) { return tensor.view({-1}).view(at::kByte); }

  void copyOut(size_t offset, size_t bytes) {
    const auto at = static_cast<int64_t>(offset);
    const auto n = static_cast<int64_t>(bytes);
    hostIn_.narrow(0, at, n).copy_(in_.narrow(0, at, n), /*non_blocking=*/true);
    cudaEvent_t event = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.push_back(event);  // events_[k]: piece k's, pieces are copied out in order
    C10_CUDA_CHECK(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream().stream()));
  }
  void copyBack(size_t offset, size_t bytes) {
    const auto at = static_cast<int64_t>(offset);
    const auto n = static_cast<int64_t>(bytes);
    out_.narrow(0, at, n).copy_(hostOut_.narrow(0, at, n), /*non_blocking=*/true);
  }

  at::Tensor in_;  // bytes, on the group's stream
  at::Tensor hostIn_;
  at::Tensor out_;
  at::Tensor hostOut_;
  const std::chrono::steady_clock::time_point deadline_;
  StagePieces pieces_;
  std::vector<cudaEvent_t> events_;
};

// The streams of a group's device messages on one GPU, made on first use
// (the worker's only): their own, not the pool's, which other code shares.
class MessageStreams {
 public:
  enum Kind { kPost = 0, kTaken = 1, kReceive = 2 };
  explicit MessageStreams(c10::DeviceIndex device) : device_(device) {}
  ~MessageStreams() {
    c10::cuda::CUDAGuard guard(device_);
    for (auto& [key, stream] : streams_) (void)cudaStreamDestroy(stream);
  }
  c10::cuda::CUDAStream get(Kind kind, int peer) {
    cudaStream_t& stream = streams_[{kind, peer}];
    if (stream == nullptr) {
      c10::cuda::CUDAGuard guard(device_);
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    return c10::cuda::getStreamFromExternal(stream, device_);
  }

 private:
  c10::DeviceIndex device_;
  std::map<std::pair<int, int>, cudaStream_t> streams_;
};

// What a group keeps per GPU: its stream (issue order on the GPU), a waiter
// for host-side waits, the same-GPU collectives and messages, and the
// same-host device allreduce's shared buffers.
struct DeviceLane {
  DeviceLane(c10::DeviceIndex device, const CollectiveOptions& options)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)),
        waiter(device),
        messageStreams(device),
        sameGpuDevice(new cuda::SameGpuDevice(device)),
        sameGpu(std::unique_ptr<SameGpuPlatform>(sameGpuDevice)),
        allreduce(device, options.deviceBufferBytes) {}
  c10::cuda::CUDAStream stream;
  cuda::StreamWaiter waiter;  // used by the worker thread only
  MessageStreams messageStreams;  // outlives sameGpu, which releases their waits
  cuda::SameGpuDevice* sameGpuDevice;  // owned by sameGpu
  SameGpu sameGpu;            // the worker's...
  std::atomic<int> sameGpuReady{-1};  // ...and its verdict for the issuing threads
  DeviceAllreduce allreduce;
};

class CudaStage final : public DeviceStage {
 public:
  CudaStage(const c10::Device& device, std::shared_ptr<DeviceLane> lane)
      : device_(device),
        lane_(std::move(lane)),
        stream_(lane_->stream),
        issued_(device.index()),
        done_(device.index()) {
    c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(caller, &capture));
    capturing_ = capture != cudaStreamCaptureStatusNone;
    if (!capturing_) issued_.record(caller);
  }

  bool callerCapturing() const override { return capturing_; }

  c10::Device device() const override { return device_; }

  at::Tensor hostTwin(const at::Tensor& tensor, bool read) override {
    // The group's stream uses the memory: the caching allocator must not
    // hand it out again before that stream's work on it is done.
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
    at::Tensor host = at::empty(tensor.sizes(),
                                tensor.options().device(at::kCPU).pinned_memory(true));
    if (read) {
      reads_.emplace_back(tensor, host);
    }
    return host;
  }

  void stageIn(std::chrono::steady_clock::time_point deadline) override {
    const bool reads = !reads_.empty();
    {
      c10::cuda::CUDAStreamGuard guard(stream_);
      issued_.block(stream_.stream());
      for (auto& [device, host] : reads_) {
        host.copy_(device, /*non_blocking=*/true);
      }
    }
    reads_.clear();
    if (reads) {  // else nothing on the host reads GPU memory: stream order suffices
      drain(deadline, "finish the work queued before this operation and copy its inputs to "
                      "host memory");
    }
  }

  void compressedAllreduce(Communicator& comm, const at::Tensor& tensor, Codec codec,
                           bool average, const at::Tensor& residual) override {
    const size_t count = static_cast<size_t>(tensor.numel());
    const cudaStream_t stream = stream_.stream();
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
    // Half tensors are summed in float32 like everything else; the one
    // rounding back happens at the end.
    at::Tensor values = tensor.scalar_type() == at::kFloat && tensor.is_contiguous()
                            ? tensor
                            : tensor.to(at::kFloat).contiguous();
    const auto bytes = static_cast<int64_t>(encodedBytes(codec, count));
    at::Tensor wire = at::empty({bytes}, tensor.options().dtype(at::kByte));
    auto pinned = wire.options().device(at::kCPU).pinned_memory(true);
    at::Tensor hostIn = at::empty({bytes}, pinned);
    at::Tensor hostOut = at::empty({bytes}, pinned);
    if (count > 0) {
      at::Tensor lost = residual;  // a handle: the ATen ops take non-const ones
      if (lost.defined()) {
        c10::cuda::CUDACachingAllocator::recordStream(lost.storage().data_ptr(), stream_);
        values.add_(lost.view_as(values));
      }
      cuda::encode(codec, values.data_ptr<float>(), count, wire.data_ptr(), stream);
      if (lost.defined()) {  // what the encoding lost, as codec_roundtrip computes it
        cuda::decode(codec, wire.data_ptr(), count, lost.data_ptr<float>(), stream);
        at::sub_out(lost, values.view_as(lost), lost);
      }
      hostIn.copy_(wire, /*non_blocking=*/true);
    }
    drain(comm.deadline(), "encode the tensor and copy its encoding to host memory");
    compressedAllreduceEncoded(comm, hostIn.data_ptr(), hostOut.data_ptr(), count, codec, average);
    if (count > 0) {
      wire.copy_(hostOut, /*non_blocking=*/true);
      cuda::decode(codec, wire.data_ptr(), count, values.data_ptr<float>(), stream);
      if (!values.is_same(tensor)) {
        tensor.copy_(values);
      }
    }
  }

  void allreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                 ReduceOp op) override {
    at::Tensor flat = onOurStream(tensor);
    lane_->allreduce.run(comm, flat.data_ptr(), static_cast<size_t>(flat.numel()), dtype, op,
                         stream_.stream());
    copyBack(flat, tensor);
  }

  void pipelinedAllreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                          ReduceOp op) override {
    at::Tensor flat = onOurStream(tensor);
    at::Tensor host = PipelinedTwin::pinned(flat);
    PipelinedTwin twin(flat, host, flat, host, comm.deadline());
    ringdist::allreduce(comm, host.data_ptr(), static_cast<size_t>(flat.numel()), dtype, op,
                        &twin);
    twin.finish();
    copyBack(flat, tensor);
  }

  // The own block goes device to device (not at all in place, as FSDP2 calls
  // it); its host twin is the engine's input, so only peers' blocks come back.
  void pipelinedAllgather(Communicator& comm, const at::Tensor& input, const at::Tensor& output,
                          DataType dtype) override {
    at::Tensor in = onOurStream(input).view({-1});
    at::Tensor out = onOurStream(output).view({-1});
    const int64_t count = in.numel();
    at::Tensor own = out.narrow(0, comm.rank() * count, count);
    if (own.data_ptr() != in.data_ptr()) own.copy_(in, /*non_blocking=*/true);
    at::Tensor hostOut = PipelinedTwin::pinned(out);
    at::Tensor hostIn = hostOut.narrow(0, comm.rank() * count, count);
    PipelinedTwin twin(in, hostIn, out, hostOut, comm.deadline());
    std::vector<void*> outputs =
        blocksOf(hostOut.data_ptr(), comm.size(), hostIn.nbytes());
    ringdist::allgather(comm, hostIn.data_ptr(), outputs.data(), static_cast<size_t>(count),
                        dtype, &twin);
    twin.finish();
    copyBack(out.view(output.sizes()), output);
  }

  void pipelinedReduceScatter(Communicator& comm, const at::Tensor& input,
                              const at::Tensor& output, DataType dtype, ReduceOp op) override {
    at::Tensor in = onOurStream(input);
    at::Tensor out = onOurStream(output);
    at::Tensor hostIn = PipelinedTwin::pinned(in);
    at::Tensor hostOut = PipelinedTwin::pinned(out);
    PipelinedTwin twin(in, hostIn, out, hostOut, comm.deadline());
    std::vector<const void*> inputs =
        blocksOf(static_cast<const void*>(hostIn.data_ptr()), comm.size(), hostOut.nbytes());
    ringdist::reduceScatter(comm, inputs.data(), hostOut.data_ptr(),
                            static_cast<size_t>(out.numel()), dtype, op, &twin);
    twin.finish();
    copyBack(out, output);
  }

  int sameGpu() const override { return lane_->sameGpuReady.load(); }

  void setUpSameGpu(Communicator& comm) override {
    lane_->sameGpuReady.store(lane_->sameGpu.setUp(comm) ? 1 : 0);
  }

  void sameGpuAllreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                        ReduceOp op) override {
    at::Tensor flat = onOurStream(tensor);
    lane_->sameGpu.allreduce(comm, *queue(), flat.data_ptr(), static_cast<size_t>(flat.numel()),
                             dtype, op);
    copyBack(flat, tensor);
  }

  void sameGpuReduceScatter(Communicator& comm, const at::Tensor& input, const at::Tensor& output,
                            DataType dtype, ReduceOp op) override {
    at::Tensor in = onOurStream(input);
    at::Tensor out = onOurStream(output);
    lane_->sameGpu.reduceScatter(comm, *queue(), in.data_ptr(), out.data_ptr(),
                                 static_cast<size_t>(out.numel()), dtype, op);
    copyBack(out, output);
  }

  void sameGpuAllgather(Communicator& comm, const at::Tensor& input,
                        const std::vector<at::Tensor>& outputs, DataType dtype) override {
    at::Tensor in = onOurStream(input);
    at::Tensor out = packed(outputs, /*read=*/false);
    lane_->sameGpu.allgather(comm, *queue(), in.data_ptr(), out.data_ptr(),
                             static_cast<size_t>(in.numel()), dtype);
    unpack(out, outputs);
  }

  void sameGpuBroadcast(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                        int root) override {
    at::Tensor flat = onOurStream(tensor);
    lane_->sameGpu.broadcast(comm, *queue(), flat.data_ptr(), static_cast<size_t>(flat.numel()),
                             dtype, root);
    copyBack(flat, tensor);
  }

  void sameGpuReduce(Communicator& comm, const at::Tensor& tensor, DataType dtype, ReduceOp op,
                     int root) override {
    at::Tensor flat = onOurStream(tensor);
    lane_->sameGpu.reduce(comm, *queue(), flat.data_ptr(), static_cast<size_t>(flat.numel()),
                          dtype, op, root);
    copyBack(flat, tensor);
  }

  void sameGpuAlltoall(Communicator& comm, const std::vector<at::Tensor>& inputs,
                       const std::vector<uint64_t>& sendCounts,
                       const std::vector<at::Tensor>& outputs,
                       const std::vector<uint64_t>& recvCounts, DataType dtype) override {
    at::Tensor in = packed(inputs, /*read=*/true);
    at::Tensor out = packed(outputs, /*read=*/false);
    lane_->sameGpu.alltoall(comm, *queue(), in.data_ptr(), sendCounts, out.data_ptr(), recvCounts,
                            dtype);
    unpack(out, outputs);
  }

  bool sameGpuSendable(const at::Tensor& tensor) override {
    if (sameGpu() != 1 || !tensor.is_contiguous()) return false;
    if (tensor.nbytes() == 0) return true;
    MemoryRecord record{};
    std::string why;
    return lane_->sameGpuDevice->lend(tensor.data_ptr(), tensor.nbytes(), &record, &why);
  }

  void sameGpuSend(PointToPoint& p2p, const at::Tensor& tensor, DataType dtype, int peer, int tag,
                   std::chrono::milliseconds timeout, PointToPoint::Done done) override {
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream post = lane_->messageStreams.get(MessageStreams::kPost, peer);
    const c10::cuda::CUDAStream taken = lane_->messageStreams.get(MessageStreams::kTaken, peer);
    issued_.block(post.stream());  // the data is in place where the caller's stream got to
    // The receiver reads the memory until `taken` gets past its wait.
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), taken);
    std::string why;
    RINGDIST_CHECK(lane_->sameGpu.send(*queueOn(post), *queueOn(taken), tensor.data_ptr(),
                                       tensor.nbytes(), dtype, peer,
                                       std::chrono::steady_clock::now() + timeout, &message_, &why),
                   "ringdist send: the tensor to rank ", peer, " cannot be lent: ", why);
    side_ = taken.stream();
    p2p.sendDevice(&message_, tensor.nbytes(), dtype, peer, tag, std::move(done));
  }

  void sameGpuReceive(const DeviceMessage& message, int source, const at::Tensor& tensor,
                      DataType dtype, std::chrono::milliseconds timeout) override {
    RINGDIST_CHECK(sameGpu() == 1, "ringdist recv: a GPU message from rank ", source,
                   " arrived before this rank's same-GPU set-up finished");
    c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream stream = lane_->messageStreams.get(MessageStreams::kReceive, source);
    c10::cuda::CUDAStreamGuard onStream(stream);  // a temporary below is this stream's
    issued_.block(stream.stream());
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream);
    at::Tensor into = tensor.is_contiguous() ? tensor : at::empty(tensor.sizes(), tensor.options());
    lane_->sameGpu.receive(*queueOn(stream), message, source, into.data_ptr(), into.nbytes(), dtype,
                           std::chrono::steady_clock::now() + timeout);
    if (!into.is_same(tensor)) tensor.copy_(into, /*non_blocking=*/true);
    side_ = stream.stream();
  }

  bool onDevice() const override { return side_ != nullptr; }

  void onStream(const std::function<void()>& fn) override {
    c10::cuda::CUDAStreamGuard guard(stream_);
    fn();
  }

  void recordDone() override {
    c10::cuda::CUDAGuard guard(device_);
    done_.record(side_ != nullptr ? side_ : stream_.stream());
  }

  void blockCurrentStream() override {
    c10::cuda::CUDAGuard guard(device_);
    done_.block(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
  }

  bool deviceDone() override {
    c10::cuda::CUDAGuard guard(device_);
    return done_.query();
  }

 private:
  // The tensor, contiguous, for use on the group's stream (the body runs with
  // it current): the caching allocator must not hand the memory out again
  // before the stream is done with it.
  at::Tensor onOurStream(const at::Tensor& tensor) {
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
    return tensor.is_contiguous() ? tensor : tensor.contiguous();
  }
  void copyBack(const at::Tensor& flat, const at::Tensor& tensor) {
    if (!flat.is_same(tensor)) tensor.copy_(flat, /*non_blocking=*/true);
  }
  // One contiguous buffer for a tensor list: the tensor itself when there is
  // one; else the tensors one after another, copied in if the op reads them.
  at::Tensor packed(const std::vector<at::Tensor>& tensors, bool read) {
    if (tensors.size() == 1) return onOurStream(tensors[0]);
    std::vector<at::Tensor> flat;
    int64_t total = 0;
    for (const auto& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
      if (read) flat.push_back(t.reshape({-1}));
      total += t.numel();
    }
    return read ? at::cat(flat) : at::empty({total}, tensors[0].options());
  }
  // The results in `buffer` back into the tensors packed() stood for.
  void unpack(const at::Tensor& buffer, const std::vector<at::Tensor>& tensors) {
    if (tensors.size() == 1) {
      copyBack(buffer, tensors[0]);
      return;
    }
    int64_t at = 0;
    for (const auto& t : tensors) {
      t.copy_(buffer.narrow(0, at, t.numel()).view(t.sizes()), /*non_blocking=*/true);
      at += t.numel();
    }
  }
  std::unique_ptr<SignalQueue> queue() { return queueOn(stream_); }
  std::unique_ptr<SignalQueue> queueOn(const c10::cuda::CUDAStream& stream) {
    return lane_->sameGpuDevice->queueOn(stream.stream());
  }

  // Waits, bounded by the op's deadline, for what the group's stream has
  // queued so far: the host is about to read what it copied out.
  void drain(std::chrono::steady_clock::time_point deadline, const char* what) {
    lane_->waiter.wait(stream_.stream(), deadline, what);
  }

  c10::Device device_;
  std::shared_ptr<DeviceLane> lane_;
  c10::cuda::CUDAStream stream_;
  Event issued_;
  Event done_;
  bool capturing_ = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> reads_;  // (CUDA tensor, host twin)
  // A device message's: the stream its completion is recorded on, and what
  // the send tells the receiver (kept until it has left).
  cudaStream_t side_ = nullptr;
  DeviceMessage message_{};
};

class CudaStages final : public DeviceStages {
 public:
  explicit CudaStages(const CollectiveOptions& options) : options_(options) {}

  std::shared_ptr<DeviceStage> begin(const c10::Device& device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& lane = lanes_[device.index()];
    if (lane == nullptr) {
      lane = std::make_shared<DeviceLane>(device.index(), options_);
    }
    return std::make_shared<CudaStage>(device, lane);
  }

 private:
  const CollectiveOptions options_;
  std::mutex mutex_;
  std::map<c10::DeviceIndex, std::shared_ptr<DeviceLane>> lanes_;
};

}  // namespace

std::unique_ptr<DeviceStages> makeDeviceStages(const CollectiveOptions& options) {
  return std::make_unique<CudaStages>(options);
}

#endif

}  // namespace ringdist
