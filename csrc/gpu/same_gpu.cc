// The same-GPU collectives (same_gpu.h).
//
// Set-up (once, collective): the ranks compare device ids; rank 0, the
// leader, creates the signal page and the others open it; everyone attaches
// it to its queue and says whether all of that worked.
//
// Each call: op headers, then one allgather of MemoryRecords (what each rank
// lends: its input and output, or its scratch copies of them); the leader
// maps the others' memory (cached per allocation) and queues wait-ready, the
// fused kernel and done; the others queue ready and wait-done, with copies
// into and out of their scratch around them where a tensor could not be lent.
// The host never waits for the device; the Watch bounds the device part by
// the op's deadline.
#include "csrc/gpu/same_gpu.h"

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
constexpr uint64_t kMessageMagic = 0x5244534d53473031ull;  // "RDMSG01"

struct PageName {
  char text[64];
};

// What a rank lends for one call, and for an alltoall what it sends to and
// expects from each rank (elements).
struct Lent {
  MemoryRecord input;
  MemoryRecord output;
  uint64_t sends[kMaxFusedRanks];
  uint64_t receipts[kMaxFusedRanks];
};

// Every rank checks every pair the same way, so all fail alike, before any
// of them queues anything: a rank expecting another count from a peer than
// the peer sends it.
void checkPairs(Communicator& comm, const std::vector<Lent>& lent) {
  const size_t n = lent.size();
  for (size_t s = 0; s < n; ++s) {
    for (size_t r = 0; r < n; ++r) {
      RINGDIST_CHECK(lent[s].sends[r] == lent[r].receipts[s], "ringdist ", comm.opName(),
                     ": rank ", s, " sends ", lent[s].sends[r], " elements to rank ", r,
                     ", which expects ", lent[r].receipts[s], " (seen on rank ", comm.rank(), ")");
    }
  }
}

}  // namespace

SameGpu::SameGpu(std::unique_ptr<SameGpuPlatform> platform) : platform_(std::move(platform)) {}

SameGpu::~SameGpu() {
  if (signals_) {
    // A stream still waiting on the page must not outlive it: give the last
    // operation a moment, then release every stream.
    const uint32_t last = signals_->lastSeq();
    auto over = [&] { return signals_->finished(last) && watch_->idle(); };
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!over() && std::chrono::steady_clock::now() < giveUp) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!over()) signals_->abort(AbortCause::kShutdown, last, last);
  }
  watch_.reset();
  cache_.reset();
  messageCache_.reset();
  if (attached_) platform_->detach(page_);
}

