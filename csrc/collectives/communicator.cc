#include "csrc/collectives/communicator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sched.h>

#include <cstdlib>
#include <climits>
#include <cstring>
#include <algorithm>
#include <thread>

#include "csrc/codec/codec.h"
#include "csrc/common/error.h"
#include "csrc/common/logging.h"

namespace ringdist {

namespace {
using Clock = std::chrono::steady_clock;

std::string describeHeader(const OpHeader& h) {
  std::string text = strCat(opTypeName(static_cast<OpType>(h.type)), "(seq=", h.seq,
                            ", count=", h.count, ", dtype=",
                            dataTypeName(static_cast<DataType>(h.dtype)));
  auto type = static_cast<OpType>(h.type);
  if (type == OpType::kAllreduce || type == OpType::kReduceScatter || type == OpType::kReduce) {
    text += strCat(", op=", reduceOpName(static_cast<ReduceOp>(h.op)));
  }
  if (type == OpType::kCompressedAllreduce) {
    text += strCat(", op=", reduceOpName(static_cast<ReduceOp>(h.op)), ", codec=",
                   isKnownCodec(h.variant) ? codecName(static_cast<Codec>(h.variant)) : "?");
  }
  if (type == OpType::kAllreduce) {  // AllreduceVariant (collectives.h)
    static const char* kAlgorithms[] = {"ring", "one round", "two-level", "GPU to GPU",
                                        "single copy"};
    text += strCat(", algorithm=", h.variant < 5 ? kAlgorithms[h.variant] : "?");
  }
  if (type == OpType::kBroadcast || type == OpType::kAllgather ||
      type == OpType::kReduceScatter) {  // CopyVariant
    text += h.variant == 1 ? ", single copy" : ", through the links";
  }
  if (h.root >= 0) {
    text += strCat(", root=", h.root);
  }
  text += type == OpType::kSend ? strCat(", tag=", h.tag) : strCat(", segment_bytes=", h.segmentBytes);
  return text + ")";
}
}  // namespace

const char* opTypeName(OpType type) {
  switch (type) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllgather: return "allgather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kReduce: return "reduce";
    case OpType::kGather: return "gather";
    case OpType::kScatter: return "scatter";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send/recv";
    case OpType::kCompressedAllreduce: return "compressed_allreduce";
  }
  return "unknown";
}

Communicator::Communicator(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
                           std::vector<int> ring, std::vector<int> hostOf,
                           std::shared_ptr<Rendezvous> rendezvous,
                           const CollectiveOptions& options, std::shared_ptr<Board> board)
    : rank_(rank), size_(size), channels_(std::move(channels)), rendezvous_(std::move(rendezvous)),
      ring_{std::move(ring)}, hostOf_(std::move(hostOf)), options_(options),
      board_(std::move(board)) {
  RINGDIST_CHECK(ring_.size() == size_, "ringdist: ring order has ", ring_.size(),
                 " ranks, expected ", size_);
  const auto& order = ring_.members;
  ring_.pos = static_cast<int>(std::find(order.begin(), order.end(), rank_) - order.begin());
  int sharing = 1;  // ranks of this group sharing this host's cores
  for (const auto& ch : channels_) {
    sharing += (ch && ch->doorbell() != nullptr) ? 1 : 0;
    if (ch && ch->doorbell() != nullptr) localBell_ = ch->doorbell();
  }
  watched_.assign(static_cast<size_t>(size_), 0);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RINGDIST_CHECK(wakeFd_ >= 0, "ringdist: eventfd failed: ", std::strerror(errno));
  spin_ = localBell_ == nullptr || sharing <= localBell_->hostCores();
  peersCopyable_ = size_ > 1;
  for (int p = 0; p < size_; ++p) {
    peersCopyable_ = peersCopyable_ && (p == rank_ || (channels_[static_cast<size_t>(p)] &&
                                                       channels_[static_cast<size_t>(p)]->copiesPeerMemory()));
  }
  RINGDIST_CHECK(static_cast<int>(hostOf_.size()) == size_, "ringdist: host map has ",
                 hostOf_.size(), " ranks, expected ", size_);
  setUpHierarchy();
}

