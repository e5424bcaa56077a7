// The allreduce through a StageGate (collectives.h) on the CPU, for tests:
// the gate a CUDA tensor's pinned twin uses across hosts, with host memory
// standing in for the GPU's and the same pieces (stage_pieces.h). A copier
// thread fills the engine's buffer from the "device" input piece by piece,
// in the order they are issued, `delay` apart; the buffer starts as 0xFF
// bytes, so a read before need() returned gives a wrong result. Full runs
// of final ranges are copied out to the "device" result (also 0xFF at first)
// as the GPU's would be copied back, and no byte may be produced twice.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/process_group.h"
#include "csrc/backend/testing.h"
#include "csrc/collectives/collectives.h"
#include "csrc/collectives/stage_pieces.h"
#include "csrc/common/error.h"

namespace ringdist::testing {

namespace {

class HostGate final : public StageGate {
 public:
  HostGate(const char* source, char* buffer, char* result, size_t bytes, size_t pieceBytes,
           std::chrono::microseconds delay)
      : source_(source), buffer_(buffer), result_(result), bytes_(bytes), delay_(delay),
        pieces_(pieceBytes), producedMarks_(bytes, 0), plannedMarks_(bytes, 0),
        copier_([this] { copyPieces(); }) {}
  ~HostGate() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    copier_.join();
  }

  void plan(const std::vector<std::pair<size_t, size_t>>& ranges) override {
    RINGDIST_CHECK(!planned_, "gated allreduce: plan() called twice");
    planned_ = true;
    for (const auto& [offset, length] : ranges) {
      RINGDIST_CHECK(offset + length <= bytes_, "gated allreduce: planned range out of bounds");
      for (size_t b = offset; b < offset + length; ++b) ++plannedMarks_[b];
    }
    ranges_ = ranges.size();
    pieces_.plan(ranges, [&](size_t at, size_t n) { issue(at, n); });
  }

  void need(size_t offset, size_t length) override {
    const size_t piece = pieces_.need(offset, [&](size_t at, size_t n) { issue(at, n); });
    RINGDIST_CHECK(offset >= issuedRanges_[piece].first &&
                       offset + length <= issuedRanges_[piece].first + issuedRanges_[piece].second,
                   "gated allreduce: need(", offset, ", ", length, ") outside its piece");
    std::unique_lock<std::mutex> lock(mutex_);
    RINGDIST_CHECK(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return copied_ > piece; }),
                   "gated allreduce: copy stuck");
    ++needs_;
  }

  void produced(size_t offset, size_t length) override {
    RINGDIST_CHECK(offset + length <= bytes_, "gated allreduce: produced range out of bounds");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (copied_ < pieces_.pieces()) ++producedEarly_;
    }
    ++produced_;
    pieces_.produced(offset, length, [&](size_t at, size_t n) { copyBack(at, n); });
  }

  void finish() {
    pieces_.finish([&](size_t at, size_t n) { copyBack(at, n); });
  }

  std::map<std::string, int64_t> stats() const {
    auto count = [&](const std::vector<uint8_t>& marks, uint8_t times) {
      int64_t n = 0;
      for (uint8_t m : marks) n += m == times ? 1 : 0;
      return n;
    };
    return {{"planned", static_cast<int64_t>(ranges_)},
            {"pieces", static_cast<int64_t>(pieces_.pieces())},
            {"needs", needs_},
            {"produced", produced_},
            {"copies_back", copiesBack_},
            {"produced_early", producedEarly_},
            {"bytes_planned_once", count(plannedMarks_, 1)},
            {"bytes_produced_once", count(producedMarks_, 1)}};
  }

 private:
  // A piece goes to the copier, which copies pieces in the order issued (a stream).
  void issue(size_t offset, size_t length) {
    issuedRanges_.emplace_back(offset, length);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(offset, length);
    }
    cv_.notify_all();
  }

  void copyPieces() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const auto [offset, length] = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(delay_);
      std::memcpy(buffer_ + offset, source_ + offset, length);
      lock.lock();
      ++copied_;
      cv_.notify_all();
    }
  }

  void copyBack(size_t offset, size_t length) {
    for (size_t b = offset; b < offset + length; ++b) ++producedMarks_[b];
    std::memcpy(result_ + offset, buffer_ + offset, length);
    ++copiesBack_;
  }

  const char* source_;
  char* buffer_;
  char* result_;
  const size_t bytes_;
  const std::chrono::microseconds delay_;
  StagePieces pieces_;
  std::vector<std::pair<size_t, size_t>> issuedRanges_;  // piece k's range
  std::vector<uint8_t> producedMarks_;
  std::vector<uint8_t> plannedMarks_;
  bool planned_ = false;
  size_t ranges_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, size_t>> queue_;  // issued, not yet copied
  size_t copied_ = 0;                             // pieces copied, in issue order
  bool stop_ = false;
  int64_t needs_ = 0;
  int64_t produced_ = 0;
  int64_t copiesBack_ = 0;
  int64_t producedEarly_ = 0;
  std::thread copier_;  // last: starts once everything above exists
};

}  // namespace

std::map<std::string, int64_t> gatedAllreduce(const std::string& groupName, at::Tensor& tensor,
                                              const std::string& op, int64_t pieceBytes,
                                              int64_t delayUs, int64_t timeoutMs) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(),
              "gated_allreduce: a contiguous CPU tensor");
  TORCH_CHECK(pieceBytes > 0, "gated_allreduce: piece_bytes must be positive");
  DataType dtype = DataType::kFloat32;
  TORCH_CHECK(toDataType(tensor.scalar_type(), &dtype), "gated_allreduce: dtype ",
              tensor.scalar_type());
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "gated_allreduce");
  const size_t bytes = static_cast<size_t>(tensor.nbytes());
  std::vector<char> buffer(bytes, static_cast<char>(0xFF));
  std::vector<char> result(bytes, static_cast<char>(0xFF));
  HostGate gate(static_cast<const char*>(tensor.data_ptr()), buffer.data(), result.data(), bytes,
                static_cast<size_t>(pieceBytes), std::chrono::microseconds(delayUs));
  group.runOnWorker(std::chrono::milliseconds(timeoutMs), [&](Communicator& comm) {
    allreduce(comm, buffer.data(), static_cast<size_t>(tensor.numel()), dtype, opFromName(op),
              &gate);
  });
  gate.finish();
  std::memcpy(tensor.data_ptr(), result.data(), bytes);
  return gate.stats();
}

}  // namespace ringdist::testing