bool SameGpu::setUp(Communicator& comm) {
  if (state_ != State::kNew) return ready();
  const int n = comm.size();
  std::array<uint8_t, 16> id{};
  std::string problem;
  try {
    id = platform_->deviceId();
  } catch (const Error& e) {
    problem = e.what();
  }
  const std::vector<std::array<uint8_t, 16>> ids = allgatherValue(comm, id);
  const bool fits = problem.empty() && n > 1 && n <= kMaxFusedRanks;
  const bool oneGpu =
      fits && std::all_of(ids.begin(), ids.end(), [&](const auto& other) { return other == id; });
  // Several GPUs: each rank's must reach every other's memory (peer access).
  bool reachesAll = fits;
  for (const auto& other : ids) {
    reachesAll = reachesAll && (other == id || platform_->reaches(other));
  }
  const int leader = oneGpu ? kLeader : kSplit;
  if (!everyRank(comm, oneGpu) && !everyRank(comm, reachesAll)) {
    state_ = State::kUnusable;  // the other paths are the right ones: no warning
    return false;
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
  ringdist::broadcast(comm, &name, sizeof(name), DataType::kUInt8, kLeader);
  try {
    if (comm.rank() != kLeader) {
      RINGDIST_CHECK(name.text[0] != '\0', "rank ", kLeader, " could not create the signal page");
      page_ = SharedPage::open(name.text);
    }
    platform_->attach(page_, comm.rank());
    attached_ = true;
  } catch (const Error& e) {
    problem = e.what();
  }
  const bool everyoneReady = everyRank(comm, problem.empty());
  page_.unlinkName();  // everyone has it mapped, or nobody needs it
  if (!everyoneReady) {
    if (attached_) platform_->detach(page_);
    attached_ = false;
    page_ = SharedPage();
    state_ = State::kUnusable;
    logWarning(strCat("ringdist: rank ", comm.rank(), ": the ranks share one GPU but cannot hand "
                      "off through stream-ordered signals (",
                      problem.empty() ? "another rank could not" : problem,
                      "); CUDA collectives take the IPC-buffer and staged paths instead"));
    return false;
  }
  signals_ = std::make_unique<StreamSignals>(page_.signals(), comm.rank(), n, leader);
  if (signals_->runsKernel()) cache_ = std::make_unique<PeerMemoryCache>(*platform_, kCachedAllocations);
  messageCache_ = std::make_unique<PeerMemoryCache>(*platform_, kCachedAllocations);
  watch_ = std::make_unique<Watch>(*signals_, comm.rank());
  state_ = State::kReady;
  return true;
}

void SameGpu::allreduce(Communicator& comm, SignalQueue& queue, void* data, size_t count,
                        DataType dtype, ReduceOp op) {
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  const size_t bytes = count * elementSize(dtype);
  Call call{comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1), data, bytes, data, bytes,
            dtype, op, op == ReduceOp::kAvg ? comm.size() : 0, {}};
  call.header.variant = kSameGpuAllreduce;
  if (signals_->runsKernel()) {
    call.spans = allreduceSpans(count, comm.size(), comm.options().oneRoundAllreduce(bytes, comm.size()),
                                [&](int pos) { return comm.ringRank(pos); });
  }
  run(comm, queue, call);
}

void SameGpu::reduce(Communicator& comm, SignalQueue& queue, void* data, size_t count,
                     DataType dtype, ReduceOp op, int root) {
  reduceFunction(dtype, op);
  const size_t bytes = count * elementSize(dtype);
  Call call{comm.makeHeader(OpType::kReduce, count, dtype, op, root), data, bytes, data, bytes,
            dtype, op, op == ReduceOp::kAvg ? comm.size() : 0, {}};
  call.header.variant = kSameGpuCopy;
  if (signals_->runsKernel()) {
    call.spans = reduceSpans(count, comm.size(), root, [&](int pos) { return comm.ringRank(pos); });
  }
  run(comm, queue, call);
}

void SameGpu::reduceScatter(Communicator& comm, SignalQueue& queue, const void* input, void* output,
                            size_t count, DataType dtype, ReduceOp op) {
  reduceFunction(dtype, op);
  const size_t bytes = count * elementSize(dtype);
  Call call{comm.makeHeader(OpType::kReduceScatter, count, dtype, op, -1), input,
            bytes * static_cast<size_t>(comm.size()), output, bytes, dtype, op,
            op == ReduceOp::kAvg ? comm.size() : 0, {}};
  call.header.variant = kSameGpuCopy;
  if (signals_->runsKernel()) {
    std::vector<int> position(static_cast<size_t>(comm.size()));
    for (int p = 0; p < comm.size(); ++p) position[static_cast<size_t>(comm.ringRank(p))] = p;
    call.spans = reduceScatterSpans(count, comm.size(), [&](int pos) { return comm.ringRank(pos); },
                                    [&](int rank) { return position[static_cast<size_t>(rank)]; });
  }
  run(comm, queue, call);
}

void SameGpu::allgather(Communicator& comm, SignalQueue& queue, const void* input, void* output,
                        size_t count, DataType dtype) {
  const size_t bytes = count * elementSize(dtype);
  Call call{comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1), input, bytes,
            output, bytes * static_cast<size_t>(comm.size()), DataType::kUInt8, ReduceOp::kSum, 0,
            {}};
  call.header.variant = kSameGpuCopy;
  if (signals_->runsKernel()) call.spans = allgatherSpans(bytes, comm.size());
  run(comm, queue, call);
}

