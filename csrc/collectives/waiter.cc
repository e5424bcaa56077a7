#include "csrc/collectives/waiter.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "csrc/common/error.h"

namespace ringdist {

// What one waitForActivity waits on.
struct Waiter::WaitSet {
  std::vector<pollfd> fds;
  std::vector<Channel*> owners;  // by fd; nullptr: the wake fd
  Doorbell* bell = nullptr;      // a pending shared-memory link's, else null
  int cpu = -1;                  // this thread's, once a shared-memory link is pending
  bool coreShared = false;       // a peer we wait for last waited on that CPU
};

Waiter::Waiter(const std::vector<std::unique_ptr<Channel>>& channels) : channels_(channels) {
  int sharing = 1;  // ranks of this group sharing this host's cores
  for (const auto& ch : channels_) {
    sharing += (ch && ch->doorbell() != nullptr) ? 1 : 0;
    if (ch && ch->doorbell() != nullptr) localBell_ = ch->doorbell();
  }
  watched_.assign(channels_.size(), 0);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RINGDIST_CHECK(wakeFd_ >= 0, "ringdist: eventfd failed: ", std::strerror(errno));
  spin_ = localBell_ == nullptr || sharing <= localBell_->hostCores();
}

Waiter::~Waiter() { ::close(wakeFd_); }

bool Waiter::progress() {
  bool moved = false;
  for (auto& ch : channels_) {
    if (ch && ch->hasPending()) {
      moved = ch->progress() || moved;
    }
  }
  return moved;
}

bool Waiter::hasPending() const {
  for (const auto& ch : channels_) {
    if (ch && ch->hasPending()) {
      return true;
    }
  }
  return false;
}

bool Waiter::watchingAny() const {
  return std::any_of(watched_.begin(), watched_.end(), [](char w) { return w != 0; });
}

bool Waiter::watchedArrival() {
  char byte;
  for (size_t p = 0; p < channels_.size(); ++p) {
    if (watched_[p] && channels_[p] && channels_[p]->peek(&byte, 1)) {
      return true;
    }
  }
  return false;
}

bool Waiter::bufferedArrival() const {
  for (size_t p = 0; p < channels_.size(); ++p) {
    const Channel* ch = channels_[p].get();
    if (ch && (ch->receiving() || watched_[p]) && ch->bufferedInput()) {
      return true;
    }
  }
  return false;
}

void Waiter::wake() {
  wakes_.fetch_add(1);
  // The syscalls only when the worker may be asleep (both atomics are
  // sequentially consistent: it sees our count, or we see its flag).
  if (idleWaiting_.load()) {
    signal();
  }
}

void Waiter::interrupt() {
  // Unconditionally: an operation's wait polls the eventfd and sleeps on the bell too.
  signal();
}

void Waiter::signal() {
  const uint64_t one = 1;
  ssize_t written = ::write(wakeFd_, &one, sizeof(one));
  (void)written;  // EAGAIN: the counter is already non-zero, the fd already readable
  if (localBell_ != nullptr) {
    localBell_->ring();
  }
}

void Waiter::publishCpu() {
  if (localBell_ != nullptr) {
    localBell_->publishCpu(sched_getcpu());
  }
}

void Waiter::waitIdle(Clock::time_point deadline, uint64_t wakesSeen) {
  idleWaiting_.store(true);
  waitForActivity(deadline, kUncappedSleep, &wakesSeen);
  idleWaiting_.store(false);
}

void Waiter::waitForActivity(Clock::time_point deadline, std::chrono::microseconds maxSleep,
                             const uint64_t* wakesSeen) {
  WaitSet set = waitSet();
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    return;  // the caller's next wait throws
  }
  const auto cap = std::min<std::chrono::microseconds>(maxSleep, left);
  if (wokenSince(wakesSeen) || bufferedArrival()) {
    return;
  }
  if (set.bell != nullptr && set.fds.empty()) {
    sleepOnDoorbell(set, cap, wakesSeen);
  } else if (!set.fds.empty()) {
    pollLinks(set, cap);
  } else if (maxSleep < kUncappedSleep) {
    std::this_thread::sleep_for(cap);  // the caller polls a condition with no fd
  }
  // Else nothing is pending: the caller's condition decides.
}

