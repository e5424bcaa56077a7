#include "csrc/backend/work.h"

#include <c10/util/Exception.h>

namespace ringdist {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> makeFuture(const DeviceStage* stage) {
  auto type = c10::ListType::create(c10::TensorType::get());
  if (stage == nullptr) {
    return c10::make_intrusive<c10::ivalue::Future>(type);
  }
  return c10::make_intrusive<c10::ivalue::Future>(type, std::vector<c10::Device>{stage->device()});
}

}  // namespace

RingdistWork::RingdistWork(int rank, c10d::OpType opType, const char* profilingTitle,
                           std::vector<at::Tensor> outputs, std::shared_ptr<DeviceStage> stage)
    : c10d::Work(rank, opType, profilingTitle),
      outputs_(std::move(outputs)),
      stage_(std::move(stage)),
      future_(makeFuture(stage_.get())) {}

bool RingdistWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      return false;
    }
  }
  return stage_ == nullptr || stage_->deviceDone();
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
  if (stage_) {
    stage_->blockCurrentStream();
  }
  return true;
}

// The copy-back is queued only once the host side finished, so the stream
// wait needs the host side first.
void RingdistWork::synchronize() { wait(::kNoTimeout); }

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
  if (stage_) {
    // A CUDA-aware future records its events on the current stream.
    stage_->onStream([this] { future_->markCompleted(c10::IValue(outputs_)); });
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
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