void SameGpu::broadcast(Communicator& comm, SignalQueue& queue, void* data, size_t count,
                        DataType dtype, int root) {
  const size_t bytes = count * elementSize(dtype);
  Call call{comm.makeHeader(OpType::kBroadcast, count, dtype, ReduceOp::kSum, root), data, bytes,
            data, bytes, DataType::kUInt8, ReduceOp::kSum, 0, {}};
  call.header.variant = kSameGpuCopy;
  if (signals_->runsKernel()) call.spans = broadcastSpans(bytes, root);
  run(comm, queue, call);
}

void SameGpu::alltoall(Communicator& comm, SignalQueue& queue, const void* input,
                       const std::vector<uint64_t>& sendCounts, void* output,
                       const std::vector<uint64_t>& recvCounts, DataType dtype) {
  const size_t elem = elementSize(dtype);
  uint64_t inCount = 0, outCount = 0;
  for (int r = 0; r < comm.size(); ++r) {
    inCount += sendCounts[static_cast<size_t>(r)];
    outCount += recvCounts[static_cast<size_t>(r)];
  }
  Call call{comm.makeHeader(OpType::kAlltoall, 0, dtype, ReduceOp::kSum, -1), input,
            inCount * elem, output, outCount * elem, DataType::kUInt8, ReduceOp::kSum, 0, {}};
  call.header.variant = kSameGpuCopy;
  call.sendCounts = &sendCounts;
  call.recvCounts = &recvCounts;
  const char* in = static_cast<const char*>(input);
  const char* out = static_cast<const char*>(output);
  call.copyInput = call.inputBytes > 0 && call.outputBytes > 0 && in < out + call.outputBytes &&
                   out < in + call.inputBytes;
  run(comm, queue, call);
}

void SameGpu::checkUsable(const char* op) const {
  RINGDIST_CHECK(ready(), "ringdist ", op, ": the same-GPU path was not set up");
  if (signals_->aborted()) {
    RINGDIST_FAIL("ringdist ", op, ": rank ", signals_->rank(), ": the GPU hand-offs of this group were aborted (",
                  signals_->abortReason(), "); later device operations on this group fail");
  }
}

namespace {

// The leader reaches the others' memory through what they lend; memory that
// cannot be lent goes through the rank's scratch slot, copied in (`fill`) on
// its queue. Returns what was lent. Nothing is lent for no bytes (the record
// stays invalid).
void* lendOrScratch(SameGpuPlatform& platform, SignalQueue& queue, Communicator& comm, void* data,
                    size_t bytes, int slot, bool fill, MemoryRecord* record) {
  if (bytes == 0) return data;
  std::string why;
  if (!platform.lend(data, bytes, record, &why)) {
    void* scratch = platform.scratch(slot, bytes);
    if (fill) queue.copy(scratch, data, bytes);
    RINGDIST_CHECK(platform.lend(scratch, bytes, record, &why), "ringdist ", comm.opName(),
                   ": rank ", comm.rank(), " cannot lend its scratch memory: ", why);
    data = scratch;
  }
  record->valid = 1;
  return data;
}

// An alltoall's spans: what every rank sends to every other, by the counts
// (elements) each lent.
std::vector<FusedSpan> alltoallSpansOf(Communicator& comm, const std::vector<Lent>& lent,
                                       DataType dtype) {
  const size_t elem = elementSize(dtype);
  std::vector<std::vector<uint64_t>> bytes;
  for (const Lent& theirs : lent) {
    bytes.emplace_back(theirs.sends, theirs.sends + comm.size());
    for (uint64_t& b : bytes.back()) b *= elem;
  }
  return alltoallSpans(bytes);
}

}  // namespace

