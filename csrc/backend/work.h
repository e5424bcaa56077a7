#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace ringdist {

// One queued operation. Completed by the backend's worker thread; wait()
// blocks the caller, getFuture() holds the output tensors (DDP calls it on
// every step) or the error.
class RingdistWork : public c10d::Work {
 public:
  RingdistWork(int rank, c10d::OpType opType, const char* profilingTitle,
               std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Receives: the rank the message came from (dist.recv returns it).
  int sourceRank() const override;
  void setSourceRank(int rank);

  void markSuccess();
  void markError(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  int sourceRank_ = -1;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ringdist
