#pragma once

// Allreduce of GPU memory among the ranks of one host, device to device:
// every rank shares one device buffer with the others through CUDA IPC, and
// the data never leaves the GPU(s). Several ranks may share one GPU (what
// NCCL refuses). Built only with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/communicator.h"
#include "csrc/gpu/cuda/ipc.h"

namespace ringdist {

// One group's device buffers on one GPU, set up by the first allreduce that
// uses them (every rank of the group reaches it at the same operation).
class DeviceAllreduce {
 public:
  // bufferBytes: this rank's shared buffer; the group uses the smallest.
  DeviceAllreduce(int device, size_t bufferBytes);
  ~DeviceAllreduce();

  // In place on `count` elements of device memory at `data`, queued on
  // `stream` and finished (the host waited) on return. Results are bit for
  // bit those of ringdist::allreduce on the same values in host memory.
  // Every rank of the group must be on this host.
  void run(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
           cudaStream_t stream);

 private:
  enum class State { kNew, kReady, kUnusable };
  void setUp(Communicator& comm);
  // header: the op's, exchanged as the first barrier (first piece only).
  void runPiece(Communicator& comm, char* data, size_t offset, size_t length, size_t count,
                DataType dtype, ReduceOp op, cudaStream_t stream, const OpHeader* header);
  void runStaged(Communicator& comm, char* data, size_t count, DataType dtype, ReduceOp op,
                 cudaStream_t stream);
  void waitFor(Communicator& comm, cudaStream_t stream, const char* what);

  const int device_;
  const size_t bufferBytes_;
  State state_ = State::kNew;
  size_t pieceBytes_ = 0;                      // the group's smallest buffer
  std::unique_ptr<cuda::SharedBuffer> mine_;
  std::vector<std::unique_ptr<cuda::MappedBuffer>> mapped_;  // by rank; null for us
  std::vector<char*> buffers_;                 // by rank, in our address space
  cuda::StreamWaiter waiter_;
  void* pinned_ = nullptr;                     // staging, if IPC was unusable
  size_t pinnedBytes_ = 0;
};

}  // namespace ringdist
