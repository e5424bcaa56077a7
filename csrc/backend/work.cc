#include "csrc/backend/work.h"

#include <c10/util/Exception.h>

namespace ringdist {

RingdistWork::RingdistWork(int rank, c10d::OpType opType, const char* profilingTitle,
                           std::vector<at::Tensor> outputs)
    : c10d::Work(rank, opType, profilingTitle),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

bool RingdistWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool RingdistWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr RingdistWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> RingdistWork::result() { return outputs_; }

bool RingdistWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == ::kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("ringdist ", c10d::opTypeToString(retrieveOpType()),
                             ": Timed out after ", timeout.count(),
                             " ms in Work.wait(timeout); the operation is still running"));
  }
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

int RingdistWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(sourceRank_ >= 0, "ringdist ", c10d::opTypeToString(retrieveOpType()),
              ": the source rank is known only for a completed receive");
  return sourceRank_;
}

void RingdistWork::setSourceRank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  sourceRank_ = rank;
}

void RingdistWork::markSuccess() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
  }
  cv_.notify_all();
  future_->markCompleted(c10::IValue(outputs_));
}

void RingdistWork::markError(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
  future_->setError(error);
}

}  // namespace ringdist
