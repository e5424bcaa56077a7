#pragma once

// The platform of the same-GPU collectives (csrc/gpu/same_gpu.h) on a CUDA
// device, implementing csrc/gpu/platform/same_gpu_platform.h (this layer sees
// nothing of collectives/): tensors lent as (cudaIpcMemHandle_t of their
// allocation, offset) and opened with cudaIpcOpenMemHandle; the signal page
// registered with cudaHostRegister; queues that are CUDA streams, whose
// signals are stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32, reached through cudaGetDriverEntryPointByVersion as
// torch reaches the driver, so nothing links libcuda) and whose combine is the
// fused kernel. Built only with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "csrc/common/types.h"
#include "csrc/gpu/platform/fused.h"
#include "csrc/gpu/platform/same_gpu_platform.h"

namespace ringdist {
namespace cuda {

class SameGpuDevice final : public SameGpuPlatform {
 public:
  explicit SameGpuDevice(int device);
  ~SameGpuDevice() override;

  bool lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) override;
  void* scratch(int slot, size_t bytes) override;
  void* open(const MemoryRecord& record) override;
  void close(void* base) noexcept override;
  // Registers the page and tries a write and a wait on it (a device without
  // stream memory operations fails here, at set-up, not in a call).
  void attach(SharedPage& page, int rank) override;
  void detach(SharedPage& page) noexcept override;
  std::array<uint8_t, 16> deviceId() override;
  bool reaches(const std::array<uint8_t, 16>& device) override;

  // The queue of one operation: `stream` (the group's), on this device.
  std::unique_ptr<SignalQueue> queueOn(cudaStream_t stream);

 private:
  class StreamQueue;
  void probe(SharedPage& page, int rank);
  const int device_;
  char* pageHost_ = nullptr;    // the attached page, as the host sees it
  char* pageDevice_ = nullptr;  // and as the GPU does
  uint32_t* abortLatch_ = nullptr;  // device memory: the page's abort word, copied per pass
  // cudaMalloc'ed scratch per slot, the latest (largest) last. Older ones stay
  // until the group ends: the leader may still have them mapped.
  std::vector<std::pair<void*, size_t>> scratch_[2];
};

// The fused pass of args (fused.h) as one kernel on stream, combining as
// (dtype, op); args' pointers are device addresses, args.abort the mapped host
// word, copied first into `latch` (device memory) for the kernel to read.
// Throws on a launch error.
void fusedPass(const FusedArgs& args, uint32_t* latch, DataType dtype, ReduceOp op,
               cudaStream_t stream);

}  // namespace cuda
}  // namespace ringdist
