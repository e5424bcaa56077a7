#include "csrc/backend/worker.h"

#include <future>

#include <c10/util/Exception.h>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

// How long destroy_process_group waits for the other ranks before closing.
constexpr auto kTeardownWait = std::chrono::seconds(10);
// Poll interval of the worker while only point-to-point transfers are pending.
constexpr auto kIdlePoll = std::chrono::milliseconds(5);
// How long a send or receive posted on the caller's thread is moved there
// (when cores allow busy-polling) before the worker takes it over: a reply
// that comes within this costs no thread hand-off.
constexpr auto kInlineTransferSpin = std::chrono::microseconds(30);
// How long a synchronous call waits for a busy worker to park before it
// queues its op instead (tryRunInline).
constexpr auto kInlineWait = std::chrono::milliseconds(1);

std::exception_ptr asDistError(const std::string& message) {
  return std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message));
}

uint64_t payloadOf(const std::vector<at::Tensor>& outputs) {
  uint64_t bytes = 0;
  for (const auto& t : outputs) {
    bytes += t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
  }
  return bytes;
}

}  // namespace

Worker::Worker(int rank, std::unique_ptr<Communicator> comm,
               std::shared_ptr<FlightRecorder> recorder, std::function<void()> onFailure)
    : rank_(rank),
      comm_(std::move(comm)),
      p2p_(std::make_unique<PointToPoint>(*comm_)),
      recorder_(std::move(recorder)),
      onFailure_(std::move(onFailure)) {
  thread_ = std::thread([this] { loop(); });
}

Worker::~Worker() { stop(); }

// ---------------------------------------------------------------- queueing

c10::intrusive_ptr<RingdistWork> Worker::enqueue(c10d::OpType type, OpType engineType,
                                                 std::string statsKey,
                                                 std::vector<at::Tensor> outputs,
                                                 std::chrono::milliseconds timeout,
                                                 uint64_t traceId, Body body,
                                                 std::shared_ptr<DeviceStage> stage,
                                                 bool inlineIfIdle) {
  const uint64_t payload = payloadOf(outputs);
  auto work = c10::make_intrusive<RingdistWork>(rank_, type, opTypeName(engineType),
                                                std::move(outputs), std::move(stage));
  Task task{work, true, engineType, std::move(statsKey), timeout, std::move(body), traceId};
  task.payloadBytes = payload;
  if (!(inlineIfIdle && tryRunInline(task))) {
    push(std::move(task));
  }
  return work;
}

void Worker::runNow(c10d::OpType type, OpType engineType, std::string statsKey,
                    const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout,
                    uint64_t traceId, Body body) {
  Task task{nullptr, true, engineType, std::move(statsKey), timeout, std::move(body), traceId};
  task.payloadBytes = payloadOf(outputs);
  if (tryRunInline(task)) {
    if (task.error) {
      std::rethrow_exception(task.error);
    }
    return;
  }
  auto work = c10::make_intrusive<RingdistWork>(rank_, type, opTypeName(engineType),
                                                std::vector<at::Tensor>{});
  task.work = work;
  push(std::move(task));
  work->wait();
}

bool Worker::tryRunInline(Task& task) {
  const auto self = std::this_thread::get_id();
  if (self == threadId_.load() || self == inlineThread_.load()) {
    return false;  // issued from a callback of the running op: push() runs it at once
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The worker still on the last op queued before this one (that op must
    // end before this one starts anyway), or done with everything and on its
    // way to park: wait, and take the engine when it parks. Else the
    // completion that woke this caller would race the worker to its park,
    // and lose on a busy core. Transfers in flight may take any time: queue.
    // Bounded: queuing is always correct; this wait only saves a hand-off.
    cv_.wait_for(lock, kInlineWait, [&] {
      return stop_ || !queue_.empty() || inlineRunning_ || workerParked_ ||
             (!workerTask_ && inFlight_.load() > 0);
    });
    if (stop_ || !queue_.empty() || !workerParked_ || inlineRunning_) {
      return false;
    }
    inlineRunning_ = true;
    inlineThread_.store(std::this_thread::get_id());
  }
  task.inlined = true;
  comm_->setSpinYields(false);
  run(task);
  if (!task.completesOnReturn) {
    settleInline();
  }
  comm_->setSpinYields(true);
  // Transfers still in flight are the worker's to finish.
  const bool left = !transfers_.empty();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inlineRunning_ = false;
    inlineThread_.store(std::thread::id());
    transfersLeft_ = left;
    // Only when the worker has something to do: a needless wake-up of the
    // parked worker costs a context switch per op on a busy core.
    wake = left || workerAwaitsInline_;
  }
  if (wake) {
    cv_.notify_all();
  }
  return true;
}

