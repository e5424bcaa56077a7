// The same-GPU allreduce (same_gpu_allreduce.h).
//
// Set-up (first call, collective): the ranks compare device ids; rank 0, the
// leader, creates the signal page and the others open it; everyone attaches
// it to its queue and says whether all of that worked. A group that cannot go
// this way says so once and takes the staged path from then on.
//
// Each call: op headers, then one allgather of MemoryRecords; the leader maps
// the others' tensors (cached per allocation) and queues wait-ready, the
// fused kernel and done; the others queue ready and wait-done. The host never
// waits for the device; the Watch bounds the device part by the op's deadline.
#include "csrc/collectives/same_gpu_allreduce.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

namespace {

constexpr int kLeader = 0;
// Mappings of peers' allocations the leader keeps beyond those in use (the
// caching allocator holds few, long-lived segments).
constexpr size_t kCachedAllocations = 64;

template <typename T>
std::vector<void*> addressesOf(std::vector<T>& items) {
  std::vector<void*> out;
  for (auto& item : items) out.push_back(&item);
  return out;
}

// Every rank learns whether every rank said yes.
bool everyone(Communicator& comm, bool mine) {
  uint8_t ok = mine ? 1 : 0;
  std::vector<uint8_t> oks(static_cast<size_t>(comm.size()));
  allgather(comm, &ok, addressesOf(oks).data(), 1, DataType::kUInt8);
  return std::all_of(oks.begin(), oks.end(), [](uint8_t v) { return v != 0; });
}

struct PageName {
  char text[64];
};

}  // namespace

SameGpuAllreduce::SameGpuAllreduce(std::unique_ptr<SameGpuPlatform> platform)
    : platform_(std::move(platform)) {}

SameGpuAllreduce::~SameGpuAllreduce() {
  watch_.reset();
  cache_.reset();
  if (attached_) platform_->detach(page_);
}

bool SameGpuAllreduce::run(Communicator& comm, SignalQueue& queue, void* data, size_t count,
                           DataType dtype, ReduceOp op) {
  if (count == 0 || comm.options().checkResults) return false;
  if (state_ == State::kNew) setUp(comm);
  if (state_ != State::kReady) return false;
  if (signals_->aborted()) {
    RINGDIST_FAIL("ringdist ", comm.opName(), ": rank ", comm.rank(),
                  ": the GPU hand-offs of this group were aborted (", signals_->abortReason(),
                  "); later device operations on this group fail");
  }
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  const size_t bytes = count * elementSize(dtype);

  MemoryRecord mine{};
  std::string why;
  mine.valid = platform_->lend(data, bytes, &mine, &why) ? 1 : 0;
  OpHeader header = comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1);
  header.variant = kSameGpuAllreduce;
  comm.exchangeHeaders(header, comm.others(), comm.others());
  std::vector<MemoryRecord> records(static_cast<size_t>(comm.size()));
  allgather(comm, &mine, addressesOf(records).data(), sizeof(mine), DataType::kUInt8);
  for (int r = 0; r < comm.size(); ++r) {
    if (records[static_cast<size_t>(r)].valid != 0) continue;
    if (!warnedUnlent_) {
      logWarning(strCat("ringdist: rank ", comm.rank(), ": a CUDA allreduce on one GPU goes "
                        "through the staged buffer because rank ", r, " cannot lend its tensor",
                        r == comm.rank() ? strCat(" (", why, ")") : std::string(),
                        "; later calls like it do too, silently"));
      warnedUnlent_ = true;
    }
    return false;
  }

  FusedArgs args;
  args.ranks = comm.size();
  args.divisor = op == ReduceOp::kAvg ? comm.size() : 0;
  args.abort = reinterpret_cast<const volatile uint32_t*>(&page_.signals()->abort.value);
  const uint32_t seq = signals_->lastSeq() + 1;
  if (signals_->isLeader()) {
    uintptr_t addressBits = 0;
    for (int r = 0; r < comm.size(); ++r) {
      args.data[r] = r == comm.rank() ? data : cache_->map(records[static_cast<size_t>(r)], seq);
      addressBits |= reinterpret_cast<uintptr_t>(args.data[r]);
    }
    args.vectors = addressBits % sizeof(FusedVector) == 0 ? 1 : 0;
    const bool small = comm.options().oneRoundAllreduce(bytes, comm.size());
    const auto spans = fusedSpans(count, comm.size(), small,
                                  [&](int pos) { return comm.ringRank(pos); });
    args.spanCount = static_cast<int>(spans.size());
    std::copy(spans.begin(), spans.end(), args.spans);
  }
  signals_->queueAllreduce(queue, args, dtype, op);
  watch_->add(seq, comm.deadline());
  if (cache_) cache_->trim([&](uint32_t s) { return signals_->finished(s); });
  return true;
}