void Communicator::setOptions(const CollectiveOptions& options) {
  RINGDIST_CHECK(options.segmentBytes > 0, "ringdist: segment size must be positive");
  options_ = options;
  setUpHierarchy();
}

void Communicator::setUpHierarchy() {
  const std::vector<int>& hostOf = hostOf_;
  hierarchical_ = false;
  hostRing_ = SubRing{};
  crossRing_ = SubRing{};
  // Hosts are numbered in ring order, so host h holds ring positions
  // [h * perHost, (h + 1) * perHost) when every host has perHost ranks.
  const int hosts = *std::max_element(hostOf.begin(), hostOf.end()) + 1;
  hostCount_ = hosts;
  const int perHost = size_ / hosts;
  bool uniform = hosts >= 2 && perHost >= 2 && perHost * hosts == size_;
  for (int pos = 0; uniform && pos < size_; ++pos) {
    uniform = hostOf[static_cast<size_t>(ringRank(pos))] == pos / perHost;
  }
  if (!uniform || !options_.hierarchical) {
    return;
  }
  hierarchical_ = true;
  const int host = ring_.pos / perHost;
  const int local = ring_.pos % perHost;
  for (int i = 0; i < perHost; ++i) {
    hostRing_.members.push_back(ringRank(host * perHost + i));
  }
  hostRing_.pos = local;
  for (int h = 0; h < hosts; ++h) {
    crossRing_.members.push_back(ringRank(h * perHost + local));
  }
  crossRing_.pos = host;
}

Communicator::~Communicator() {
  std::free(scratch_);
  ::close(wakeFd_);
}

void Communicator::setWatched(int peer, bool on) { watched_[static_cast<size_t>(peer)] = on ? 1 : 0; }

bool Communicator::watchingAny() const {
  return std::any_of(watched_.begin(), watched_.end(), [](char w) { return w != 0; });
}

bool Communicator::watchedArrival() {
  char byte;
  for (size_t p = 0; p < channels_.size(); ++p) {
    if (watched_[p] && channels_[p] && channels_[p]->peek(&byte, 1)) {
      return true;
    }
  }
  return false;
}

void Communicator::wake() {
  wakes_.fetch_add(1);
  // The syscalls only when the worker may be asleep (both atomics are
  // sequentially consistent: it sees our count, or we see its flag).
  if (!idleWaiting_.load()) {
    return;
  }
  const uint64_t one = 1;
  ssize_t written = ::write(wakeFd_, &one, sizeof(one));
  (void)written;  // EAGAIN: the counter is already non-zero, the fd already readable
  if (localBell_ != nullptr) {
    localBell_->ring();
  }
}

void Communicator::cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void Communicator::requestAbort() {
  abortRequested_.store(true);
  // Unconditionally: an operation's wait polls the eventfd and sleeps on the bell too.
  const uint64_t one = 1;
  ssize_t written = ::write(wakeFd_, &one, sizeof(one));
  (void)written;
  if (localBell_ != nullptr) {
    localBell_->ring();
  }
}

std::vector<int> Communicator::others() const {
  std::vector<int> peers;
  for (int k = 1; k < size_; ++k) {
    peers.push_back((rank_ + k) % size_);
  }
  return peers;
}

Channel& Communicator::channel(int peer) {
  RINGDIST_CHECK(peer >= 0 && peer < size_ && peer != rank_ && channels_[static_cast<size_t>(peer)],
                 "ringdist ", opName(), ": rank ", rank_, " has no channel to rank ", peer);
  return *channels_[static_cast<size_t>(peer)];
}

void Communicator::beginOp(OpType type, std::chrono::milliseconds timeout,
                           std::chrono::steady_clock::time_point now) {
  if (aborted_) {
    RINGDIST_FAIL("ringdist ", opTypeName(type), ": rank ", rank_,
                  ": the process group was aborted by an earlier error: ", abortReason_);
  }
  RINGDIST_CHECK(!closed_, "ringdist ", opTypeName(type), ": rank ", rank_,
                 ": the process group has been shut down");
  opType_ = type;
  opTimeout_ = timeout;
  deadline_ = now + timeout;
  if (localBell_ != nullptr) {
    localBell_->publishCpu(sched_getcpu());  // fresh for the peers' first waits of this op
  }
}