Waiter::WaitSet Waiter::waitSet() {
  WaitSet set;
  for (size_t p = 0; p < channels_.size(); ++p) {
    Channel* ch = channels_[p].get();
    if (ch == nullptr) continue;
    const bool watched = watched_[p] && !ch->receiving();
    if (ch->pollFd() >= 0) {
      set.fds.push_back(
          pollfd{ch->pollFd(), static_cast<short>(ch->pollEvents() | (watched ? POLLIN : 0)), 0});
      set.owners.push_back(ch);
    } else if (watched && ch->incomingFd() >= 0) {
      set.fds.push_back(pollfd{ch->incomingFd(), POLLIN | POLLRDHUP, 0});
      set.owners.push_back(ch);
    } else if ((ch->hasPending() || watched) && ch->doorbell() != nullptr) {
      set.bell = ch->doorbell();
      if (set.cpu < 0) {
        set.cpu = sched_getcpu();
      }
      set.coreShared = set.coreShared || ch->peerCpu() == set.cpu;
    }
  }
  return set;
}

void Waiter::sleepOnDoorbell(const WaitSet& set, std::chrono::microseconds cap,
                             const uint64_t* wakesSeen) {
  set.bell->publishCpu(set.cpu);
  sharedCoreWaits_ += spin_ && set.coreShared ? 1 : 0;
  const auto left = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(cap));
  const BellWait waited =
      waitOnBell(set.bell, spin_ && !set.coreShared, std::min<std::chrono::milliseconds>(left, kMaxSleep),
                 [&] { return progress() || watchedArrival() || wokenSince(wakesSeen); });
  if (waited == BellWait::kQuiet) {
    // Quiet for a whole sleep: make sure the peers we wait for are alive.
    for (size_t p = 0; p < channels_.size(); ++p) {
      if (channels_[p] && (channels_[p]->hasPending() || watched_[p])) {
        channels_[p]->checkAlive();
      }
    }
  }
}

void Waiter::pollLinks(WaitSet& set, std::chrono::microseconds cap) {
  // wake() while idle, or interrupt()
  set.fds.push_back(pollfd{wakeFd_, POLLIN, 0});
  set.owners.push_back(nullptr);
  // With shared-memory links pending too, poll the sockets in short slices
  // so the shared-memory side is looked at again soon.
  const auto slice = set.bell != nullptr
      ? std::min<std::chrono::microseconds>(cap, std::chrono::milliseconds(1))
      : cap;
  timespec ts{static_cast<time_t>(slice.count() / 1000000),
              static_cast<long>(slice.count() % 1000000) * 1000};
  if (::ppoll(set.fds.data(), set.fds.size(), &ts, nullptr) > 0) {
    handlePolled(set);
  }
}

void Waiter::handlePolled(const WaitSet& set) {
  for (size_t i = 0; i < set.fds.size(); ++i) {
    const short events = set.fds[i].revents;
    if (set.owners[i] == nullptr) {
      if ((events & POLLIN) != 0) {
        uint64_t count = 0;
        ssize_t got = ::read(wakeFd_, &count, sizeof(count));  // reset the eventfd
        (void)got;
      }
      continue;
    }
    // A peer that hung up while we only have sends queued for it: the sends
    // can never be consumed. (With receives queued, progress() reads what is
    // left and then reports the close itself.)
    if ((events & (POLLHUP | POLLRDHUP | POLLERR)) != 0 && !(events & POLLIN)) {
      if (!set.owners[i]->progress()) {
        RINGDIST_FAIL("connection to rank ", set.owners[i]->peer(), " closed by the peer");
      }
    }
  }
}

}  // namespace ringdist
