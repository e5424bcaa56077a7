#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "csrc/codec/codec.h"
#include "csrc/collectives/communicator.h"
#include "csrc/collectives/p2p.h"

namespace ringdist {

// Whether this build holds ringdist's CUDA code (csrc/gpu/cuda/, RINGDIST_CUDA).
#ifdef RINGDIST_CUDA
constexpr bool kCudaCompiled = true;
#else
constexpr bool kCudaCompiled = false;
#endif

// The CUDA side of one operation on CUDA tensors. The engine works on host
// memory, so each CUDA tensor gets a pinned host twin, with NCCL's stream
// semantics around it:
//  - issue (caller's thread): an event on the caller's current stream; the
//    twins are allocated and the tensors recorded on the group's stream for
//    the caching allocator;
//  - stageIn (worker, before the body): the group's stream waits for that
//    event and copies the tensors the op reads into their twins; the worker
//    waits for the copies, bounded by the op's deadline. Doing this on the
//    worker, not at issue, orders it after the copy-back of every earlier op
//    of the group, as one NCCL stream would;
//  - onStream: the body and the copy-back (Flat::writeBack) run with the
//    group's stream current, so the copies back queue there;
//  - recordDone: the op's completion event, after the copy-back; the Work's
//    wait()/synchronize() make the caller's current stream wait for it.
// Operations on CPU tensors have no stage.
class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  virtual c10::Device device() const = 0;
  // Whether the caller's stream is capturing a CUDA graph: every path hands
  // off through the host at each call, so a replayed graph would not; the
  // call is refused.
  virtual bool callerCapturing() const = 0;
  // Pinned host memory shaped like `tensor`; filled by stageIn() if `read`.
  virtual at::Tensor hostTwin(const at::Tensor& tensor, bool read) = 0;
  virtual void stageIn(std::chrono::steady_clock::time_point deadline) = 0;
  virtual void onStream(const std::function<void()>& fn) = 0;
  virtual void recordDone() = 0;
  // The caller's current stream waits for the completion event.
  virtual void blockCurrentStream() = 0;
  // Whether the device work of the op has finished (after recordDone()).
  virtual bool deviceDone() = 0;

  // The compressed allreduce of a CUDA float tensor, run as the body (the
  // group's stream current): encoded on the GPU, only the encoding copied to
  // and from pinned host memory around the engine's encoded form
  // (compressedAllreduceEncoded), decoded on the GPU. residual (undefined: none) is added to
  // the tensor, then gets what the encoding lost, on the GPU.
  virtual void compressedAllreduce(Communicator& comm, const at::Tensor& tensor, Codec codec,
                                   bool average, const at::Tensor& residual) = 0;

  // The allreduce of a CUDA tensor when every rank of the group is on this
  // host, run as the body: device to device through memory the ranks share
  // (csrc/gpu/device_allreduce.h); no host twin.
  virtual void allreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                         ReduceOp op) = 0;

  // The allreduce of a CUDA tensor through pinned host memory (across hosts),
  // run as the body: copied to the host piece by piece in the order the ring
  // reads it and back as each piece is final, so the copies overlap the
  // network (StageGate, collectives.h); no host twin of the stage's own.
  virtual void pipelinedAllreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                                  ReduceOp op) = 0;
  // all_gather_into_tensor and reduce_scatter_tensor the same way.
  virtual void pipelinedAllgather(Communicator& comm, const at::Tensor& input,
                                  const at::Tensor& output, DataType dtype) = 0;
  virtual void pipelinedReduceScatter(Communicator& comm, const at::Tensor& input,
                                      const at::Tensor& output, DataType dtype, ReduceOp op) = 0;

  // Ranks sharing one GPU (csrc/gpu/same_gpu.h). sameGpu(): -1 until
  // the group's set-up ran, then whether its collectives on this device go
  // this way. setUpSameGpu is that set-up, run as an operation of its own
  // before the group's first collective on the device.
  virtual int sameGpu() const = 0;
  virtual void setUpSameGpu(Communicator& comm) = 0;
  // The same-GPU collectives, run as the body: queued on the group's stream
  // with no host wait, no host twin. count/blocks follow the tensors' sizes.
  virtual void sameGpuAllreduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                                ReduceOp op) = 0;
  virtual void sameGpuReduceScatter(Communicator& comm, const at::Tensor& input,
                                    const at::Tensor& output, DataType dtype, ReduceOp op) = 0;
  // outputs: one tensor holding every rank's block, or one tensor per rank.
  virtual void sameGpuAllgather(Communicator& comm, const at::Tensor& input,
                                const std::vector<at::Tensor>& outputs, DataType dtype) = 0;
  virtual void sameGpuBroadcast(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                                int root) = 0;
  virtual void sameGpuReduce(Communicator& comm, const at::Tensor& tensor, DataType dtype,
                             ReduceOp op, int root) = 0;
  // inputs and outputs: one tensor each (all_to_all_single), or one per rank;
  // counts in elements, per rank.
  virtual void sameGpuAlltoall(Communicator& comm, const std::vector<at::Tensor>& inputs,
                               const std::vector<uint64_t>& sendCounts,
                               const std::vector<at::Tensor>& outputs,
                               const std::vector<uint64_t>& recvCounts, DataType dtype) = 0;

  // Point-to-point on the device among ranks sharing a GPU (same_gpu.h's
  // messages): each peer has a stream for posting sends, one for waiting for
  // them to be taken and one for receiving, so a message never waits behind
  // another's wait, and the op's completion event is recorded there (no
  // host twin, no copy back). sameGpuSendable: sameGpu() said yes and the
  // tensor is contiguous memory that can be lent (else the send is staged:
  // every CUDA receive takes both forms).
  virtual bool sameGpuSendable(const at::Tensor& tensor) = 0;
  // The transfer's post (worker): queues the send on the peer's streams and
  // sends its DeviceMessage through p2p.
  virtual void sameGpuSend(PointToPoint& p2p, const at::Tensor& tensor, DataType dtype, int peer,
                           int tag, std::chrono::milliseconds timeout,
                           PointToPoint::Done done) = 0;
  // A CUDA receive's onDevice (worker): queues the copy from the sender's
  // memory into `tensor` on the source's stream.
  virtual void sameGpuReceive(const DeviceMessage& message, int source, const at::Tensor& tensor,
                              DataType dtype, std::chrono::milliseconds timeout) = 0;
  // Whether the op's transfer went device to device (nothing to copy back).
  virtual bool onDevice() const = 0;
};

// One per process group: one stream per device, so the group's operations
// stay in issue order on the GPU too.
class DeviceStages {
 public:
  virtual ~DeviceStages() = default;
  virtual std::shared_ptr<DeviceStage> begin(const c10::Device& device) = 0;
};

// Null when the extension was built without CUDA. Reads the device* settings.
std::unique_ptr<DeviceStages> makeDeviceStages(const CollectiveOptions& options);

}  // namespace ringdist