c10::intrusive_ptr<RingdistWork> Worker::enqueueTransfer(c10d::OpType type, const char* name,
                                                         at::Tensor user, at::Tensor flat,
                                                         std::chrono::milliseconds timeout,
                                                         uint64_t traceId, Post post,
                                                         std::shared_ptr<DeviceStage> stage) {
  auto work = c10::make_intrusive<RingdistWork>(rank_, type, name, std::vector<at::Tensor>{user},
                                                std::move(stage));
  Transfer entry{work, std::move(user), std::move(flat), std::make_shared<bool>(false),
                 std::make_shared<int>(-1), traceId};
  // The body only posts the transfer; reapTransfers() completes the Work.
  const bool onHost = work->stage() == nullptr;
  Task task{work, false, OpType::kSend, opTypeName(OpType::kSend), timeout,
            [this, entry, post = std::move(post)](Communicator&) {
              transfers_.push_back(entry);  // first: if posting fails, failTransfers() ends it
              inFlight_.store(transfers_.size());
              auto moved = entry.moved;
              auto source = entry.source;
              post(*p2p_, [moved, source](int from) {
                *source = from;
                *moved = true;
              });
            },
            traceId};
  if (!(onHost && tryRunInline(task))) {
    push(std::move(task));
  }
  return work;
}

void Worker::settleInline() {
  const auto until = std::chrono::steady_clock::now() + kInlineTransferSpin;
  do {
    betweenOps([this] { comm_->progress(); });
    pollAnySource();
    reapTransfers();
  } while (!transfers_.empty() && !comm_->aborted() && comm_->spins() &&
           std::chrono::steady_clock::now() < until);
}

void Worker::configure(const std::function<void(CollectiveOptions&)>& change) {
  // Shared with the task: a task dropped unrun breaks the promise instead of
  // leaving this thread waiting.
  auto applied = std::make_shared<std::promise<void>>();
  auto done = applied->get_future();
  push(Task{nullptr, true, OpType::kBarrier, "", std::chrono::milliseconds(0),
            [this, applied, change](Communicator&) {
              try {
                std::lock_guard<std::mutex> lock(optionsMutex_);
                CollectiveOptions options = comm_->options();
                change(options);
                comm_->setOptions(options);
                applied->set_value();
              } catch (...) {
                applied->set_exception(std::current_exception());
              }
            }});
  done.get();
}

// An operation issued from a completion callback (e.g. PowerSGD's second
// allreduce, which the callback then waits for) runs right here: every rank
// reaches that callback at the same point of its op sequence, so the order
// stays the same on all ranks, and waiting cannot deadlock.
void Worker::push(Task task) {
  const auto self = std::this_thread::get_id();
  if (self == threadId_.load() || self == inlineThread_.load()) {
    run(task);
    return;
  }
  if (!task.statsKey.empty()) recorder_->queued(task.traceId, std::chrono::steady_clock::now());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stop_, "ringdist ", opTypeName(task.type), ": rank ", rank_,
                ": the process group has been shut down");
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();  // the worker, and callers waiting in tryRunInline
  comm_->wake();  // the worker may be waiting on pending sends and receives
}

// ---------------------------------------------------------------- the thread

void Worker::loop() {
  threadId_.store(std::this_thread::get_id());
  Task task;
  while (next(&task)) {
    run(task);
    task = Task{};  // drop captured tensors before waiting again
    pollAnySource();
    reapTransfers();
  }
  comm_->close(waitAtClose_.load()
                   ? std::chrono::duration_cast<std::chrono::milliseconds>(kTeardownWait)
                   : std::chrono::milliseconds(0));
  reapTransfers();
  failTransfers(strCat("ringdist: rank ", rank_,
                       ": the process group was destroyed before this transfer completed"));
}

