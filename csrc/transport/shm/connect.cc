#include "csrc/transport/shm/connect.h"

#include <sched.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/transport/shm/channel.h"

namespace ringdist {
namespace shm {

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<Segment> createAndPublish(Rendezvous& rendezvous, int rank, int count,
                                          const std::string& nameKey,
                                          const MeshOptions& options) {
  auto segment = std::make_shared<Segment>(Segment::create(count, options.shmRingBytes));
  rendezvous.set(nameKey, std::vector<uint8_t>(segment->name().begin(), segment->name().end()));
  // Unlink as soon as every local rank has mapped it: from then on the
  // memory lives exactly as long as the mappings, crash or not.
  const auto deadline = Clock::now() + options.timeout;
  auto pause = std::chrono::microseconds(50);
  while (rendezvous.add(nameKey + "/mapped", 0) < count - 1) {
    if (Clock::now() > deadline) {
      throw TimeoutError(strCat("ringdist: Timed out after ", options.timeout.count(),
                                " ms: rank ", rank, " waits for its same-host peers to map ",
                                "shared memory"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  segment->unlinkName();
  rendezvous.set(nameKey + "/unlinked", {1});
  return segment;
}

std::shared_ptr<Segment> mapPublished(Rendezvous& rendezvous, int rank, int count,
                                      const std::string& nameKey, const MeshOptions& options) {
  auto raw = rendezvous.get(nameKey, options.timeout);
  std::this_thread::sleep_for(options.testShmMapDelay);
  auto segment = std::make_shared<Segment>(Segment::open(std::string(raw.begin(), raw.end())));
  RINGDIST_CHECK(segment->localRanks() == count, "ringdist: rank ", rank,
                 " mapped a shared-memory segment for ", segment->localRanks(),
                 " ranks but expected ", count);
  // The last rank to map it removes the name as well: a creator killed before its own unlink
  // would leave it in /dev/shm for good.
  if (rendezvous.add(nameKey + "/mapped", 1) == count - 1) {
    removeSharedName(segment->name());
  }
  // Return only once the name is gone, so nothing of ours is visible in
  // /dev/shm after init on any rank.
  rendezvous.get(nameKey + "/unlinked", options.timeout);
  return segment;
}

// A random value at a fixed address of this process: a peer that reads it
// back through process_vm_readv reads our memory, not some other process's.
// Writable: peers also write the same value back (process_vm_writev).
const uint64_t* probeToken() {
  static uint64_t token = [] {
    uint64_t value = 0;
    while (::getrandom(&value, sizeof(value), 0) != static_cast<ssize_t>(sizeof(value))) {
    }
    return value | 1;
  }();
  return &token;
}

// How waitForBells waits: sleeping with a growing pause while the ranks may
// arrive far apart (connecting), or yielding the core while they arrive
// together (the copy probe's steps: ranks may outnumber cores).
enum class BellWait { kSleep, kYield };

// Waits until every local rank's `field` in its bell reached at least `value`
// (`what` the peers are doing, for the timeout's message).
void waitForBells(const Segment& segment, std::atomic<uint32_t> Bell::*field, uint32_t value,
                  BellWait how, const char* what, int rank, Clock::time_point deadline,
                  std::chrono::milliseconds timeout) {
  auto pause = std::chrono::microseconds(20);
  for (int i = 0; i < segment.localRanks(); ++i) {
    while ((segment.bell(i)->*field).load(std::memory_order_acquire) < value) {
      if (Clock::now() > deadline) {
        throw TimeoutError(strCat("ringdist: Timed out after ", timeout.count(), " ms: rank ",
                                  rank, " waits for its same-host peers to ", what));
      }
      if (how == BellWait::kYield) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(20000));
      }
    }
  }
}

// Empty if this process can read the peer's probe value and write it back
// unchanged, else why not.
std::string probePeer(const Bell& peer) {
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{reinterpret_cast<void*>(peer.probeAddress), sizeof(got)};
  ssize_t n = ::process_vm_readv(peer.pid, &local, 1, &remote, 1, 0);
  if (n < 0) {
    return strCat("process_vm_readv: ", std::strerror(errno));
  }
  if (n != sizeof(got) || got != peer.probeValue) {
    return "it read another value";
  }
  n = ::process_vm_writev(peer.pid, &local, 1, &remote, 1, 0);
  return n == sizeof(got) ? "" : strCat("process_vm_writev: ", n < 0 ? std::strerror(errno) : "short");
}

// Empty if every local rank can read and write every other's memory (CMA),
// else why not; every local rank gets the same answer. Containers whose
// seccomp profile or ptrace policy forbids process_vm_readv/writev fall back
// to the rings.
std::string agreeSingleCopy(const Segment& segment, int self, const std::vector<int>& local,
                            const MeshOptions& options) {
  const int rank = local[static_cast<size_t>(self)];
  Bell* mine = segment.bell(self);
  mine->probeAddress = reinterpret_cast<uint64_t>(probeToken());
  mine->probeValue = *probeToken();
  mine->copyMode = static_cast<uint32_t>(options.singleCopy);
  mine->singleCopy.store(kProbePublished, std::memory_order_release);
  const auto deadline = Clock::now() + options.timeout;
  waitForBells(segment, &Bell::singleCopy, kProbePublished, BellWait::kSleep,
               "probe single copy", rank, deadline, options.timeout);
  std::string failed = options.singleCopy != SingleCopyMode::kOff
      ? "" : "off (RINGDIST_SINGLE_COPY=0 or RINGDIST_SINGLE_COPY_BYTES=0)";
  for (int i = 0; i < segment.localRanks() && failed.empty(); ++i) {
    if (i != self) {
      failed = probePeer(*segment.bell(i));
    }
  }
  mine->singleCopy.store(failed.empty() ? kReadsEveryPeer : kNoPeerReads,
                         std::memory_order_release);
  waitForBells(segment, &Bell::singleCopy, kReadsEveryPeer, BellWait::kSleep,
               "probe single copy", rank, deadline, options.timeout);
  if (!failed.empty()) {
    return strCat("rank ", rank, ": ", failed);
  }
  for (int i = 0; i < segment.localRanks(); ++i) {
    if (segment.bell(i)->singleCopy.load(std::memory_order_acquire) != kReadsEveryPeer) {
      return strCat("rank ", local[static_cast<size_t>(i)], " cannot or will not");
    }
  }
  return "";
}

// The copy probe's barrier: returns once every local rank reached `step`.
void probeBarrier(const Segment& segment, int self, uint32_t step, int rank,
                  Clock::time_point deadline, std::chrono::milliseconds timeout) {
  segment.bell(self)->probeStep.store(step, std::memory_order_release);
  waitForBells(segment, &Bell::probeStep, step, BellWait::kYield, "time their copies", rank,
               deadline, timeout);
}

uint64_t nanosSince(Clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

// Every local rank at once times moving kCopyProbeBytes from its left local
// neighbour both ways: one process_vm_readv of the neighbour's buffer, or
// what the rings do, a memcpy into shared memory (by the neighbour) and one
// out of it (by us); best of kCopyProbeRounds (the first round pays the page
// faults). The ring data areas, still unused, serve as the shared memory.
// Publishes this rank's times in its bell; all ranks' are there on return.
void probeCopies(const Segment& segment, int self, int rank, const MeshOptions& options) {
  const int count = segment.localRanks();
  const int left = (self + count - 1) % count;
  const int right = (self + 1) % count;
  const size_t bytes = std::min(kCopyProbeBytes, segment.ringBytes());
  const auto deadline = Clock::now() + options.timeout;
  std::vector<char> source(bytes, static_cast<char>(self + 1));
  std::vector<char> target(bytes);
  Bell* mine = segment.bell(self);
  const Bell* from = segment.bell(left);
  mine->probeBuffer = reinterpret_cast<uint64_t>(source.data());
  uint32_t step = 0;
  probeBarrier(segment, self, ++step, rank, deadline, options.timeout);
  uint64_t kernelNs = UINT64_MAX;
  uint64_t ringNs = UINT64_MAX;
  for (int round = 0; round < kCopyProbeRounds; ++round) {
    auto start = Clock::now();
    std::memcpy(segment.data(self, right), source.data(), bytes);
    const uint64_t in = nanosSince(start);
    probeBarrier(segment, self, ++step, rank, deadline, options.timeout);
    start = Clock::now();
    std::memcpy(target.data(), segment.data(left, self), bytes);
    ringNs = std::min(ringNs, in + nanosSince(start));
    iovec local{target.data(), bytes};
    iovec remote{reinterpret_cast<void*>(from->probeBuffer), bytes};
    start = Clock::now();
    const ssize_t n = ::process_vm_readv(from->pid, &local, 1, &remote, 1, 0);
    if (n == static_cast<ssize_t>(bytes)) {  // else it stays "infinitely slow"
      kernelNs = std::min(kernelNs, nanosSince(start));
    }
    // The neighbour rewrites its half of the ring only after we read it.
    probeBarrier(segment, self, ++step, rank, deadline, options.timeout);
  }
  mine->kernelCopyNs = kernelNs;
  mine->ringCopyNs = ringNs;
  // Also keeps `source` alive until every reader is done with it.
  probeBarrier(segment, self, ++step, rank, deadline, options.timeout);
}

// Single copy or the rings for this host, the same answer on every local rank.
SameHostCopy chooseCopy(const Segment& segment, int self, const std::vector<int>& local,
                        const MeshOptions& options) {
  const int rank = local[static_cast<size_t>(self)];
  SameHostCopy choice;
  choice.why = agreeSingleCopy(segment, self, local, options);
  if (!choice.why.empty()) {
    choice.why = strCat("rings: no single copy on this host (", choice.why, ")");
    return choice;
  }
  for (int i = 0; i < segment.localRanks(); ++i) {
    if (segment.bell(i)->copyMode == static_cast<uint32_t>(SingleCopyMode::kOn)) {
      choice.singleCopy = true;
      choice.why = strCat("single copy: RINGDIST_SINGLE_COPY=1 on rank ",
                          local[static_cast<size_t>(i)]);
      return choice;
    }
  }
  probeCopies(segment, self, rank, options);
  for (int i = 0; i < segment.localRanks(); ++i) {
    const Bell* bell = segment.bell(i);
    choice.kernelCopyUs += bell->kernelCopyNs == UINT64_MAX ? HUGE_VAL : bell->kernelCopyNs * 1e-3;
    choice.ringCopyUs += bell->ringCopyNs * 1e-3;
  }
  choice.singleCopy = choice.kernelCopyUs <= kRingsWinRatio * choice.ringCopyUs;
  choice.why = strCat(choice.singleCopy ? "single copy" : "rings", ": measured at connect, ",
                      std::min(kCopyProbeBytes, segment.ringBytes()) >> 10,
                      " KiB from a peer took ", choice.kernelCopyUs,
                      " us by process_vm_readv against ", choice.ringCopyUs,
                      " us by two memcpys through shared memory (sums over ",
                      segment.localRanks(), " ranks; the rings need x", kRingsWinRatio, ")");
  return choice;
}

// The segment's board areas, by rank for the host's ranks.
class ShmBoard final : public Board {
 public:
  ShmBoard(std::shared_ptr<Segment> segment, const std::vector<int>& local)
      : segment_(std::move(segment)), localOf_(static_cast<size_t>(local.back()) + 1, -1) {
    for (size_t i = 0; i < local.size(); ++i) localOf_[static_cast<size_t>(local[i])] = static_cast<int>(i);
  }
  char* area(int rank) const override { return segment_->board(localOf(rank)); }
  void wake(int rank) override { wakeIfSleeping(segment_->bell(localOf(rank))); }

 private:
  int localOf(int rank) const { return localOf_[static_cast<size_t>(rank)]; }
  std::shared_ptr<Segment> segment_;
  std::vector<int> localOf_;  // by rank: its local index
};

// Our affinity into the bell, before agreeSingleCopy publishes it to the peers.
void publishCpus(Bell* bell) {
  if (::sched_getaffinity(0, sizeof(bell->cpus), &bell->cpus) != 0) {
    CPU_ZERO(&bell->cpus);
    for (int cpu = 0; cpu < static_cast<int>(std::thread::hardware_concurrency()); ++cpu) {
      CPU_SET(cpu, &bell->cpus);
    }
  }
}

// How many CPUs any local rank may run on, once every rank has published.
int unionOfCpus(const Segment& segment) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int i = 0; i < segment.localRanks(); ++i) {
    CPU_OR(&all, &all, &segment.bell(i)->cpus);
  }
  return CPU_COUNT(&all);
}

}  // namespace

SameHostCopy connectLocal(Rendezvous& rendezvous, int rank, const std::vector<int>& local,
                          const MeshOptions& options,
                          std::vector<std::unique_ptr<Channel>>& channels,
                          std::shared_ptr<Board>* board) {
  const int leader = local.front();
  const int count = static_cast<int>(local.size());
  const int self = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  const std::string nameKey = strCat("ringdist/shm/", leader);
  std::shared_ptr<Segment> segment = rank == leader
      ? createAndPublish(rendezvous, rank, count, nameKey, options)
      : mapPublished(rendezvous, rank, count, nameKey, options);
  segment->bell(self)->pid = static_cast<int32_t>(::getpid());
  segment->bell(self)->startTime = processStartTime(::getpid());
  segment->bell(self)->cpu.store(-1);
  publishCpus(segment->bell(self));
  // Its barriers also order every rank's mask before the union below.
  const SameHostCopy copy = chooseCopy(*segment, self, local, options);
  if (self == 0) {
    std::string ranks;
    for (int r : local) {
      ranks += strCat(ranks.empty() ? "" : ",", r);
    }
    logDebug(strCat("ringdist: ranks ", ranks, " (one host): ", copy.why));
  }
  auto doorbell = std::make_shared<LocalDoorbell>(segment->bell(self), unionOfCpus(*segment));
  for (int i = 0; i < count; ++i) {
    if (i != self) {
      int peer = local[static_cast<size_t>(i)];
      channels[static_cast<size_t>(peer)] =
          std::make_unique<ShmChannel>(peer, segment, self, i, doorbell, options.link,
                                       copy.singleCopy);
    }
  }
  *board = std::make_shared<ShmBoard>(segment, local);
  return copy;
}

}  // namespace shm
}  // namespace ringdist
