// The same-GPU collectives (csrc/gpu/same_gpu.h) run on the CPU, for
// tests: the very protocol, registration cache, fallbacks and watch that
// drive a GPU, with host stand-ins for what CUDA provides:
//  - a "stream" is a thread running what was queued on it in order; its
//    waits spin until the counter is reached, with no deadline of their own
//    (like the GPU's), so only the watch's abort can release them;
//  - a rank's "allocation" is a shared-memory arena that the leader opens
//    by its /proc path (the IPC handle) and caches, and renew() replaces it
//    as the caching allocator replaces a segment;
//  - the fused kernel is the same span code (fused.h) run by one worker.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "csrc/backend/dtypes.h"
#include "csrc/backend/process_group.h"
#include "csrc/backend/testing.h"
#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"
#include "csrc/common/shared_memory.h"
#include "csrc/gpu/same_gpu.h"
#include "csrc/reduce/reduce.h"

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

  void copy(void* dst, const void* src, size_t bytes) override {
    push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }

  // Holds the stream up, as a slow kernel before what is queued next.
  void delay(std::chrono::milliseconds pause) {
    push([pause] { std::this_thread::sleep_for(pause); });
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.empty() && !busy_;
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

// Lendable memory: an anonymous shared-memory file (memfd) that peers open
// by its path under /proc, so nothing is left in /dev/shm even when a test
// kills the process.
struct Arena {
  std::string name;  // /proc/<pid>/fd/<fd>
  // Told apart from an earlier arena that had the same fd number (the leader
  // caches mappings by the whole handle, as CUDA IPC handles are unique).
  uint64_t generation = 0;
  int fd = -1;
  char* base = nullptr;
  size_t bytes = 0;

  void renew(size_t atLeast) {
    release();
    bytes = std::max<size_t>(atLeast, 1 << 20);
    fd = ::memfd_create("ringdist-test-arena", MFD_CLOEXEC);
    RINGDIST_CHECK(fd >= 0, "test arena: memfd_create failed: ", std::strerror(errno));
    RINGDIST_CHECK(::ftruncate(fd, static_cast<off_t>(bytes)) == 0, "test arena: ftruncate failed");
    void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    RINGDIST_CHECK(mapped != MAP_FAILED, "test arena: mmap failed: ", std::strerror(errno));
    base = static_cast<char*>(mapped);
    name = strCat("/proc/", ::getpid(), "/fd/", fd);
    static std::atomic<uint64_t> arenas{0};
    generation = ++arenas;
  }
  // The handle: the path, then (past its end) the generation.
  void describe(MemoryRecord* record) const {
    static_assert(sizeof(record->handle) >= 48 + sizeof(uint64_t), "room for the generation");
    std::memset(record->handle, 0, sizeof(record->handle));
    std::memcpy(record->handle, name.data(), std::min<size_t>(name.size(), 47));
    std::memcpy(record->handle + 48, &generation, sizeof(generation));
    record->allocationBytes = bytes;
  }
  // Peers can no longer open it: its fd now stands for /dev/null (kept open,
  // so the number is not handed to another file meanwhile).
  void vanish() {
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    ::dup2(null, fd);
    ::close(null);
  }
  void release() {
    if (base == nullptr) return;
    ::munmap(base, bytes);
    ::close(fd);
    base = nullptr;
  }
  bool holds(const void* data, size_t length) const {
    const char* p = static_cast<const char*>(data);
    return base != nullptr && p >= base && p + length <= base + bytes;
  }
  ~Arena() { release(); }
};

// Arena 0 holds the tensors the test lends; arenas 1 and 2 are the scratch slots.
class HostPlatform final : public SameGpuPlatform {
 public:
  HostPlatform(std::array<Arena, 3>& arenas, uint8_t device) : arenas_(arenas) { id_.fill(device); }

  // The next lent allocation cannot be opened by the leader.
  void vanish(bool on) { vanish_ = on; }

  bool lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) override {
    for (Arena& arena : arenas_) {
      if (!arena.holds(data, bytes)) continue;
      arena.describe(record);
      record->offset = static_cast<uint64_t>(static_cast<const char*>(data) - arena.base);
      if (vanish_) arena.vanish();
      return true;
    }
    *why = "the tensor is in no shared arena of this rank";
    return false;
  }
  void* scratch(int slot, size_t bytes) override {
    Arena& arena = arenas_[static_cast<size_t>(1 + slot)];
    if (arena.bytes < bytes) arena.renew(bytes);
    return arena.base;
  }
  void* open(const MemoryRecord& record) override {
    size_t bytes = 0;
    const char* path = reinterpret_cast<const char*>(record.handle);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    RINGDIST_CHECK(fd >= 0, "test arena: open(", path, ") failed: ", std::strerror(errno));
    void* base = mapShared(fd, record.allocationBytes, &bytes, path);
    sizes_[base] = bytes;
    return base;
  }
  void close(void* base) noexcept override {
    ::munmap(base, sizes_[base]);
    sizes_.erase(base);
  }
  void attach(SharedPage&, int) override {}
  void detach(SharedPage&) noexcept override {}
  std::array<uint8_t, 16> deviceId() override { return id_; }
  bool reaches(const std::array<uint8_t, 16>&) override { return peerAccess_; }
  void peerAccess(bool on) { peerAccess_ = on; }

 private:
  std::array<Arena, 3>& arenas_;
  bool vanish_ = false;
  bool peerAccess_ = false;
  std::array<uint8_t, 16> id_{};
  std::map<void*, size_t> sizes_;
};

