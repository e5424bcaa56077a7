#include "csrc/backend/work.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

namespace ringdist {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> makeFuture(const DeviceStage* stage) {
  if (stage == nullptr) {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  }
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                  std::vector<c10::Device>{stage->device()});
}

}  // namespace

RingdistWork::RingdistWork(int rank, c10d::OpType opType, const char* profilingTitle,
                           std::vector<at::Tensor> outputs, std::shared_ptr<DeviceStage> stage)
    // With a title c10d::Work allocates a RecordFunction on every op, active or
    // not (~0.1 us): only when a profiler or other observer is installed.
    : c10d::Work(rank, opType, at::hasCallbacks() ? profilingTitle : nullptr),
      outputs_(std::move(outputs)),
      stage_(std::move(stage)),
      future_(stage_ ? makeFuture(stage_.get()) : nullptr) {}

c10::intrusive_ptr<c10::ivalue::Future> RingdistWork::getFuture() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!future_) {
    future_ = makeFuture(nullptr);
    if (exception_) {
      future_->setError(exception_);
    } else if (ended_) {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  return future_;
}

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

// The future completes before wait() returns (as gloo's): a caller that waited
// finds get_future() done. A future not made yet is made completed on demand.
void RingdistWork::markSuccess() {
  if (auto future = end(nullptr)) {
    if (stage_) {
      // A CUDA-aware future records its events on the current stream.
      stage_->onStream([&] { future->markCompleted(c10::IValue(outputs_)); });
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  }
  wakeWaiters();
}

void RingdistWork::markError(std::exception_ptr error) {
  if (auto future = end(error)) {
    future->setError(error);
  }
  wakeWaiters();
}

c10::intrusive_ptr<c10::ivalue::Future> RingdistWork::end(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  ended_ = true;  // from here getFuture() makes a finished future
  exception_ = error;
  return future_;
}

void RingdistWork::wakeWaiters() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
  }
  cv_.notify_all();
}

}  // namespace ringdist