bool Worker::next(Task* task) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (workerTask_) {
    workerTask_ = false;
    // A caller in tryRunInline may wait for that op to end. If transfers are
    // still in flight the worker goes on moving them, never parking: only
    // this wakes the caller to queue behind them.
    cv_.notify_all();
  }
  for (;;) {
    if (inlineRunning_) {  // a caller holds the engine (tryRunInline)
      workerAwaitsInline_ = true;
      cv_.wait(lock, [&] { return !inlineRunning_; });
      workerAwaitsInline_ = false;
      continue;
    }
    if (!queue_.empty()) {
      *task = std::move(queue_.front());
      queue_.pop_front();
      workerTask_ = true;
      return true;
    }
    if (stop_) {
      return false;  // stopping and drained
    }
    transfersLeft_ = false;  // transfers_ is ours again
    if (transfers_.empty()) {
      workerParked_ = true;
      cv_.notify_all();  // a caller may wait to run inline (tryRunInline)
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || transfersLeft_; });
      workerParked_ = false;
    } else {
      idleStep(lock);
    }
  }
}

// Nothing queued but transfers pending: move them until new work arrives.
void Worker::idleStep(std::unique_lock<std::mutex>& lock) {
  const uint64_t wakesSeen = comm_->wakeCount();  // push() wakes after queuing
  lock.unlock();
  pollAnySource();
  reapTransfers();
  if (!comm_->hasPending() && !comm_->watchingAny()) {
    // Only receives from any source whose links hold others' messages:
    // nothing can move until a new operation takes those.
    lock.lock();
    cv_.wait_for(lock, kIdlePoll, [&] { return stop_ || !queue_.empty(); });
    return;
  }
  betweenOps([&] { comm_->progressIdle(kIdlePoll, wakesSeen); });
  reapTransfers();
  lock.lock();
}

void Worker::run(Task& task) {
  if (task.statsKey.empty()) {
    task.body(*comm_);  // a settings change reports its own errors
    return;
  }
  // Two clock reads per op: here and at the end.
  const auto started = std::chrono::steady_clock::now();
  const Counters before = counters();
  recorder_->started(task.traceId, started);
  try {
    comm_->beginOp(task.type, task.timeout, started);
    DeviceStage* stage = task.work ? task.work->stage() : nullptr;
    if (stage == nullptr) {
      task.body(*comm_);
    } else {
      stage->stageIn(comm_->deadline());
      stage->onStream([&] { task.body(*comm_); });
      if (task.completesOnReturn) {
        stage->recordDone();
      }
    }
  } catch (const std::exception& e) {
    const std::string message = abortOn(e);
    task.body = nullptr;
    recordStats(task, std::chrono::steady_clock::now() - started, before);
    fail(task.work, message);
    if (!task.work) {
      task.error = asDistError(message);
    }
    return;
  }
  // The body's tensors go before the Work completes: once the caller's wait()
  // returns, the process may exit, and dropping a tensor needs the GIL.
  task.body = nullptr;
  // Before completion: callbacks may run further (inline) operations.
  const auto finished = std::chrono::steady_clock::now();
  recordStats(task, finished - started, before);
  if (task.completesOnReturn) {
    recorder_->completed(task.traceId, finished);
    if (task.work) {
      task.work->markSuccess();
    }
  }
}

void Worker::fail(const c10::intrusive_ptr<RingdistWork>& work, const std::string& message) {
  onFailure_();  // the trace, before anyone learns of the failure
  failTransfers(message);
  if (work && !work->isCompleted()) {
    work->markError(asDistError(message));
  }
}

// ---------------------------------------------------------------- transfers

void Worker::failTransfers(const std::string& message) {
  for (auto& t : transfers_) {
    t.work->markError(asDistError(message));
  }
  transfers_.clear();
  inFlight_.store(0);
}

void Worker::reapTransfers() {
  for (size_t i = 0; i < transfers_.size();) {
    if (!*transfers_[i].moved) {
      ++i;
      continue;
    }
    Transfer done = std::move(transfers_[i]);
    transfers_.erase(transfers_.begin() + static_cast<long>(i));
    inFlight_.store(transfers_.size());  // before the Work completes: see tryRunInline
    try {
      auto copyBack = [&done] {
        // Only receives write; host to host, non_blocking is synchronous.
        if (done.work->retrieveOpType() != c10d::OpType::SEND && !done.flat.is_same(done.user)) {
          done.user.copy_(done.flat, /*non_blocking=*/true);
        }
      };
      if (DeviceStage* stage = done.work->stage()) {
        if (!stage->onDevice()) stage->onStream(copyBack);
        stage->recordDone();
      } else {
        copyBack();
      }
      if (*done.source >= 0) {
        done.work->setSourceRank(*done.source);
      }
      recorder_->completed(done.traceId, std::chrono::steady_clock::now());
      done.work->markSuccess();
    } catch (const std::exception&) {
      done.work->markError(std::current_exception());
    }
  }
}

