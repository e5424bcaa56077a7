// The collectives through a StageGate (collectives.h) on the CPU, for tests:
// the gate a CUDA tensor's pinned twins use across hosts, with host memory
// standing in for the GPU's and the same pieces (stage_pieces.h). A copier
// thread fills the engine's input from the "device" input piece by piece,
// in the order they are issued, `delay` apart; the engine's buffers start as
// 0xFF bytes, so a read before need() returned gives a wrong result. Full
// runs of final ranges are copied out to the "device" output (also 0xFF at
// first) as the GPU's would be copied back, and no byte may be produced
// twice.
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
  // source -> input (inBytes) as asked for; output -> result (outBytes) as final.
  HostGate(const char* source, char* input, size_t inBytes, const char* output, char* result,
           size_t outBytes, size_t pieceBytes, std::chrono::microseconds delay)
      : source_(source), input_(input), output_(output), result_(result), delay_(delay),
        pieces_(pieceBytes), producedMarks_(outBytes, 0), plannedMarks_(inBytes, 0),
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
    RINGDIST_CHECK(!planned_, "gated: plan() called twice");
    planned_ = true;
    for (const auto& [offset, length] : ranges) {
      RINGDIST_CHECK(offset + length <= plannedMarks_.size(), "gated: planned range out of bounds");
      for (size_t b = offset; b < offset + length; ++b) ++plannedMarks_[b];
    }
    ranges_ = ranges.size();
    pieces_.plan(ranges, [&](size_t at, size_t n) { issue(at, n); });
  }

  void need(size_t offset, size_t length) override {
    const size_t piece = pieces_.need(offset, [&](size_t at, size_t n) { issue(at, n); });
    RINGDIST_CHECK(offset >= issuedRanges_[piece].first &&
                       offset + length <= issuedRanges_[piece].first + issuedRanges_[piece].second,
                   "gated: need(", offset, ", ", length, ") outside its piece");
    std::unique_lock<std::mutex> lock(mutex_);
    RINGDIST_CHECK(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return copied_ > piece; }),
                   "gated: copy stuck");
    ++needs_;
  }

  void produced(size_t offset, size_t length) override {
    RINGDIST_CHECK(offset + length <= producedMarks_.size(),
                   "gated: produced range out of bounds");
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
      std::memcpy(input_ + offset, source_ + offset, length);
      lock.lock();
      ++copied_;
      cv_.notify_all();
    }
  }

  void copyBack(size_t offset, size_t length) {
    for (size_t b = offset; b < offset + length; ++b) ++producedMarks_[b];
    std::memcpy(result_ + offset, output_ + offset, length);
    ++copiesBack_;
  }

  const char* source_;
  char* input_;
  const char* output_;
  char* result_;
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

std::map<std::string, int64_t> gated(const std::string& groupName, const std::string& collective,
                                     const at::Tensor& input, at::Tensor& output,
                                     const std::string& op, int64_t pieceBytes, int64_t delayUs,
                                     int64_t timeoutMs) {
  TORCH_CHECK(input.device().is_cpu() && input.is_contiguous() && output.device().is_cpu() &&
                  output.is_contiguous() && input.scalar_type() == output.scalar_type(),
              "gated: contiguous CPU tensors of one dtype");
  TORCH_CHECK(pieceBytes > 0, "gated: piece_bytes must be positive");
  DataType dtype = DataType::kFloat32;
  TORCH_CHECK(toDataType(input.scalar_type(), &dtype), "gated: dtype ", input.scalar_type());
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "gated");
  const int size = group.getSize();
  const int rank = group.getRank();
  const size_t inBytes = static_cast<size_t>(input.nbytes());
  const size_t outBytes = static_cast<size_t>(output.nbytes());
  const size_t count = static_cast<size_t>(input.numel());
  const char* source = static_cast<const char*>(input.data_ptr());
  // The engine's buffers, as the pinned twins: allreduce has one; allgather's
  // input is its own block of the output.
  std::vector<char> out(outBytes, static_cast<char>(0xFF));
  std::vector<char> in(collective == "reduce_scatter" ? inBytes : 0, static_cast<char>(0xFF));
  char* engineIn = collective == "reduce_scatter" ? in.data()
                   : collective == "all_gather"   ? out.data() + static_cast<size_t>(rank) * inBytes
                                                  : out.data();
  std::vector<char> result(outBytes, static_cast<char>(0xFF));
  if (collective == "all_gather") {  // the device's own copy of its block (never produced)
    TORCH_CHECK(outBytes == inBytes * static_cast<size_t>(size), "gated: all_gather sizes");
    std::memcpy(result.data() + static_cast<size_t>(rank) * inBytes, source, inBytes);
  }
  HostGate gate(source, engineIn, inBytes, out.data(), result.data(), outBytes,
                static_cast<size_t>(pieceBytes), std::chrono::microseconds(delayUs));
  Worker::Body body;
  if (collective == "allreduce") {
    TORCH_CHECK(inBytes == outBytes, "gated: allreduce sizes");
    body = [&](Communicator& comm) { allreduce(comm, engineIn, count, dtype, opFromName(op), &gate); };
  } else if (collective == "all_gather") {
    body = [&](Communicator& comm) {
      auto outputs = blocksOf(static_cast<void*>(out.data()), size, inBytes);
      allgather(comm, engineIn, outputs.data(), count, dtype, &gate);
    };
  } else if (collective == "reduce_scatter") {
    TORCH_CHECK(inBytes == outBytes * static_cast<size_t>(size), "gated: reduce_scatter sizes");
    body = [&](Communicator& comm) {
      auto inputs = blocksOf(static_cast<const void*>(in.data()), size, outBytes);
      reduceScatter(comm, inputs.data(), out.data(),
                    static_cast<size_t>(output.numel()), dtype, opFromName(op), &gate);
    };
  } else {
    TORCH_CHECK(false, "gated: no collective ", collective);
  }
  group.runOnWorker(std::chrono::milliseconds(timeoutMs), body);
  gate.finish();
  std::memcpy(output.data_ptr(), result.data(), outBytes);
  return gate.stats();
}

}  // namespace ringdist::testing