OpHeader Communicator::makeHeader(OpType type, uint64_t count, DataType dtype, ReduceOp op,
                                  int root, bool publish) {
  OpHeader h{};
  h.magic = kOpMagic;
  h.type = static_cast<uint8_t>(type);
  h.dtype = static_cast<uint8_t>(dtype);
  h.op = static_cast<uint8_t>(op);
  h.seq = type == OpType::kSend ? 0 : ++seq_;
  h.count = count;
  h.root = root;
  // Collectives carry the segment size: ranks cutting buffers differently
  // would read each other's segments at the wrong lengths.
  h.segmentBytes = type == OpType::kSend
      ? 0 : static_cast<uint32_t>(std::min<size_t>(options_.segmentBytes, UINT32_MAX));
  if (publish && board_ != nullptr && type != OpType::kSend) {
    this->publish(h, nullptr, 0);
  }
  return h;
}

namespace {

// A rank's board area (Board::area): written by its owner only.
struct BoardArea {
  alignas(64) std::atomic<uint64_t> published;  // seq of the last collective published, 0 at first
  struct alignas(64) Entry {
    OpHeader header;
    alignas(64) char data[kBoardDataBytes];
  } entry[2];  // by seq parity: a peer may still read the previous one
};
static_assert(sizeof(BoardArea) <= Board::kAreaBytes, "a board area holds two entries");

BoardArea* areaOf(Board& board, int rank) { return reinterpret_cast<BoardArea*>(board.area(rank)); }

}  // namespace

const char* Communicator::publish(const OpHeader& header, const void* data, size_t bytes) {
  RINGDIST_CHECK(bytes <= kBoardDataBytes, "ringdist: ", bytes, " bytes do not fit the board");
  // This entry last held seq - 2, which a peer reads until it starts seq - 1.
  for (int peer = 0; peer < size_ && header.seq > 1; ++peer) {
    if (peer != rank_) waitForPublished(peer, header.seq - 1);
  }
  BoardArea* mine = areaOf(*board_, rank_);
  BoardArea::Entry& entry = mine->entry[header.seq & 1];
  entry.header = header;
  if (bytes > 0) std::memcpy(entry.data, data, bytes);
  mine->published.store(header.seq, std::memory_order_release);
  boardBytesPublished_ += bytes;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) board_->wake(peer);
  }
  return entry.data;
}

const char* Communicator::published(int peer, const OpHeader& mine) {
  waitForPublished(peer, mine.seq);
  // Its entry for our seq: it cannot overwrite it before we publish seq + 1.
  const BoardArea::Entry& entry = areaOf(*board_, peer)->entry[mine.seq & 1];
  checkHeader(mine, entry.header, peer);
  boardBytesRead_ += mine.count * elementSize(static_cast<DataType>(mine.dtype));
  return entry.data;
}

void Communicator::waitForPublished(int peer, uint64_t seq) {
  const BoardArea* area = areaOf(*board_, peer);
  auto ready = [&] { return area->published.load(std::memory_order_acquire) >= seq; };
  if (ready()) return;
  boardWaitsFor_ = peer;  // named if the wait times out
  struct Clear {
    int& peer;
    ~Clear() { peer = -1; }
  } clear{boardWaitsFor_};
  const int cpu = sched_getcpu();
  localBell_->publishCpu(cpu);
  const bool coreShared = channel(peer).peerCpu() == cpu;
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
    channel(peer).checkOpen();  // a peer that aborted closed its links and rang us
    const auto left = std::min<std::chrono::microseconds>(
        std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - Clock::now()), kMaxSleep);
    const BellWait waited = waitOnBell(localBell_, spin, left, ready);
    if (waited == BellWait::kDone) return;
    if (waited == BellWait::kQuiet) channel(peer).checkAlive();
    spin = false;
  }
}