struct Sim {
  explicit Sim(uint8_t device) : platform(new HostPlatform(arenas, device)),
                                 gpu(std::unique_ptr<SameGpuPlatform>(platform)) {}
  // A side stream of this rank's messages, made on first use (as the backend's
  // per-peer streams): kind 0 posts sends, 1 waits for them to be taken, 2
  // receives; by peer.
  HostStream& side(int kind, int peer) {
    auto& held = sides[kind * kMaxFusedRanks + peer];
    if (!held) held = std::make_unique<HostStream>();
    return *held;
  }
  void drainAll(std::chrono::milliseconds timeout) {
    stream.drain(timeout);
    for (auto& [key, held] : sides) held->drain(timeout);
  }
  std::array<Arena, 3> arenas;
  HostPlatform* platform;  // owned by gpu
  HostStream stream;  // members go in reverse order: gpu (and its watch) first
  std::map<int, std::unique_ptr<HostStream>> sides;
  SameGpu gpu;
  bool setUp = false;
};

std::mutex simsMutex;
std::map<std::string, std::unique_ptr<Sim>> sims;

size_t roundUp(size_t n) { return (n + 63) / 64 * 64; }

Sim& simFor(const std::string& groupName, ProcessGroupRingdist& group, uint8_t device,
            std::chrono::milliseconds timeout, bool peerAccess) {
  Sim* sim = nullptr;
  {
    std::lock_guard<std::mutex> lock(simsMutex);
    auto& slot = sims[groupName];
    if (!slot) slot = std::make_unique<Sim>(device);
    sim = slot.get();
  }
  if (!sim->setUp) {  // as the backend does: once, before the group's first device operation
    sim->platform->peerAccess(peerAccess);
    group.runOnWorker(timeout, [&](Communicator& comm) {
      sim->gpu.setUp(comm);
    });
    sim->setUp = true;
  }
  return *sim;
}

// What one rank sent, for every rank to match its receives against (the
// backend sends each DeviceMessage through the host's point-to-point path).
constexpr int kMaxTestMessages = 40;
struct SentList {
  int count;
  struct {
    int to;
    int tag;
    DeviceMessage message;
  } sent[kMaxTestMessages];
};

// One call of sameGpuHostRun: `kind` of the collective on `in` (inCount
// elements) into `out` (outCount elements).
struct HostCall {
  const std::string& kind;
  char* in;
  char* out;
  size_t inCount;
  size_t outCount;
  DataType dtype;
  ReduceOp op;
  int root;
  const std::vector<int64_t>& sends;  // all_to_all: elements to each rank
  const std::vector<int64_t>& receipts;  // and from each
};