void SameGpu::run(Communicator& comm, SignalQueue& queue, const Call& call) {
  checkUsable(comm.opName());
  // What this rank's memory is for this call: its tensors, or the scratch it
  // lends in their place (lendOrScratch).
  const void* input = call.input;
  void* output = call.output;
  if (call.copyInput) {
    void* copy = platform_->scratch(0, call.inputBytes);
    queue.copy(copy, call.input, call.inputBytes);
    input = copy;
  }
  Lent mine{};
  if (call.sendCounts != nullptr) {
    std::copy(call.sendCounts->begin(), call.sendCounts->end(), mine.sends);
    std::copy(call.recvCounts->begin(), call.recvCounts->end(), mine.receipts);
  }
  if (!signals_->isLeader()) {  // split: every rank lends
    input = lendOrScratch(*platform_, queue, comm, const_cast<void*>(input), call.inputBytes, 0,
                          !call.copyInput, &mine.input);
    if (call.input == call.output && !call.copyInput) {  // in place
      output = const_cast<void*>(input);
      mine.output = mine.input;
    } else {
      output = lendOrScratch(*platform_, queue, comm, call.output, call.outputBytes, 1, false,
                             &mine.output);
    }
  }
  comm.exchangeHeaders(call.header, comm.others(), comm.others());
  const std::vector<Lent> lent = allgatherValue(comm, mine);
  std::vector<FusedSpan> spans = call.spans;
  if (call.sendCounts != nullptr) {
    checkPairs(comm, lent);
    spans = alltoallSpansOf(comm, lent, static_cast<DataType>(call.header.dtype));
  }

  FusedArgs args;
  const uint32_t seq = signals_->lastSeq() + 1;
  if (signals_->runsKernel()) {
    args.ranks = comm.size();
    args.divisor = call.divisor;
    args.abort = reinterpret_cast<const volatile uint32_t*>(&page_.signals()->abort.value);
    try {
      for (int r = 0; r < comm.size(); ++r) {
        const Lent& theirs = lent[static_cast<size_t>(r)];
        const bool me = r == comm.rank();
        args.inputs[r] = me ? input : theirs.input.valid ? cache_->map(theirs.input, seq) : nullptr;
        args.outputs[r] = me ? output
                             : theirs.output.valid ? cache_->map(theirs.output, seq) : nullptr;
      }
    } catch (const Error&) {
      // The others' streams already wait for this operation: release them.
      signals_->abort(AbortCause::kMapping, seq, seq);
      throw;
    }
    if (signals_->split()) spans = shareOf(spans, comm.rank(), comm.size());
    args.spanCount = static_cast<int>(spans.size());
    std::copy(spans.begin(), spans.end(), args.spans);
    alignSpans(args, elementSize(call.kernelType));
  }
  signals_->queueOp(queue, args, call.kernelType, call.op);
  if (output != call.output) queue.copy(call.output, output, call.outputBytes);
  watch_->add(seq, comm.deadline());
  if (cache_) cache_->trim([&](uint32_t s) { return signals_->finished(s); });
}

// ---------------------------------------------------------------- messages

bool SameGpu::send(SignalQueue& post, SignalQueue& done, const void* data, size_t bytes,
                   DataType dtype, int peer, std::chrono::steady_clock::time_point deadline,
                   DeviceMessage* message, std::string* why) {
  checkUsable("send");
  *message = DeviceMessage{};
  if (bytes > 0) {
    if (!platform_->lend(data, bytes, &message->data, why)) return false;
    message->data.valid = 1;
  }
  message->magic = kMessageMagic;
  message->bytes = bytes;
  message->dtype = static_cast<uint32_t>(dtype);
  message->index = signals_->queueSend(post, done, peer);
  watch_->add(message->index, deadline, signals_->rank(), peer);
  return true;
}