void Communicator::exchangeHeaders(const OpHeader& mine, const std::vector<int>& sendTo,
                                   const std::vector<int>& recvFrom,
                                   const std::vector<uint64_t>* sendCount,
                                   const std::vector<uint64_t>* expectCount) {
  std::vector<OpHeader> out(sendTo.size(), mine);
  std::vector<OpHeader> in(recvFrom.size());
  Transfers sends, recvs;
  for (size_t i = 0; i < sendTo.size(); ++i) {
    if (sendCount != nullptr) {
      out[i].count = (*sendCount)[static_cast<size_t>(sendTo[i])];
    }
    Channel& ch = channel(sendTo[i]);
    sends.emplace_back(&ch, ch.postSend(&out[i], sizeof(OpHeader)));
  }
  for (size_t i = 0; i < recvFrom.size(); ++i) {
    Channel& ch = channel(recvFrom[i]);
    recvs.emplace_back(&ch, ch.postRecv(&in[i], sizeof(OpHeader)));
  }
  waitAll(sends, recvs);
  checkHeaders(mine, recvFrom, in, expectCount);
}

void Communicator::exchangeHeadersAndAddresses(const OpHeader& mine,
                                               const std::vector<int>& peers, const void* lent,
                                               std::vector<uint64_t>* addresses, int with) {
  exchangeHeadersAndAddresses(mine, peers, std::vector<const void*>(static_cast<size_t>(size_), lent),
                              addresses, with);
}

void Communicator::exchangeHeadersAndAddresses(const OpHeader& mine,
                                               const std::vector<int>& peers,
                                               const std::vector<const void*>& lentTo,
                                               std::vector<uint64_t>* addresses, int with) {
  addresses->assign(static_cast<size_t>(size_), 0);
  std::vector<uint64_t> outgoing(peers.size());
  std::vector<OpHeader> in(peers.size());
  Transfers sends, headers, trailers;
  for (size_t i = 0; i < peers.size(); ++i) {
    Channel& ch = channel(peers[i]);
    sends.emplace_back(&ch, ch.postSend(&mine, sizeof(OpHeader)));
    headers.emplace_back(&ch, ch.postRecv(&in[i], sizeof(OpHeader)));
    if (with < 0 || with == peers[i]) {
      outgoing[i] = reinterpret_cast<uint64_t>(lentTo[static_cast<size_t>(peers[i])]);
      sends.emplace_back(&ch, ch.postSend(&outgoing[i], sizeof(outgoing[i])));
      auto* at = &(*addresses)[static_cast<size_t>(peers[i])];
      trailers.emplace_back(&ch, ch.postRecv(at, sizeof(*at)));
    }
  }
  // The headers first: a peer in another operation sends no address.
  waitAll({}, headers);
  checkHeaders(mine, peers, in, nullptr);
  waitAll(sends, trailers);
}

void Communicator::checkHeaders(const OpHeader& mine, const std::vector<int>& recvFrom,
                                const std::vector<OpHeader>& in,
                                const std::vector<uint64_t>* expectCount) {
  for (size_t i = 0; i < recvFrom.size(); ++i) {
    const int peer = recvFrom[i];
    OpHeader expected = mine;
    if (expectCount != nullptr) {
      expected.count = (*expectCount)[static_cast<size_t>(peer)];
    }
    checkHeader(expected, in[i], peer);
  }
}

template <typename Copy>
void Communicator::copyInPieces(size_t bytes, Copy copy) {
  for (size_t done = 0; done < bytes;) {
    throwIfStopped();
    const size_t piece = std::min(bytes - done, kSingleCopyPieceBytes);
    copy(done, piece);
    done += piece;
    progress();  // keep the other links moving between pieces
  }
  singleCopyBytes_ += bytes;
}

void Communicator::readPeer(int peer, uint64_t from, void* dst, size_t bytes) {
  Channel& ch = channel(peer);
  copyInPieces(bytes, [&](size_t done, size_t piece) {
    ch.readPeerMemory(from + done, static_cast<char*>(dst) + done, piece);
  });
}

void Communicator::writePeer(int peer, uint64_t to, const void* src, size_t bytes) {
  Channel& ch = channel(peer);
  copyInPieces(bytes, [&](size_t done, size_t piece) {
    ch.writePeerMemory(to + done, static_cast<const char*>(src) + done, piece);
  });
}

void Communicator::exchangeDone(const std::vector<int>& to, const std::vector<int>& from) {
  static const uint8_t kDone = 1;
  std::vector<uint8_t> got(from.size());
  Transfers sends, recvs;
  for (int peer : to) {
    sends.emplace_back(&channel(peer), channel(peer).postSend(&kDone, 1));
  }
  for (size_t i = 0; i < from.size(); ++i) {
    recvs.emplace_back(&channel(from[i]), channel(from[i]).postRecv(&got[i], 1));
  }
  waitAll(sends, recvs);
}

