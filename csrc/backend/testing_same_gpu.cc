// The same-GPU allreduce (csrc/collectives/same_gpu_allreduce.h) run on the
// CPU, for tests: the very protocol, registration cache, fallbacks and watch
// that drive a GPU, with host stand-ins for what CUDA provides:
//  - a "stream" is a thread running what was queued on it in order; its
//    waits spin until the counter is reached, with no deadline of their own
//    (like the GPU's), so only the watch's abort can release them;
//  - a rank's "allocation" is a named shared-memory arena that the leader
//    maps by name (the IPC handle) and caches, and renew() replaces it as the
//    caching allocator replaces a segment;
//  - the fused kernel is the same element code (fused_allreduce.h) in a loop.
#include <sys/mman.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/process_group.h"
#include "csrc/backend/testing.h"
#include "csrc/collectives/collectives.h"
#include "csrc/collectives/same_gpu_allreduce.h"
#include "csrc/common/error.h"
#include "csrc/reduce/reduce.h"
#include "csrc/transport/shm/segment.h"

namespace ringdist::testing {

namespace {

class HostStream final : public SignalQueue {
 public:
  HostStream() : thread_([this] { loop(); }) {}
  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Writes queued from now on are dropped: a rank whose stream never gets there.
  void stall(bool on) { stalled_ = on; }

  void write(SignalWord* word, uint32_t value) override {
    const bool drop = stalled_;
    push([word, value, drop] {
      if (!drop) word->value.store(value, std::memory_order_release);
    });
  }
  void waitFor(SignalWord* word, uint32_t value) override {
    push([this, word, value] {
      while (!reached(word->value.load(std::memory_order_acquire), value) && !stop_) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }
  void combine(const FusedArgs& args, DataType dtype, ReduceOp op) override {
    push([args, dtype, op] {
      if (*args.abort != 0) return;
      visitReduction(dtype, op, [&](auto elementTag, auto opTag) {
        using T = typename decltype(elementTag)::type;
        using Op = typename decltype(opTag)::type;
        for (int s = 0; s < args.spanCount; ++s) fusedSpan<T, Op>(args, args.spans[s], 0, 1);
      });
    });
  }

  // The host waiting for the stream, as a caller syncing its CUDA stream.
  void drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
      TORCH_CHECK(cv_.wait_for(lock, timeout, [&] { return items_.empty() && !busy_; }),
                "ringdist test stream: still busy after ", timeout.count(), " ms");
  }

 private:
  void push(std::function<void()> item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(item));
    }
    cv_.notify_all();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
      if (stop_) return;
      auto item = std::move(items_.front());
      items_.pop_front();
      busy_ = true;
      lock.unlock();
      item();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> items_;
  bool busy_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stalled_{false};
  std::thread thread_;
};

// One rank's lendable memory: a named shared-memory object.
struct Arena {
  std::string name;
  char* base = nullptr;
  size_t bytes = 0;

  void renew(size_t atLeast) {
    release();
    bytes = std::max<size_t>(atLeast, 1 << 20);
    base = static_cast<char*>(shm::createShared(bytes, &name));
  }
  void release() {
    if (base == nullptr) return;
    ::munmap(base, bytes);
    ::shm_unlink(name.c_str());
    base = nullptr;
  }
  ~Arena() { release(); }
};

class HostPlatform final : public SameGpuPlatform {
 public:
  HostPlatform(const Arena& arena, uint8_t device) : arena_(arena) { id_.fill(device); }

  bool lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) override {
    const char* p = static_cast<const char*>(data);
    if (arena_.base == nullptr || p < arena_.base || p + bytes > arena_.base + arena_.bytes) {
      *why = "the tensor is not in this rank's shared arena";
      return false;
    }
    std::memset(record->handle, 0, sizeof(record->handle));
    std::memcpy(record->handle, arena_.name.data(), std::min(arena_.name.size(), sizeof(record->handle) - 1));
    record->offset = static_cast<uint64_t>(p - arena_.base);
    record->allocationBytes = arena_.bytes;
    return true;
  }
  void* open(const MemoryRecord& record) override {
    size_t bytes = 0;
    void* base = shm::openShared(reinterpret_cast<const char*>(record.handle),
                                 record.allocationBytes, &bytes);
    sizes_[base] = bytes;
    return base;
  }
  void close(void* base) noexcept override {
    ::munmap(base, sizes_[base]);
    sizes_.erase(base);
  }
  void attach(SharedPage&) override {}
  void detach(SharedPage&) noexcept override {}
  std::array<uint8_t, 16> deviceId() override { return id_; }

 private:
  const Arena& arena_;
  std::array<uint8_t, 16> id_{};
  std::map<void*, size_t> sizes_;
};

struct Sim {
  explicit Sim(uint8_t device)
      : allreduce(std::make_unique<HostPlatform>(arena, device)) {}
  Arena arena;
  HostStream stream;  // members go in reverse order: the allreduce (and its watch) first
  SameGpuAllreduce allreduce;
};

std::mutex simsMutex;
std::map<std::string, std::unique_ptr<Sim>> sims;

}  // namespace

std::map<std::string, int64_t> sameGpuHostRun(const std::string& groupName, at::Tensor& tensor,
                                              const std::string& op, int64_t offset, bool lend,
                                              bool renew, bool stall, int64_t device,
                                              int64_t timeoutMs) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(),
              "same_gpu_host_run: a contiguous CPU tensor");
  DataType dtype = DataType::kFloat32;
  TORCH_CHECK(toDataType(tensor.scalar_type(), &dtype), "same_gpu_host_run: dtype ",
              tensor.scalar_type());
  const ReduceOp reduceOp = opFromName(op);
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "same_gpu_host_run");
  Sim* sim = nullptr;
  {
    std::lock_guard<std::mutex> lock(simsMutex);
    auto& slot = sims[groupName];
    if (!slot) slot = std::make_unique<Sim>(static_cast<uint8_t>(device));
    sim = slot.get();
  }
  const size_t bytes = static_cast<size_t>(tensor.nbytes());
  const size_t at = static_cast<size_t>(offset);
  if (renew || sim->arena.bytes < at + bytes) sim->arena.renew(at + bytes);
  char* data = lend ? sim->arena.base + at : static_cast<char*>(tensor.data_ptr());
  if (lend) std::memcpy(data, tensor.data_ptr(), bytes);
  sim->stream.stall(stall);
  bool fused = false;
  const auto timeout = std::chrono::milliseconds(timeoutMs);
  group.runOnWorker(timeout, [&](Communicator& comm) {
    const size_t count = static_cast<size_t>(tensor.numel());
    fused = sim->allreduce.run(comm, sim->stream, data, count, dtype, reduceOp);
    if (!fused) allreduce(comm, data, count, dtype, reduceOp);  // the staged path's engine
  });
  sim->stream.drain(3 * timeout + std::chrono::seconds(5));
  sim->stream.stall(false);
  if (lend) std::memcpy(tensor.data_ptr(), data, bytes);
  return {{"fused", fused ? 1 : 0},
          {"seq", sim->allreduce.lastSeq()},
          {"opens", static_cast<int64_t>(sim->allreduce.opens())},
          {"cached", static_cast<int64_t>(sim->allreduce.cached())}};
}

void sameGpuHostReset(const std::string& groupName) {
  std::lock_guard<std::mutex> lock(simsMutex);
  sims.erase(groupName);
}

}  // namespace ringdist::testing
