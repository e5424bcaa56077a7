#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "csrc/backend/flight_recorder.h"
#include "csrc/backend/work.h"
#include "csrc/collectives/communicator.h"
#include "csrc/collectives/p2p.h"

namespace ringdist {

// Adds "<route>_us" to `out`: the model's predicted allreduce time of `bytes` over `ranks`
// hosts by each route it allows (as allreduce_route and the model's Python binding report).
void addAllreduceTimes(const RouteModel& model, int ranks, size_t bytes,
                       std::map<std::string, std::string>* out);

// What the worker measured around the operations it ran, per op name
// ("allreduce", "compressed_allreduce/int8", ...).
struct OpStats {
  uint64_t calls = 0;
  uint64_t bytesSent = 0;      // wire bytes, headers included
  uint64_t bytesReceived = 0;
  uint64_t bytesSentAcrossHosts = 0;  // of bytesSent, to peers on other hosts
  uint64_t payloadBytes = 0;   // bytes of the operation's output tensors
  double seconds = 0;          // wall time of the operation on the worker
  uint64_t inlineCalls = 0;    // calls the caller's thread ran (the latency path)
  uint64_t sharedCoreWaits = 0;  // waits that slept at once: a peer was on this CPU
  uint64_t sleeps = 0;           // shared-memory waits that slept on their doorbell
  uint64_t singleCopyBytes = 0;  // bytes copied straight from or into peers' memory (same host)
  uint64_t deviceMessages = 0;   // sends handed over GPU to GPU (ranks sharing a GPU)
};

// The one thread that owns a group's engine (Communicator and
// PointToPoint): it runs queued operations in issue order, which is the same
// on every rank, completes their Works, keeps point-to-point transfers
// moving between operations, and keeps statistics. Any thread may queue;
// only the worker touches the engine.
class Worker {
 public:
  // Runs on the worker, over the group's communicator.
  using Body = std::function<void(Communicator&)>;
  // Posts a send or receive on the point-to-point layer; it calls
  // moved(source rank) once the bytes moved.
  using Moved = std::function<void(int source)>;
  using Post = std::function<void(PointToPoint&, Moved moved)>;

  // `recorder` gets each operation's start and end; `onFailure` runs on the
  // group's first failure (it writes the trace).
  Worker(int rank, std::unique_ptr<Communicator> comm, std::shared_ptr<FlightRecorder> recorder,
         std::function<void()> onFailure);
  ~Worker();

  // Queues `body` as one operation (flight-recorder record `traceId`); the
  // Work completes when it returned (or fails with the error it threw, which
  // aborts the group). With a `stage` (CUDA tensors, gpu/stage/device_stage.h) the body
  // runs between the stage's stageIn() and recordDone().
  // inlineIfIdle (the latency path: the caller waits for the result anyway,
  // or the group has one rank): when the worker is idle, with nothing queued,
  // running or in flight, the calling thread runs the operation itself, in
  // the same order, while the worker waits, and the Work is complete on
  // return: no thread hand-off either way.
  c10::intrusive_ptr<RingdistWork> enqueue(c10d::OpType type, OpType engineType,
                                           std::string statsKey, std::vector<at::Tensor> outputs,
                                           std::chrono::milliseconds timeout, uint64_t traceId,
                                           Body body, std::shared_ptr<DeviceStage> stage,
                                           bool inlineIfIdle);
  // Runs `body` as one operation for a caller that waits for it anyway (the
  // direct operators): on the calling thread when the worker is idle, as
  // enqueue's latency path, but with no Work made; otherwise queued behind
  // what is in flight and waited for. Throws the operation's error (which
  // aborted the group, as enqueue's would) to the caller.
  void runNow(c10d::OpType type, OpType engineType, std::string statsKey,
              const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout,
              uint64_t traceId, Body body);
  // Queues a send or receive of `flat` (user's contiguous view, copy or host
  // twin); the Work completes between operations once the bytes moved, after
  // `flat` was copied back into `user`. CPU tensors with the worker idle: the
  // caller posts it and moves it for a moment itself (settleInline).
  c10::intrusive_ptr<RingdistWork> enqueueTransfer(c10d::OpType type, const char* name,
                                                   at::Tensor user, at::Tensor flat,
                                                   std::chrono::milliseconds timeout,
                                                   uint64_t traceId, Post post,
                                                   std::shared_ptr<DeviceStage> stage);
  // Changes the collectives' settings between the operations issued before
  // and after this call, on the worker, and waits until that happened.
  void configure(const std::function<void(CollectiveOptions&)>& change);
  CollectiveOptions options() const;
  // Two-level allreduce rings {host ring, cross ring}, or {} for one flat ring.
  std::vector<std::vector<int>> allreduceRings() const;
  // The route an allreduce of `bytes` takes (allreduceRoute), the compressed allreduce's of as many
  // float32 values by codec ("route/int8", ...), and the route model's figures.
  std::map<std::string, std::string> allreduceRoute(size_t bytes) const;

