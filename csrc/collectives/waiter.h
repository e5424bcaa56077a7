#pragma once

// How the worker waits for its links and how other threads wake it: the wait
// policy. Every wait first progresses the links; when nothing moves it either
// polls (TCP links: their sockets, plus the wake eventfd) or, when only
// shared-memory links are pending, spins a while and then sleeps on this
// rank's doorbell, which peers ring after moving bytes. It spins only when
// every local rank has a core, and not for a peer that last waited on our
// CPU: the scheduler put it beside us, and it runs only once we leave the core.

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/transport/channel.h"

namespace ringdist {

// Before sleeping on a shared-memory doorbell, poll this long: a peer on
// another core usually answers within microseconds, and a futex round trip
// costs more than that. Skipped when ranks outnumber cores.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(50);
// Longest single sleep; between sleeps dead peers and deadlines are checked.
constexpr auto kMaxSleep = std::chrono::milliseconds(50);
// waitForPeer's looks at its condition (the board) before a timed wait (a
// pause each, ~1 us in all).
constexpr int kQuickLooks = 64;

class Waiter {
 public:
  using Clock = std::chrono::steady_clock;
  // waitForActivity's maxSleep for "until activity" (poll slices of at most 1 s).
  static constexpr std::chrono::microseconds kUncappedSleep = std::chrono::seconds(1);

  // channels: the communicator's, indexed by rank (null where there is none);
  // they outlive the waiter.
  explicit Waiter(const std::vector<std::unique_ptr<Channel>>& channels);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // Progress every channel once without blocking; true if a byte moved.
  bool progress();
  bool hasPending() const;

  // Blocks until some channel can progress, `deadline` passes or maxSleep
  // elapsed (for conditions no file descriptor signals, such as a send queue
  // draining). wakesSeen (idle waits only): wakeCount() when the caller last
  // found nothing to do; a wake() since then ends the wait. Abort and the
  // deadline are the caller's to check before.
  void waitForActivity(Clock::time_point deadline, std::chrono::microseconds maxSleep,
                       const uint64_t* wakesSeen);
  // waitForActivity between operations: wake() interrupts it at once.
  void waitIdle(Clock::time_point deadline, uint64_t wakesSeen);
  // Until ready(), which `peer` makes true and then rings our doorbell:
  // looks a while (kQuickLooks), then waits on the doorbell in sleeps of at
  // most kMaxSleep, calling throwIfStopped() and checking the peer's links
  // before each and its liveness after a quiet one.
  template <typename Ready, typename Stop>
  void waitForPeer(Channel& peer, Clock::time_point deadline, const Ready& ready,
                   const Stop& throwIfStopped);

  // Receives from any source watch links with nothing queued on them: bytes
  // arriving there end an idle wait as well.
  void setWatched(int peer, bool on) { watched_[static_cast<size_t>(peer)] = on ? 1 : 0; }
  bool watchingAny() const;
  // Any thread: ends an idle wait (new work was queued).
  void wake();
  // Any thread: ends any wait now (the caller's stop check then throws).
  void interrupt();
  uint64_t wakeCount() const { return wakes_.load(); }
  // An operation starts: tells the peers the CPU this thread now runs on,
  // fresh for their first waits.
  void publishCpu();

  // Whether waits may busy-poll (every local rank has a core).
  bool spins() const { return spin_; }
  // Whether a busy-poll yields the core between looks (true: the op runs on
  // the worker, and the process's caller thread may need the core; false:
  // the caller runs it, on the latency path).
  void setSpinYields(bool yields) { spinYields_ = yields; }
  // Waits that slept without spinning because a peer shared this CPU.
  uint64_t sharedCoreWaits() const { return sharedCoreWaits_; }
  // Shared-memory waits that went to sleep on their doorbell.
  uint64_t sleeps() const { return sleeps_; }

 private:
  struct WaitSet;