void Communicator::checkHeader(const OpHeader& expected, const OpHeader& theirs, int peer) {
  RINGDIST_CHECK(theirs.magic == kOpMagic, "ringdist ", opName(), ": rank ", rank_,
                 " received a corrupt operation header from rank ", peer,
                 " (the ranks are out of step)");
  bool same = theirs.type == expected.type && theirs.dtype == expected.dtype &&
      theirs.op == expected.op && theirs.seq == expected.seq && theirs.count == expected.count &&
      theirs.root == expected.root && theirs.segmentBytes == expected.segmentBytes &&
      theirs.tag == expected.tag && theirs.variant == expected.variant &&
      theirs.padding == expected.padding;
  if (same) {
    return;
  }
  if (theirs.type == expected.type && theirs.seq == expected.seq &&
      static_cast<OpType>(expected.type) == OpType::kAlltoall && theirs.count != expected.count) {
    RINGDIST_FAIL("ringdist ", opName(), ": rank ", rank_, " expects ", expected.count,
                  " elements from rank ", peer, " but rank ", peer, " sends ", theirs.count);
  }
  RINGDIST_FAIL("ringdist ", opName(), ": ranks disagree: rank ", rank_, " called ",
                describeHeader(expected), " but rank ", peer, " called ", describeHeader(theirs));
}

void Communicator::exchangeRingHeaders(const OpHeader& mine) {
  if (size_ == 1) {
    return;
  }
  exchangeHeaders(mine, {left(), right()}, {left(), right()});
}

bool Communicator::progress() {
  bool moved = false;
  for (auto& ch : channels_) {
    if (ch && ch->hasPending()) {
      moved = ch->progress() || moved;
    }
  }
  return moved;
}

bool Communicator::hasPending() const {
  for (const auto& ch : channels_) {
    if (ch && ch->hasPending()) {
      return true;
    }
  }
  return false;
}

std::string Communicator::pendingPeers() const {
  std::string peers;
  for (const auto& ch : channels_) {
    if (ch && (ch->hasPending() || ch->peer() == boardWaitsFor_)) {
      peers += strCat(peers.empty() ? "" : ", ", ch->peer());
    }
  }
  return peers.empty() ? "none" : peers;
}