void SameGpuAllreduce::setUp(Communicator& comm) {
  const int n = comm.size();
  std::array<uint8_t, 16> id{};
  std::string problem;
  try {
    id = platform_->deviceId();
  } catch (const Error& e) {
    problem = e.what();
  }
  std::vector<std::array<uint8_t, 16>> ids(static_cast<size_t>(n));
  allgather(comm, id.data(), addressesOf(ids).data(), id.size(), DataType::kUInt8);
  const bool oneGpu = problem.empty() && n <= kMaxFusedRanks &&
                      std::all_of(ids.begin(), ids.end(), [&](const auto& other) { return other == id; });
  if (!everyone(comm, oneGpu)) {
    state_ = State::kUnusable;  // not one GPU: the staged path is the right one, no warning
    return;
  }
  PageName name{};
  try {
    if (comm.rank() == kLeader) {
      page_ = SharedPage::create();
      std::snprintf(name.text, sizeof(name.text), "%s", page_.name().c_str());
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  broadcast(comm, &name, sizeof(name), DataType::kUInt8, kLeader);
  try {
    if (comm.rank() != kLeader) {
      RINGDIST_CHECK(name.text[0] != '\0', "rank ", kLeader, " could not create the signal page");
      page_ = SharedPage::open(name.text);
    }
    platform_->attach(page_);
    attached_ = true;
  } catch (const Error& e) {
    problem = e.what();
  }
  const bool ready = everyone(comm, problem.empty());
  page_.unlinkName();  // everyone has it mapped, or nobody needs it
  if (!ready) {
    unusable(comm, problem.empty() ? "another rank could not" : problem);
    return;
  }
  signals_ = std::make_unique<StreamSignals>(page_.signals(), comm.rank(), n, kLeader);
  if (signals_->isLeader()) cache_ = std::make_unique<PeerMemoryCache>(*platform_, kCachedAllocations);
  watch_ = std::make_unique<Watch>(*signals_, comm.rank());
  state_ = State::kReady;
}

void SameGpuAllreduce::unusable(Communicator& comm, const std::string& why) {
  if (attached_) platform_->detach(page_);
  attached_ = false;
  page_ = SharedPage();
  state_ = State::kUnusable;
  logWarning(strCat("ringdist: rank ", comm.rank(), ": the ranks share one GPU but cannot hand "
                    "off through stream-ordered signals (", why,
                    "); CUDA allreduce takes the staged path instead"));
}

// ---------------------------------------------------------------- Watch

SameGpuAllreduce::Watch::Watch(StreamSignals& signals, int rank)
    : signals_(signals), rank_(rank), thread_([this] { loop(); }) {}

SameGpuAllreduce::Watch::~Watch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SameGpuAllreduce::Watch::add(uint32_t seq, std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty() && signals_.finished(pending_.front().first)) pending_.pop_front();
    pending_.emplace_back(seq, deadline);
  }
  cv_.notify_all();
}

void SameGpuAllreduce::Watch::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    while (!pending_.empty() && signals_.finished(pending_.front().first)) pending_.pop_front();
    if (pending_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto [seq, deadline] = pending_.front();
    if (std::chrono::steady_clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    // Missed: fail the group and release every stream's waits, again and again
    // until this rank's last operation got through (a write still queued on a
    // stream could lower a counter we raised).
    const uint32_t last = pending_.back().first;
    logWarning(strCat("ringdist: rank ", rank_, ": GPU operation #", seq, " did not finish by its "
                      "deadline; aborting the group's GPU hand-offs so that no stream waits "
                      "forever. Results of this and later operations are invalid"));
    pending_.clear();
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!stop_ && !signals_.finished(last) && std::chrono::steady_clock::now() < giveUp) {
      signals_.abort(seq, last);
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    signals_.abort(seq, last);
  }
}

}  // namespace ringdist