// Runs `call` as the backend would: through the same-GPU path once it is set
// up, else through the engine's collective on the host.
void runHostCall(Communicator& comm, Sim& sim, const HostCall& call) {
  const int n = comm.size();
  const std::string& kind = call.kind;
  char* in = call.in;
  char* out = call.out;
  const size_t inCount = call.inCount, outCount = call.outCount;
  const DataType dtype = call.dtype;
  const ReduceOp reduceOp = call.op;
  const size_t elem = elementSize(dtype);
  const bool fused = sim.gpu.ready();
  if (kind == "all_reduce") {
    if (fused) sim.gpu.allreduce(comm, sim.stream, in, inCount, dtype, reduceOp);
    else allreduce(comm, in, inCount, dtype, reduceOp);
  } else if (kind == "broadcast") {
    if (fused) sim.gpu.broadcast(comm, sim.stream, in, inCount, dtype, call.root);
    else ringdist::broadcast(comm, in, inCount, dtype, call.root);
  } else if (kind == "reduce") {
    if (fused) sim.gpu.reduce(comm, sim.stream, in, inCount, dtype, reduceOp, call.root);
    else ringdist::reduce(comm, in, inCount, dtype, reduceOp, call.root);
  } else if (kind == "reduce_scatter") {
    if (fused) {
      sim.gpu.reduceScatter(comm, sim.stream, in, out, outCount, dtype, reduceOp);
    } else {
      std::vector<const void*> blocks;
      for (int r = 0; r < n; ++r) blocks.push_back(in + static_cast<size_t>(r) * outCount * elem);
      reduceScatter(comm, blocks.data(), out, outCount, dtype, reduceOp);
    }
  } else if (kind == "all_gather") {
    if (fused) {
      sim.gpu.allgather(comm, sim.stream, in, out, inCount, dtype);
    } else {
      std::vector<void*> blocks;
      for (int r = 0; r < n; ++r) blocks.push_back(out + static_cast<size_t>(r) * inCount * elem);
      ringdist::allgather(comm, in, blocks.data(), inCount, dtype);
    }
  } else if (kind == "all_to_all") {
    RINGDIST_CHECK(static_cast<int>(call.sends.size()) == n &&
                     static_cast<int>(call.receipts.size()) == n,
                   "same_gpu_host_run: all_to_all needs a count per rank");
    const std::vector<uint64_t> sendCounts(call.sends.begin(), call.sends.end());
    const std::vector<uint64_t> recvCounts(call.receipts.begin(), call.receipts.end());
    if (fused) {
      sim.gpu.alltoall(comm, sim.stream, in, sendCounts, out, recvCounts, dtype);
    } else {
      std::vector<const void*> ins;
      std::vector<void*> outs;
      size_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        ins.push_back(in + sent * elem);
        outs.push_back(out + received * elem);
        sent += sendCounts[static_cast<size_t>(r)];
        received += recvCounts[static_cast<size_t>(r)];
      }
      alltoall(comm, ins.data(), sendCounts, outs.data(), recvCounts, dtype);
    }
  } else {
    RINGDIST_FAIL("same_gpu_host_run: unknown collective ", kind);
  }
}

}  // namespace