template <typename Done>
Communicator::BellWait Communicator::waitOnBell(Doorbell* bell, bool spin,
                                                std::chrono::microseconds left, const Done& done) {
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

void Communicator::sleepOnDoorbell(Doorbell* bell, bool coreShared,
                                   std::chrono::milliseconds left, const uint64_t* wakesSeen) {
  const BellWait waited =
      waitOnBell(bell, spin_ && !coreShared, std::min<std::chrono::milliseconds>(left, kMaxSleep),
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

void Communicator::throwIfStopped() {
  if (abortRequested_.load(std::memory_order_relaxed)) {
    RINGDIST_FAIL("ringdist ", opName(), ": rank ", rank_, ": the process group was aborted");
  }
  if (Clock::now() >= deadline_) {
    throw TimeoutError(strCat("ringdist ", opName(), ": rank ", rank_, ": Timed out after ",
                              opTimeout_.count(), " ms waiting for rank(s) ", pendingPeers()));
  }
}

void Communicator::waitForActivity(std::chrono::microseconds maxSleep,
                                   const uint64_t* wakesSeen) {
  throwIfStopped();
  std::vector<pollfd> fds;
  std::vector<Channel*> owners;  // nullptr: the wake fd
  Doorbell* bell = nullptr;
  int cpu = -1;             // this thread's, once a shared-memory link is pending
  bool coreShared = false;  // a peer we wait for last waited on that CPU
  for (size_t p = 0; p < channels_.size(); ++p) {
    Channel* ch = channels_[p].get();
    if (ch == nullptr) continue;
    const bool watched = watched_[p] && !ch->receiving();
    if (ch->pollFd() >= 0) {
      fds.push_back(pollfd{ch->pollFd(), static_cast<short>(ch->pollEvents() | (watched ? POLLIN : 0)), 0});
      owners.push_back(ch);
    } else if (watched && ch->incomingFd() >= 0) {
      fds.push_back(pollfd{ch->incomingFd(), POLLIN | POLLRDHUP, 0});
      owners.push_back(ch);
    } else if ((ch->hasPending() || watched) && ch->doorbell() != nullptr) {
      bell = ch->doorbell();
      if (cpu < 0) {
        cpu = sched_getcpu();
      }
      coreShared = coreShared || ch->peerCpu() == cpu;
    }
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  if (left.count() <= 0) {
    return;  // the caller's next wait throws
  }
  const auto cap = std::min<std::chrono::microseconds>(maxSleep, left);
  if (wokenSince(wakesSeen)) {
    return;
  }
  if (bell != nullptr && fds.empty()) {
    bell->publishCpu(cpu);
    sharedCoreWaits_ += spin_ && coreShared ? 1 : 0;
    sleepOnDoorbell(bell, coreShared,
                    std::max<std::chrono::milliseconds>(
                        std::chrono::milliseconds(1),
                        std::chrono::duration_cast<std::chrono::milliseconds>(cap)),
                    wakesSeen);
    return;
  }
  if (!fds.empty()) {  // wake() while idle, or requestAbort()
    fds.push_back(pollfd{wakeFd_, POLLIN, 0});
    owners.push_back(nullptr);
  }
  if (fds.empty()) {
    if (maxSleep < kUncappedSleep) {
      std::this_thread::sleep_for(cap);  // the caller polls a condition with no fd
    }
    return;  // nothing pending: the caller's condition decides
  }
  // With shared-memory links pending too, poll the sockets in short slices
  // so the shared-memory side is looked at again soon.
  const auto slice = bell != nullptr ? std::min<std::chrono::microseconds>(
                                           cap, std::chrono::milliseconds(1))
                                     : cap;
  timespec ts{static_cast<time_t>(slice.count() / 1000000),
              static_cast<long>(slice.count() % 1000000) * 1000};
  int ready = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  if (ready <= 0) {
    return;
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (owners[i] == nullptr) {
      if ((fds[i].revents & POLLIN) != 0) {
        uint64_t count = 0;
        ssize_t got = ::read(wakeFd_, &count, sizeof(count));  // reset the eventfd
        (void)got;
      }
      continue;
    }
    // A peer that hung up while we only have sends queued for it: the sends
    // can never be consumed. (With receives queued, progress() reads what is
    // left and then reports the close itself.)
    if ((fds[i].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0 && !(fds[i].revents & POLLIN)) {
      if (!owners[i]->progress()) {
        RINGDIST_FAIL("connection to rank ", owners[i]->peer(), " closed by the peer");
      }
    }
  }
}

void Communicator::waitUntil(const std::function<bool()>& done,
                             std::chrono::microseconds maxSleep) {
  for (;;) {
    bool moved = progress();
    if (done()) {
      return;
    }
    if (!moved) {
      waitForActivity(maxSleep);
    }
  }
}

void Communicator::waitAll(const Transfers& sends, const Transfers& recvs) {
  waitUntil([&] {
    for (const auto& s : sends) {
      if (!s.first->sendDone(s.second)) return false;
    }
    for (const auto& r : recvs) {
      if (!r.first->recvDone(r.second)) return false;
    }
    return true;
  });
}

void Communicator::progressIdle(std::chrono::milliseconds maxWait, uint64_t wakesSeen) {
  if (aborted_ || (!hasPending() && !watchingAny())) {
    return;
  }
  deadline_ = Clock::now() + maxWait;
  opTimeout_ = maxWait;
  if (!progress()) {
    idleWaiting_.store(true);
    try {
      waitForActivity(kUncappedSleep, &wakesSeen);
    } catch (const TimeoutError&) {
      // idle polling has no deadline of its own
    }
    idleWaiting_.store(false);
    progress();
  }
}

uint64_t Communicator::bytesSent() const {
  uint64_t total = boardBytesPublished_;
  for (const auto& ch : channels_) {
    total += ch ? ch->bytesSent() : 0;
  }
  return total;
}

uint64_t Communicator::bytesReceived() const {
  uint64_t total = boardBytesRead_;
  for (const auto& ch : channels_) {
    total += ch ? ch->bytesReceived() : 0;
  }
  return total;
}

char* Communicator::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    std::free(scratch_);
    scratch_ = nullptr;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = nullptr;
    RINGDIST_CHECK(::posix_memalign(&p, 64, rounded) == 0, "ringdist ", opName(), ": rank ",
                   rank_, ": cannot allocate ", rounded, " bytes of scratch");
    scratch_ = static_cast<char*>(p);
    scratchBytes_ = rounded;
  }
  return scratch_;
}

std::string Communicator::describeError(const std::string& what) {
  std::string text = what;
  const std::string prefix = "ringdist ";
  if (text.compare(0, prefix.size(), prefix) != 0) {
    text = strCat("ringdist ", opName(), ": rank ", rank_, ": ", what);
  }
  // A peer that died without a word (killed) is the likely root cause when
  // what failed here is a live peer's closed link.
  for (int r : deadPeers()) {
    if (text.find(strCat("rank ", r, " ")) == std::string::npos) {
      text += strCat(" [rank ", r, " (same host) is dead]");
    }
  }
  // A peer that aborted first may have published why; name the root cause.
  try {
    if (rendezvous_ && rendezvous_->check("ringdist/abort")) {
      auto reason = rendezvous_->get("ringdist/abort", std::chrono::milliseconds(1000));
      std::string remote(reason.begin(), reason.end());
      if (!remote.empty() && text.find(remote) == std::string::npos) {
        text += strCat(" [first error in the group: ", remote, "]");
      }
    }
  } catch (const std::exception&) {
    // The store may be gone too; the local error stands on its own.
  }
  return text;
}

void Communicator::abort(const std::string& reason) {
  if (aborted_) {
    return;
  }
  aborted_ = true;
  abortReason_ = reason;
  try {
    if (rendezvous_ && !rendezvous_->check("ringdist/abort")) {
      rendezvous_->set("ringdist/abort", std::vector<uint8_t>(reason.begin(), reason.end()));
    }
  } catch (const std::exception&) {
  }
  // Closing every connection makes each peer's pending operation fail at
  // once (EOF), which cascades the error to the whole group.
  for (auto& ch : channels_) {
    if (ch) {
      ch->close();
    }
  }
}

std::vector<int> Communicator::deadPeers() const {
  std::vector<int> dead;
  for (int r = 0; r < size_; ++r) {
    if (channels_[r] && channels_[r]->peerDead()) dead.push_back(r);
  }
  return dead;
}

void Communicator::close(std::chrono::milliseconds maxWait) {
  if (closed_) {
    return;
  }
  closed_ = true;
  if (!aborted_ && size_ > 1 && rendezvous_) {
    try {
      const auto deadline = Clock::now() + maxWait;
      // Every rank closing: nobody needs our last bytes any more.
      rendezvous_->add("ringdist/closing", 1);
      awaitCount("ringdist/closing", deadline, /*watchPeers=*/true);
      // Rank 0 leaves last. In a plain env:// launch its process hosts the store: a peer
      // still polling it after it exited would fail (and TCPStore logs a stack trace). Peers
      // that are done close their links now, so this wait does not watch them.
      rendezvous_->add("ringdist/closed", 1);
      if (rank_ == 0) {
        awaitCount("ringdist/closed", deadline, /*watchPeers=*/false);
      }
    } catch (const std::exception& e) {
      logDebug(strCat("rank ", rank_, ": teardown barrier skipped: ", e.what()));
    }
  }
  for (auto& ch : channels_) {
    if (ch) {
      ch->close();
    }
  }
}

void Communicator::awaitCount(const std::string& key, Clock::time_point deadline,
                              bool watchPeers) {
  auto sleep = std::chrono::milliseconds(1);
  while (rendezvous_->add(key, 0) < size_ && Clock::now() < deadline) {
    if (watchPeers) {
      try {
        // Keep moving queued sends: a peer may still need our last bytes.
        progress();
        // A peer that closed its links (it aborted) or died will not count itself in.
        for (auto& ch : channels_) {
          if (ch) {
            ch->checkOpen();
            ch->checkAlive();
          }
        }
      } catch (const std::exception&) {
        // Or it closed them because the count was complete: then this wait is over too.
        if (rendezvous_->add(key, 0) >= size_) {
          return;
        }
        throw;
      }
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace ringdist
