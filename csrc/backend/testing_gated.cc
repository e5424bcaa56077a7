// The allreduce through a StageGate (collectives.h) on the CPU, for tests:
// the gate a CUDA tensor's pinned twin uses across hosts, with host memory
// standing in for the GPU's. A copier thread fills the engine's buffer from
// the "device" input range by range in the plan's order, `delay` apart; the
// buffer starts as 0xFF bytes, so a read before need() returned gives a wrong
// result. produced() copies a range out to the "device" result (also 0xFF at
// first) and checks that no byte is produced twice.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/process_group.h"
#include "csrc/backend/testing.h"
#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist::testing {

namespace {

class HostGate final : public StageGate {
 public:
  HostGate(const char* source, char* buffer, char* result, size_t bytes,
           std::chrono::microseconds delay)
      : source_(source), buffer_(buffer), result_(result), bytes_(bytes), delay_(delay),
        producedMarks_(bytes, 0), plannedMarks_(bytes, 0) {}
  ~HostGate() override {
    stop_ = true;
    if (copier_.joinable()) copier_.join();
  }

  void plan(const std::vector<std::pair<size_t, size_t>>& ranges) override {
    RINGDIST_CHECK(!copier_.joinable(), "gated allreduce: plan() called twice");
    ranges_ = ranges;
    for (size_t i = 0; i < ranges_.size(); ++i) {
      const auto [offset, length] = ranges_[i];
      RINGDIST_CHECK(offset + length <= bytes_, "gated allreduce: planned range out of bounds");
      index_[ranges_[i]] = i;
      for (size_t b = offset; b < offset + length; ++b) ++plannedMarks_[b];
    }
    copier_ = std::thread([this] {
      for (size_t i = 0; i < ranges_.size() && !stop_; ++i) {
        std::this_thread::sleep_for(delay_);
        std::memcpy(buffer_ + ranges_[i].first, source_ + ranges_[i].first, ranges_[i].second);
        copied_.store(i + 1, std::memory_order_release);
      }
    });
  }

  void need(size_t offset, size_t length) override {
    auto it = index_.find({offset, length});
    RINGDIST_CHECK(it != index_.end(), "gated allreduce: need(", offset, ", ", length,
                   ") of a range the plan does not hold");
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (copied_.load(std::memory_order_acquire) <= it->second) {
      RINGDIST_CHECK(std::chrono::steady_clock::now() < giveUp, "gated allreduce: copy stuck");
      std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
    ++needs_;
  }

  void produced(size_t offset, size_t length) override {
    RINGDIST_CHECK(offset + length <= bytes_, "gated allreduce: produced range out of bounds");
    if (copied_.load(std::memory_order_acquire) < ranges_.size()) ++producedEarly_;
    for (size_t b = offset; b < offset + length; ++b) ++producedMarks_[b];
    std::memcpy(result_ + offset, buffer_ + offset, length);
    ++produced_;
  }

  std::map<std::string, int64_t> stats() const {
    auto count = [&](const std::vector<uint8_t>& marks, uint8_t times) {
      int64_t n = 0;
      for (uint8_t m : marks) n += m == times ? 1 : 0;
      return n;
    };
    return {{"planned", static_cast<int64_t>(ranges_.size())},
            {"needs", needs_},
            {"produced", produced_},
            {"produced_early", producedEarly_},
            {"bytes_planned_once", count(plannedMarks_, 1)},
            {"bytes_produced_once", count(producedMarks_, 1)}};
  }

 private:
  const char* source_;
  char* buffer_;
  char* result_;
  const size_t bytes_;
  const std::chrono::microseconds delay_;
  std::vector<std::pair<size_t, size_t>> ranges_;
  std::map<std::pair<size_t, size_t>, size_t> index_;
  std::vector<uint8_t> producedMarks_;
  std::vector<uint8_t> plannedMarks_;
  std::atomic<size_t> copied_{0};
  std::atomic<bool> stop_{false};
  std::thread copier_;
  int64_t needs_ = 0;
  int64_t produced_ = 0;
  int64_t producedEarly_ = 0;
};

}  // namespace

std::map<std::string, int64_t> gatedAllreduce(const std::string& groupName, at::Tensor& tensor,
                                              const std::string& op, int64_t delayUs,
                                              int64_t timeoutMs) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(),
              "gated_allreduce: a contiguous CPU tensor");
  DataType dtype = DataType::kFloat32;
  TORCH_CHECK(toDataType(tensor.scalar_type(), &dtype), "gated_allreduce: dtype ",
              tensor.scalar_type());
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "gated_allreduce");
  const size_t bytes = static_cast<size_t>(tensor.nbytes());
  std::vector<char> buffer(bytes, static_cast<char>(0xFF));
  std::vector<char> result(bytes, static_cast<char>(0xFF));
  HostGate gate(static_cast<const char*>(tensor.data_ptr()), buffer.data(), result.data(), bytes,
                std::chrono::microseconds(delayUs));
  group.runOnWorker(std::chrono::milliseconds(timeoutMs), [&](Communicator& comm) {
    allreduce(comm, buffer.data(), static_cast<size_t>(tensor.numel()), dtype, opFromName(op),
              &gate);
  });
  std::memcpy(tensor.data_ptr(), result.data(), bytes);
  return gate.stats();
}

}  // namespace ringdist::testing