  static inline void cpuRelax();
  // One wait on a doorbell: spins kSpinBeforeSleep if `spin`, then sleeps on
  // `bell` for at most `left`. kQuiet: a whole sleep passed with done()
  // still false and no wake-up.
  enum class BellWait { kDone, kWoken, kQuiet };
  template <typename Done>
  BellWait waitOnBell(Doorbell* bell, bool spin, std::chrono::microseconds left, const Done& done);
  // waitForActivity's steps: what to wait on; the doorbell wait when only
  // shared-memory links are pending (until a transfer moved, a watched link
  // got bytes, or a wake-up since wakesSeen; or one sleep); the poll of the
  // links' descriptors, and what it found.
  WaitSet waitSet();
  void sleepOnDoorbell(const WaitSet& set, std::chrono::microseconds cap,
                       const uint64_t* wakesSeen);
  void pollLinks(WaitSet& set, std::chrono::microseconds cap);
  void handlePolled(const WaitSet& set);
  // Bytes on a watched link: what progress() reports for queued receives.
  bool watchedArrival();
  // Bytes a receive or a watch wants, already in a channel's own buffers.
  bool bufferedArrival() const;
  bool wokenSince(const uint64_t* wakesSeen) const {
    return wakesSeen != nullptr && wakes_.load() != *wakesSeen;
  }
  // Makes the wake eventfd readable and rings our doorbell.
  void signal();

  const std::vector<std::unique_ptr<Channel>>& channels_;
  std::vector<char> watched_;  // by peer, see setWatched
  bool spin_ = false;  // busy-poll briefly before sleeping (a core per local rank)
  bool spinYields_ = true;
  uint64_t sharedCoreWaits_ = 0;
  uint64_t sleeps_ = 0;
  int wakeFd_ = -1;                // eventfd written by wake(), polled by waits on sockets
  Doorbell* localBell_ = nullptr;  // our doorbell (any shared-memory link's), else null
  std::atomic<bool> idleWaiting_{false};
  std::atomic<uint64_t> wakes_{0};
};

template <typename Ready, typename Stop>
void Waiter::waitForPeer(Channel& peer, Clock::time_point deadline, const Ready& ready,
                         const Stop& throwIfStopped) {
  const int cpu = sched_getcpu();
  localBell_->publishCpu(cpu);
  const bool coreShared = peer.peerCpu() == cpu;
  sharedCoreWaits_ += spin_ && coreShared ? 1 : 0;
  bool spin = spin_ && !coreShared;  // the first wait only
  // Back to back, the peer is most often a few hundred ns behind: look again
  // a while (~1 us) before the clock reads and checks of a full wait.
  for (int looks = 0; spin && looks < kQuickLooks; ++looks) {
    cpuRelax();
    if (ready()) return;
  }
  for (;;) {
    throwIfStopped();
    peer.checkOpen();  // a peer that aborted closed its links and rang us
    const auto left = std::min<std::chrono::microseconds>(
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()), kMaxSleep);
    const BellWait waited = waitOnBell(localBell_, spin, left, ready);
    if (waited == BellWait::kDone) return;
    if (waited == BellWait::kQuiet) peer.checkAlive();
    spin = false;
  }
}

template <typename Done>
Waiter::BellWait Waiter::waitOnBell(Doorbell* bell, bool spin, std::chrono::microseconds left,
                                    const Done& done) {
  if (spin) {
    const auto spinUntil = Clock::now() + kSpinBeforeSleep;
    for (unsigned looks = 1;; ++looks) {
      if (done()) return BellWait::kDone;
      // A yield may last a time slice: look at the clock after each one.
      if ((spinYields_ || looks % 16 == 0) && Clock::now() >= spinUntil) break;
      if (spinYields_) {
        // Our own process's other threads (the Python caller that enqueues
        // the next op or waits for this one) may need this core more than we do.
        sched_yield();
      } else {
        // The caller runs the op itself: nothing of ours needs the core, and
        // a yield would hand it to any busy process for a whole time slice.
        cpuRelax();
      }
    }
  }
  const uint32_t armed = bell->arm();
  // A final look after arming: a peer that rang before arm() is seen here,
  // one that rings after it bumps the word futex_wait compares against.
  if (done()) {
    bell->disarm();
    return BellWait::kDone;
  }
  const auto before = Clock::now();
  if (left.count() > 0) {
    ++sleeps_;
    bell->sleep(armed, left);
  }
  bell->disarm();
  if (Clock::now() - before < left) return BellWait::kWoken;
  return done() ? BellWait::kDone : BellWait::kQuiet;
}

inline void Waiter::cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace ringdist
