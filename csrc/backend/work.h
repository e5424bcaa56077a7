#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "csrc/gpu/stage/device_stage.h"

namespace ringdist {

// One queued operation. Completed by the backend's worker thread; wait()
// blocks the caller, getFuture() holds the output tensors (DDP calls it on
// every step) or the error. On CUDA tensors (`stage`, gpu/stage/device_stage.h),
// wait() and synchronize() also make the caller's current stream wait for the
// op's device work, and the future is CUDA-aware (completed on the group's
// stream), as NCCL's are.
class RingdistWork : public c10d::Work {
 public:
  RingdistWork(int rank, c10d::OpType opType, const char* profilingTitle,
               std::vector<at::Tensor> outputs, std::shared_ptr<DeviceStage> stage = nullptr);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Receives: the rank the message came from (dist.recv returns it).
  int sourceRank() const override;
  void setSourceRank(int rank);

  DeviceStage* stage() const { return stage_.get(); }
  void markSuccess();
  void markError(std::exception_ptr error);

 private:
  // Records the outcome and returns the future to finish (null if not made yet).
  c10::intrusive_ptr<c10::ivalue::Future> end(std::exception_ptr error);
  // Marks the Work completed: wait() returns.
  void wakeWaiters();

  std::vector<at::Tensor> outputs_;
  std::shared_ptr<DeviceStage> stage_;
  int sourceRank_ = -1;
  bool ended_ = false;  // the outcome is known; completed_ follows once the future has it
  // Made on first getFuture() for host tensors (a synchronous call never asks, and
  // completing a future costs about a microsecond); at once for CUDA tensors, whose
  // future must be completed on the group's stream.
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ringdist