std::string Worker::abortOn(const std::exception& e) {
  return comm_->aborted() ? std::string(e.what()) : comm_->abort(comm_->describeError(e.what()));
}

void Worker::betweenOps(const std::function<void()>& step) {
  try {
    step();
  } catch (const std::exception& e) {
    fail(nullptr, abortOn(e));
  }
}

void Worker::pollAnySource() {
  if (p2p_->anyPending() && !comm_->aborted()) {
    betweenOps([this] { p2p_->pollAny(); });
  }
}

// ---------------------------------------------------------------- settings, statistics

CollectiveOptions Worker::options() const {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  return comm_->options();
}

std::vector<std::vector<int>> Worker::allreduceRings() const {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  if (!comm_->hierarchical()) {
    return {};
  }
  return {comm_->hostRing().members, comm_->crossRing().members};
}

void addAllreduceTimes(const RouteModel& model, int ranks, size_t bytes,
                       std::map<std::string, std::string>* out) {
  for (const auto& [route, us] : model.timesUs(ModelledOp::kAllreduce, ranks, bytes)) {
    (*out)[route + "_us"] = std::to_string(us);
  }
}

std::map<std::string, std::string> Worker::allreduceRoute(size_t bytes) const {
  std::lock_guard<std::mutex> lock(optionsMutex_);
  std::map<std::string, std::string> out = {
      {"route", ringdist::allreduceRoute(*comm_, bytes)},
      {"round_trip_us", std::to_string(comm_->linkRoundTripUs())},
      {"link_bits_per_s", std::to_string(comm_->linkBitsPerSecond())},
      {"hosts", std::to_string(comm_->hostCount())}};
  for (Codec codec : {Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
    out[strCat("route/", codecName(codec))] =
        compressedAllreduceRoute(*comm_, bytes / sizeof(float), codec);
  }
  addAllreduceTimes(comm_->routeModel(), comm_->size(), bytes, &out);
  return out;
}

Worker::Counters Worker::counters() const {
  return {comm_->bytesSent(),       comm_->bytesReceived(),   comm_->sharedCoreWaits(),
          comm_->sleeps(),          comm_->singleCopyBytes(), p2p_->deviceSends(),
          comm_->bytesSentAcrossHosts()};
}

void Worker::recordStats(const Task& task, std::chrono::duration<double> elapsed,
                         const Counters& before) {
  const uint64_t payload = task.completesOnReturn ? task.payloadBytes : 0;
  const Counters now = counters();
  std::lock_guard<std::mutex> lock(statsMutex_);
  OpStats& s = stats_[task.statsKey];
  s.calls += 1;
  s.bytesSent += now.sent - before.sent;
  s.bytesReceived += now.received - before.received;
  s.bytesSentAcrossHosts += now.sentAcrossHosts - before.sentAcrossHosts;
  s.sharedCoreWaits += now.sharedCoreWaits - before.sharedCoreWaits;
  s.sleeps += now.sleeps - before.sleeps;
  s.singleCopyBytes += now.singleCopyBytes - before.singleCopyBytes;
  s.deviceMessages += now.deviceMessages - before.deviceMessages;
  s.payloadBytes += payload;
  s.seconds += elapsed.count();
  s.inlineCalls += task.inlined ? 1 : 0;
}

std::map<std::string, OpStats> Worker::stats() const {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

void Worker::resetStats() {
  std::lock_guard<std::mutex> lock(statsMutex_);
  stats_.clear();
}

// ---------------------------------------------------------------- teardown

void Worker::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) {
      return;
    }
    stop_ = true;
  }
  cv_.notify_all();
  comm_->wake();
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();  // destroyed from a callback on the worker itself
    } else {
      thread_.join();
    }
  }
}

void Worker::abort(bool keepLinks) {
  waitAtClose_.store(false);     // an abort does not wait for the other ranks
  comm_->requestAbort(keepLinks);  // nor does the op running now (on the worker or inline)
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(queue_);
  }
  for (auto& task : dropped) {
    if (task.work) {
      task.work->markError(asDistError(strCat("ringdist ", opTypeName(task.type), ": rank ",
                                              rank_, ": the process group was aborted")));
    }
  }
  stop();
}

}  // namespace ringdist