  std::map<std::string, OpStats> stats() const;
  std::vector<int> deadPeers() const { return comm_->deadPeers(); }
  std::vector<Channel::SendTotals> sendTotals() const { return comm_->sendTotals(); }
  std::vector<int64_t> quietMs() const { return comm_->quietMs(); }
  int capSendRate(uint64_t bytesPerSecond) { return comm_->capSendRate(bytesPerSecond); }
  void keepLinksOnError() { comm_->keepLinksOnError(); }
  void resetStats();

  // Runs what is queued, then closes the connections (orderly teardown).
  void stop();
  // Fails what is queued, then stops without waiting for the other ranks. keepLinks (a
  // shrink): the links stay open for releaseLinks.
  void abort(bool keepLinks = false);
  // After abort(true): Communicator::releaseLinks.
  std::vector<std::unique_ptr<Channel>> releaseLinks(const std::vector<int>& ranks) {
    return comm_->releaseLinks(ranks);
  }
  // The teardown at stop() closes at once instead of waiting for every rank
  // (a shrunk-away group: the excluded ranks never arrive).
  void closeWithoutWaiting() { waitAtClose_.store(false); }

 private:
  struct Task {
    c10::intrusive_ptr<RingdistWork> work;  // null for settings changes
    bool completesOnReturn = true;          // false: a transfer, completed once its bytes moved
    OpType type = OpType::kBarrier;
    std::string statsKey;                   // empty: not an operation (settings change)
    std::chrono::milliseconds timeout{0};
    Body body;
    uint64_t traceId = 0;
    bool inlined = false;  // run by the caller (tryRunInline)
    uint64_t payloadBytes = 0;  // the outputs' bytes (stats)
    std::exception_ptr error;   // the failure of a task without Work (runNow)
  };
  // A queued send or receive; `moved` is set by the transport callback and
  // the Work is completed by reapTransfers() between operations, never inside
  // the progress loop (completion runs user callbacks).
  struct Transfer {
    c10::intrusive_ptr<RingdistWork> work;
    at::Tensor user;
    at::Tensor flat;
    std::shared_ptr<bool> moved;
    std::shared_ptr<int> source;  // the sender, once known
    uint64_t traceId = 0;
  };

  void push(Task task);
  // Runs `task` on the calling thread if the worker is idle; false otherwise.
  bool tryRunInline(Task& task);
  // After a send or receive was posted inline: moves it on the caller's
  // thread for a moment; what is still in flight then is the worker's.
  void settleInline();
  void loop();
  // Waits for the next task; meanwhile keeps point-to-point traffic moving.
  // False once stopping with nothing queued.
  bool next(Task* task);
  void idleStep(std::unique_lock<std::mutex>& lock);
  void run(Task& task);
  // The communicator's running totals, taken around each operation.
  struct Counters {
    uint64_t sent, received, sharedCoreWaits, sleeps, singleCopyBytes, deviceMessages,
        sentAcrossHosts;
  };
  Counters counters() const;
  void recordStats(const Task& task, std::chrono::duration<double> elapsed,
                   const Counters& before);
  // After an error the group is unusable (streams may be out of step):
  // every pending transfer fails with the same message.
  void failTransfers(const std::string& message);
  void reapTransfers();
  // Point-to-point progress outside any operation: an error aborts the group.
  void betweenOps(const std::function<void()>& step);
  // The error text for `e`: the first error aborts the group (named, and naming the group's
  // first error); after that, errors pass as they are.
  std::string abortOn(const std::exception& e);
  void pollAnySource();
  // Marks a failed operation's Work and the group's transfers, and writes
  // the trace.
  void fail(const c10::intrusive_ptr<RingdistWork>& work, const std::string& message);

  const int rank_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<PointToPoint> p2p_;
  const std::shared_ptr<FlightRecorder> recorder_;
  const std::function<void()> onFailure_;
  std::vector<Transfer> transfers_;  // the engine's owner only (worker, or an inline caller)
  std::atomic<size_t> inFlight_{0};  // transfers_.size(), for callers (tryRunInline)

  mutable std::mutex mutex_;  // everything below up to inlineThread_
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::atomic<bool> waitAtClose_{true};
  // The worker waits for work with no transfer in flight: the engine is free
  // for an inline operation.
  bool workerParked_ = false;
  bool workerTask_ = false;  // the worker took a task and has not come back for the next
  bool inlineRunning_ = false;  // a caller is running one (tryRunInline); the worker waits
  bool workerAwaitsInline_ = false;  // the worker, woken meanwhile, waits for it to end
  bool transfersLeft_ = false;  // an inline operation left transfers in flight for the worker
  std::atomic<std::thread::id> inlineThread_{};

  // The worker changes the communicator's options under this lock; other
  // threads read them under it.
  mutable std::mutex optionsMutex_;

  mutable std::mutex statsMutex_;
  std::map<std::string, OpStats> stats_;

  std::thread thread_;
  std::atomic<std::thread::id> threadId_{};
};

}  // namespace ringdist