std::map<std::string, int64_t> sameGpuHostRun(const std::string& groupName, const std::string& kind,
                                              const at::Tensor& input, at::Tensor& output,
                                              const std::string& op, int64_t root, int64_t offset,
                                              bool lend, bool renew, bool stall, bool vanish,
                                              int64_t device, bool peerAccess, int64_t timeoutMs,
                                              const std::vector<int64_t>& sends,
                                              const std::vector<int64_t>& receipts) {
  TORCH_CHECK(input.device().is_cpu() && input.is_contiguous() && output.device().is_cpu() &&
                  output.is_contiguous() && input.scalar_type() == output.scalar_type(),
              "same_gpu_host_run: contiguous CPU tensors of one dtype");
  DataType dtype = DataType::kFloat32;
  TORCH_CHECK(toDataType(input.scalar_type(), &dtype), "same_gpu_host_run: dtype ",
              input.scalar_type());
  const ReduceOp reduceOp = opFromName(op);
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "same_gpu_host_run");
  const auto timeout = std::chrono::milliseconds(timeoutMs);
  Sim* sim = &simFor(groupName, group, static_cast<uint8_t>(device), timeout, peerAccess);
  // The tensors, lent from this rank's arena (or not at all): in place when
  // input and output are the same tensor.
  const bool inPlace = input.is_same(output);
  const size_t inBytes = static_cast<size_t>(input.nbytes());
  const size_t outBytes = static_cast<size_t>(output.nbytes());
  const size_t at = static_cast<size_t>(offset);
  Arena& arena = sim->arenas[0];
  const size_t need = at + roundUp(inBytes) + outBytes;
  if (renew || arena.bytes < need) arena.renew(need);
  char* in = lend ? arena.base + at : static_cast<char*>(input.data_ptr());
  char* out = inPlace ? in : lend ? arena.base + at + roundUp(inBytes) : static_cast<char*>(output.data_ptr());
  if (lend) std::memcpy(in, input.data_ptr(), inBytes);
  sim->stream.stall(stall);
  sim->platform->vanish(vanish);
  const HostCall call{kind, in, out, static_cast<size_t>(input.numel()),
                      static_cast<size_t>(output.numel()), dtype, reduceOp,
                      static_cast<int>(root), sends, receipts};
  group.runOnWorker(timeout, [&](Communicator& comm) { runHostCall(comm, *sim, call); });
  sim->stream.drain(3 * timeout + std::chrono::seconds(5));
  sim->stream.stall(false);
  sim->platform->vanish(false);
  if (lend) std::memcpy(output.data_ptr(), out, outBytes);
  return {{"fused", sim->gpu.ready() ? 1 : 0},
          {"seq", sim->gpu.lastSeq()},
          {"opens", static_cast<int64_t>(sim->gpu.opens())},
          {"cached", static_cast<int64_t>(sim->gpu.cached())}};
}

std::map<std::string, int64_t> sameGpuHostMessages(
    const std::string& groupName, const std::vector<at::Tensor>& sends,
    const std::vector<int64_t>& sendPeers, const std::vector<int64_t>& sendTags,
    std::vector<at::Tensor>& receives, const std::vector<int64_t>& receiveSources,
    const std::vector<int64_t>& receiveTags, int64_t device, bool peerAccess, int64_t timeoutMs) {
  TORCH_CHECK(sends.size() == sendPeers.size() && sends.size() == sendTags.size() &&
                  sends.size() <= kMaxTestMessages && receives.size() == receiveSources.size() &&
                  receives.size() == receiveTags.size(),
              "same_gpu_host_messages: a peer and a tag for each tensor, at most ",
              kMaxTestMessages, " sends");
  auto dtypeOf = [](const at::Tensor& t) {
    DataType dtype = DataType::kFloat32;
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && toDataType(t.scalar_type(), &dtype),
                "same_gpu_host_messages: contiguous CPU tensors of ringdist's types");
    return dtype;
  };
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "same_gpu_host_messages");
  const auto timeout = std::chrono::milliseconds(timeoutMs);
  Sim& sim = simFor(groupName, group, static_cast<uint8_t>(device), timeout, peerAccess);
  // The sends' data, one after another in the lent arena.
  size_t need = 0;
  for (const auto& t : sends) need += roundUp(static_cast<size_t>(t.nbytes()));
  Arena& arena = sim.arenas[0];
  if (arena.bytes < need) arena.renew(need);
  int64_t waitingSenders = 0;
  group.runOnWorker(timeout, [&](Communicator& comm) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    SentList mine{};
    size_t at = 0;
    std::set<int> peers;
    for (size_t i = 0; i < sends.size(); ++i) {
      const size_t bytes = static_cast<size_t>(sends[i].nbytes());
      const int peer = static_cast<int>(sendPeers[i]);
      // The data lands on the post stream, late: a receiver that did not wait
      // for it would read the 0xFF bytes.
      std::memset(arena.base + at, 0xFF, bytes);
      if (peers.insert(peer).second) sim.side(0, peer).delay(std::chrono::milliseconds(20));
      sim.side(0, peer).copy(arena.base + at, sends[i].data_ptr(), bytes);
      std::string why;
      auto& entry = mine.sent[mine.count++];
      entry.to = peer;
      entry.tag = static_cast<int>(sendTags[i]);
      RINGDIST_CHECK(sim.gpu.send(sim.side(0, peer), sim.side(1, peer), arena.base + at, bytes,
                                  dtypeOf(sends[i]), peer, deadline, &entry.message, &why),
                     "same_gpu_host_messages: ", why);
      at += roundUp(bytes);
    }
    const std::vector<SentList> all = allgatherValue(comm, mine);
    // No receive is queued before every rank looked: each sender's done stream
    // must still wait for its receiver.
    for (int peer : peers) waitingSenders += !sim.side(1, peer).idle();
    ringdist::barrier(comm);
    // Each receive takes the oldest unclaimed message of its tag from its source (the
    // lowest such rank for any source), as the host path matches them.
    std::vector<std::vector<bool>> claimed(all.size(), std::vector<bool>(kMaxTestMessages));
    for (size_t j = 0; j < receives.size(); ++j) {
      const int wanted = static_cast<int>(receiveSources[j]);
      bool found = false;
      for (int s = 0; s < comm.size() && !found; ++s) {
        if (wanted >= 0 && s != wanted) continue;
        for (int i = 0; i < all[s].count && !found; ++i) {
          const auto& entry = all[s].sent[i];
          if (claimed[s][i] || entry.to != comm.rank() || entry.tag != receiveTags[j]) continue;
          claimed[s][i] = found = true;
          sim.gpu.receive(sim.side(2, s), entry.message, s, receives[j].data_ptr(),
                          static_cast<size_t>(receives[j].nbytes()), dtypeOf(receives[j]),
                          deadline);
        }
      }
      RINGDIST_CHECK(found, "same_gpu_host_messages: no message for receive ", j);
    }
  });
  sim.drainAll(3 * timeout + std::chrono::seconds(5));
  return {{"waiting_senders", waitingSenders},
          {"message_opens", static_cast<int64_t>(sim.gpu.messageOpens())}};
}