void SameGpu::receive(SignalQueue& queue, const DeviceMessage& message, int source, void* data,
                      size_t bytes, DataType dtype, std::chrono::steady_clock::time_point deadline) {
  checkUsable("recv");
  const int rank = signals_->rank();
  RINGDIST_CHECK(message.magic == kMessageMagic, "ringdist recv: rank ", rank, " got a message from rank ",
                 source, " that is not a GPU message");
  if (message.bytes != bytes || message.dtype != static_cast<uint32_t>(dtype)) {
    // The sender's stream waits for this message: release it, and fail the group.
    signals_->abort(AbortCause::kMessageMismatch, message.index, signals_->lastSeq());
    RINGDIST_FAIL("ringdist recv: rank ", rank, " expects ", bytes, " bytes of ", dataTypeName(dtype),
                  " from rank ", source, ", which sent ", message.bytes, " bytes of ",
                  dataTypeName(static_cast<DataType>(message.dtype)));
  }
  FusedArgs copy;
  copy.ranks = 2;  // 0: the sender's memory, 1: this rank's
  copy.abort = reinterpret_cast<const volatile uint32_t*>(&page_.signals()->abort.value);
  if (bytes > 0) {
    const uint32_t use = ++receives_;
    try {
      copy.inputs[0] = messageCache_->map(message.data, use);
    } catch (const Error&) {
      signals_->abort(AbortCause::kMapping, message.index, signals_->lastSeq());
      throw;
    }
    copy.outputs[1] = data;
    std::vector<FusedSpan> spans = broadcastSpans(bytes, 0);
    spans[0].writer = 1;
    copy.spanCount = 1;
    copy.spans[0] = spans[0];
    alignSpans(copy, 1);
    receiving_.emplace_back(source, message.index);
  }
  signals_->queueReceive(queue, source, message.index, copy);
  watch_->add(message.index, deadline, source, rank);
  // Mappings whose receives were all taken may close.
  while (!receiving_.empty() &&
         signals_->delivered(receiving_.front().first, rank, receiving_.front().second)) {
    receiving_.pop_front();
    ++receivesDone_;
  }
  messageCache_->trim([&](uint32_t use) { return static_cast<int32_t>(receivesDone_ - use) >= 0; });
}

// ---------------------------------------------------------------- Watch

SameGpu::Watch::Watch(StreamSignals& signals, int rank)
    : signals_(signals), rank_(rank), thread_([this] { loop(); }) {}

SameGpu::Watch::~Watch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SameGpu::Watch::add(uint32_t seq, std::chrono::steady_clock::time_point deadline, int from,
                         int to) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropFinished();
    pending_.push_back(Entry{seq, from, to, deadline});
  }
  cv_.notify_all();
}

bool SameGpu::Watch::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  dropFinished();
  return pending_.empty();
}

bool SameGpu::Watch::finished(const Entry& entry) const {
  return entry.from < 0 ? signals_.finished(entry.seq)
                        : signals_.delivered(entry.from, entry.to, entry.seq);
}

void SameGpu::Watch::dropFinished() {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const Entry& entry) { return finished(entry); }),
                 pending_.end());
}

void SameGpu::Watch::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    dropFinished();
    if (pending_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Entry first = *std::min_element(
        pending_.begin(), pending_.end(),
        [](const Entry& a, const Entry& b) { return a.deadline < b.deadline; });
    if (std::chrono::steady_clock::now() < first.deadline) {
      cv_.wait_until(lock, first.deadline);
      continue;
    }
    // Missed: fail the group and release every stream's waits, again and again
    // until everything pending got through (a write still queued on a stream
    // could lower a counter we raised).
    const std::string what =
        first.from < 0 ? strCat("GPU operation #", first.seq)
                       : strCat("GPU message #", first.seq, " from rank ", first.from, " to rank ",
                                first.to);
    logWarning(strCat("ringdist: rank ", rank_, ": ", what, " did not finish by its deadline; "
                      "aborting the group's GPU hand-offs so that no stream waits forever. "
                      "Results of this and later operations are invalid"));
    const AbortCause cause = first.from < 0 ? AbortCause::kDeadline : AbortCause::kMessageDeadline;
    uint32_t last = first.from < 0 ? first.seq : 0;  // the latest operation pending
    for (const Entry& entry : pending_) {
      if (entry.from < 0 && reached(entry.seq, last)) last = entry.seq;
    }
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!stop_ && !pending_.empty() && std::chrono::steady_clock::now() < giveUp) {
      signals_.abort(cause, first.seq, last);
      cv_.wait_for(lock, std::chrono::milliseconds(1));
      dropFinished();
    }
    signals_.abort(cause, first.seq, last);
    pending_.clear();
  }
}

}  // namespace ringdist
