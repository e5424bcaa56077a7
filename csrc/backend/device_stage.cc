#include "csrc/backend/device_stage.h"

#ifdef RINGDIST_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"
#include "csrc/cuda/codec.h"
#endif

namespace ringdist {

#ifndef RINGDIST_CUDA

std::unique_ptr<DeviceStages> makeDeviceStages() { return nullptr; }

#else

namespace {

// Longest sleep between polls while the worker waits for the GPU.
constexpr auto kMaxPoll = std::chrono::microseconds(200);

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

class CudaStage final : public DeviceStage {
 public:
  CudaStage(const c10::Device& device, c10::cuda::CUDAStream stream)
      : device_(device), stream_(stream), issued_(device.index()), done_(device.index()) {
    c10::cuda::CUDAGuard guard(device_);
    issued_.record(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
  }

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
    {
      c10::cuda::CUDAStreamGuard guard(stream_);
      issued_.block(stream_.stream());
      for (auto& [device, host] : reads_) {
        host.copy_(device, /*non_blocking=*/true);
      }
    }
    reads_.clear();
    drain(deadline, "finish the work queued before this operation and copy its inputs to host "
                    "memory");
  }

  void compressedAllreduce(Communicator& comm, const at::Tensor& tensor, Codec codec,
                           bool average) override {
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
      cuda::encode(codec, values.data_ptr<float>(), count, wire.data_ptr(), stream);
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

  void onStream(const std::function<void()>& fn) override {
    c10::cuda::CUDAStreamGuard guard(stream_);
    fn();
  }

  void recordDone() override {
    c10::cuda::CUDAGuard guard(device_);
    done_.record(stream_.stream());
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
  // Waits, bounded by the op's deadline, for what the group's stream has
  // queued so far: the host is about to read what it copied out.
  void drain(std::chrono::steady_clock::time_point deadline, const char* what) {
    Event drained(device_.index());
    drained.record(stream_.stream());
    auto sleep = std::chrono::microseconds(1);
    while (!drained.query()) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(strCat("Timed out waiting for ", device_, " to ", what));
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxPoll));
    }
  }

  c10::Device device_;
  c10::cuda::CUDAStream stream_;
  Event issued_;
  Event done_;
  std::vector<std::pair<at::Tensor, at::Tensor>> reads_;  // (CUDA tensor, host twin)
};

class CudaStages final : public DeviceStages {
 public:
  std::shared_ptr<DeviceStage> begin(const c10::Device& device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(device.index());
    if (it == streams_.end()) {
      it = streams_.emplace(device.index(),
                            c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()))
               .first;
    }
    return std::make_shared<CudaStage>(device, it->second);
  }

 private:
  std::mutex mutex_;
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams_;
};

}  // namespace

std::unique_ptr<DeviceStages> makeDeviceStages() { return std::make_unique<CudaStages>(); }

#endif

}  // namespace ringdist