std::map<std::string, int64_t> p2pDeviceMessage(const std::string& groupName, bool send,
                                                int64_t peer, int64_t tag, int64_t bytes,
                                                int64_t index, bool takesDevice) {
  auto& group = ringdistOf(c10d::resolve_process_group(groupName), "p2p_device_message");
  const int p = static_cast<int>(peer), t = static_cast<int>(tag);
  const size_t size = static_cast<size_t>(bytes);
  at::Tensor buffer = at::zeros({bytes}, at::kByte);  // a host-form receive lands here
  if (send) {
    auto message = std::make_shared<DeviceMessage>();
    message->index = static_cast<uint32_t>(index);
    group.transferForTesting(true, buffer, [message, size, p, t](PointToPoint& p2p, Worker::Moved moved) {
      p2p.sendDevice(message.get(), size, DataType::kFloat32, p, t, [message, moved] { moved(-1); });
    })->wait();
    return {};
  }
  auto got = std::make_shared<std::map<std::string, int64_t>>();
  (*got)["device"] = 0;
  PointToPoint::OnDevice onDevice;
  if (takesDevice) {
    onDevice = [got](const DeviceMessage& message, int source) {
      (*got)["device"] = 1;
      (*got)["index"] = message.index;
      (*got)["source"] = source;
    };
  }
  void* data = buffer.data_ptr();
  auto work = group.transferForTesting(false, buffer, [=](PointToPoint& p2p, Worker::Moved moved) {
    if (p < 0) {
      p2p.recvAny(data, size, DataType::kFloat32, t, moved, onDevice);
    } else {
      p2p.recv(data, size, DataType::kFloat32, p, t, [moved, p] { moved(p); }, onDevice);
    }
  });
  work->wait();
  if (!(*got)["device"]) {
    (*got)["source"] = work->sourceRank();
    (*got)["byte_sum"] = buffer.sum().item<int64_t>();
  }
  return *got;
}

void sameGpuHostReset(const std::string& groupName) {
  std::lock_guard<std::mutex> lock(simsMutex);
  sims.erase(groupName);
}

}  // namespace ringdist::testing
