#include "csrc/collectives/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"

namespace ringdist {

namespace {
using Clock = std::chrono::steady_clock;

// Runs ask(rendezvous) on a thread of its own and waits for its answer up to `limit`; nullopt
// if it did not come. On the error paths the store may be out of reach too (a host cut off from
// the network), and a store call then blocks on its socket for as long as TCP keeps trying. A
// call that does not return in time is left to its thread, which holds its own references, so
// `ask` must capture by value.
std::optional<std::string> askStoreWithin(const std::shared_ptr<Rendezvous>& rendezvous,
                                          std::chrono::milliseconds limit,
                                          std::function<std::string(Rendezvous&)> ask) {
  struct Answer {
    std::mutex mutex;
    std::condition_variable ready;
    std::optional<std::string> text;
  };
  auto answer = std::make_shared<Answer>();
  std::thread([rendezvous, answer, ask = std::move(ask)] {
    std::string text;
    try {
      text = ask(*rendezvous);
    } catch (const std::exception&) {
      // The store may be gone too; the caller goes on without it.
    }
    std::lock_guard<std::mutex> lock(answer->mutex);
    answer->text = std::move(text);
    answer->ready.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(answer->mutex);
  answer->ready.wait_for(lock, limit, [&] { return answer->text.has_value(); });
  return answer->text;
}

// The ranks' channels followed by the lanes: every loop over the links (progress, waits,
// aborts, statistics) covers both.
std::vector<std::unique_ptr<Channel>> withLanes(std::vector<std::unique_ptr<Channel>> channels,
                                                std::vector<std::unique_ptr<Channel>> lanes) {
  for (auto& lane : lanes) channels.push_back(std::move(lane));
  return channels;
}
}  // namespace

Communicator::Communicator(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
                           std::vector<int> ring, std::vector<int> hostOf,
                           std::shared_ptr<Rendezvous> rendezvous,
                           const CollectiveOptions& options, std::shared_ptr<Board> board,
                           std::vector<std::unique_ptr<Channel>> lanes)
    : rank_(rank), size_(size), channels_(withLanes(std::move(channels), std::move(lanes))),
      lanesOf_(static_cast<size_t>(size)), rendezvous_(std::move(rendezvous)),
      ring_{std::move(ring)}, hostOf_(std::move(hostOf)), options_(options), waiter_(channels_),
      board_(*this, waiter_, std::move(board)), singleCopy_(*this, channels_) {
  RINGDIST_CHECK(ring_.size() == size_, "ringdist: ring order has ", ring_.size(),
                 " ranks, expected ", size_);
  const auto& order = ring_.members;
  ring_.pos = static_cast<int>(std::find(order.begin(), order.end(), rank_) - order.begin());
  RINGDIST_CHECK(static_cast<int>(hostOf_.size()) == size_, "ringdist: host map has ",
                 hostOf_.size(), " ranks, expected ", size_);
  for (size_t i = static_cast<size_t>(size_); i < channels_.size(); ++i) {
    lanesOf_[static_cast<size_t>(channels_[i]->peer())].push_back(channels_[i].get());
  }
  setUpHierarchy();
}

void Communicator::setOptions(const CollectiveOptions& options) {
  RINGDIST_CHECK(options.segmentBytes > 0, "ringdist: segment size must be positive");
  options_ = options;
  setUpHierarchy();
}

Route Communicator::route(ModelledOp op, size_t bytes) const {
  return hostCount_ == size_ ? routeAmongHosts(op, size_, bytes) : Route::kRing;
}

Route Communicator::routeAmongHosts(ModelledOp op, int n, size_t bytes) const {
  Route forced = Route::kRing;
  switch (options_.route) {
    case RouteMode::kAuto: return routeModel().best(op, n, bytes);
    case RouteMode::kDirect: forced = Route::kDirect; break;
    case RouteMode::kHalvingDoubling: forced = Route::kHalvingDoubling; break;
    case RouteMode::kPair: forced = Route::kPair; break;
    default: break;
  }
  return RouteModel::allowed(forced, op, n) ? forced : Route::kRing;
}

SubRing Communicator::everyRank() const {
  SubRing all;
  for (int r = 0; r < size_; ++r) all.members.push_back(r);
  all.pos = rank_;
  return all;
}

void Communicator::sampleRate(Route route, ModelledOp op, size_t bytes, double us) {
  const double rate = routeModel().rateFromSample(route, op, size_, bytes, us);
  if (std::isfinite(rate)) bestRateSample_ = std::max(bestRateSample_, rate);
}

double Communicator::takeRateSample() {
  const double best = bestRateSample_ > 0 ? bestRateSample_ : std::numeric_limits<double>::infinity();
  bestRateSample_ = 0;
  return best;
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

Communicator::~Communicator() { std::free(scratch_); }

void Communicator::requestAbort(bool keepLinks) {
  if (keepLinks) keepLinks_.store(true);
  abortRequested_.store(true);
  waiter_.interrupt();
}

std::vector<std::unique_ptr<Channel>> Communicator::releaseLinks(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(linksMutex_);
  std::vector<std::unique_ptr<Channel>> kept(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto& link = channels_[static_cast<size_t>(ranks[i])];
    if (ranks[i] != rank_ && link && link->keepable()) kept[i] = std::move(link);
  }
  for (auto& ch : channels_) {
    if (ch) ch->close();
  }
  return kept;
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

Channel& Communicator::lane(int peer, int k) {
  return k == 0 ? channel(peer) : *lanesOf_[static_cast<size_t>(peer)][static_cast<size_t>(k - 1)];
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
  waiter_.publishCpu();
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
  if (publish && board_.exists() && type != OpType::kSend) {
    board_.publish(h, nullptr, 0);
  }
  return h;
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

void Communicator::exchangeWithAll(const OpHeader* mine, const std::function<Span(int)>& sendTo,
                                   const std::function<Landing(int)>& recvFrom,
                                   const SubRing* among) {
  const int n = among != nullptr ? among->size() : size_;
  const int pos = among != nullptr ? among->pos : rank_;
  auto rankAt = [&](int p) { return among != nullptr ? among->members[static_cast<size_t>(p)] : p; };
  std::vector<OpHeader> theirs(mine != nullptr ? static_cast<size_t>(n) : 0);  // by position
  Transfers sends, recvs;
  for (int k = 1; k < n; ++k) {  // each rank starts with a different peer
    const int to = rankAt((pos + k) % n);
    const int fromPos = (pos - k + n) % n;
    const int from = rankAt(fromPos);
    Channel& out = channel(to);
    if (mine != nullptr) out.postSend(mine, sizeof(OpHeader));
    const Span span = sendTo(to);
    sends.emplace_back(&out, out.postSend(span.first, span.second));
    Channel& in = channel(from);
    if (mine != nullptr) in.postRecv(&theirs[static_cast<size_t>(fromPos)], sizeof(OpHeader));
    const Landing landing = recvFrom(from);
    recvs.emplace_back(&in, in.postRecv(landing.first, landing.second));
  }
  waitAll(sends, recvs);
  for (int p = 0; mine != nullptr && p < n; ++p) {
    if (p != pos) checkHeader(*mine, theirs[static_cast<size_t>(p)], rankAt(p));
  }
}

void Communicator::exchangeRingHeaders(const OpHeader& mine) {
  if (size_ == 1) {
    return;
  }
  exchangeHeaders(mine, {left(), right()}, {left(), right()});
}

std::string Communicator::pendingPeers() const {
  std::string peers;
  for (int peer = 0; peer < size_; ++peer) {
    const Channel* main = channels_[static_cast<size_t>(peer)].get();
    bool pending = peer == board_.waitsFor() || (main && main->hasPending());
    for (const Channel* lane : lanesOf_[static_cast<size_t>(peer)]) pending = pending || lane->hasPending();
    if (pending) peers += strCat(peers.empty() ? "" : ", ", peer);
  }
  return peers.empty() ? "none" : peers;
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
  waiter_.waitForActivity(deadline_, maxSleep, wakesSeen);
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
    try {
      throwIfStopped();
      waiter_.waitIdle(deadline_, wakesSeen);
    } catch (const TimeoutError&) {
      // idle polling has no deadline of its own
    }
    progress();
  }
}

uint64_t Communicator::bytesSent() const {
  uint64_t total = board_.bytesPublished();
  for (const auto& ch : channels_) {
    total += ch ? ch->bytesSent() : 0;
  }
  return total;
}

uint64_t Communicator::bytesSentAcrossHosts() const {
  uint64_t total = 0;
  for (const auto& ch : channels_) {
    if (ch && hostOf_[static_cast<size_t>(ch->peer())] != hostOf_[static_cast<size_t>(rank_)]) {
      total += ch->bytesSent();
    }
  }
  return total;
}

uint64_t Communicator::bytesReceived() const {
  uint64_t total = board_.bytesRead();
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
  return text;
}

std::string Communicator::abort(const std::string& reason) {
  if (aborted_) {
    return abortReason_;
  }
  aborted_ = true;
  abortReason_ = reason;
  if (keepLinks_.load()) {
    return abortReason_;  // a shrink: the survivors agreed on it, and it takes the links
  }
  // One round trip publishes this reason, unless a peer's came first: that one is the root
  // cause to name. Before the links close, so the first rank to fail is the first to publish
  // (the peers it fails are still blocked).
  const std::string first = askStore([reason](Rendezvous& store) {
    const auto stored = store.setFirst("ringdist/abort",
                                       std::vector<uint8_t>(reason.begin(), reason.end()));
    return std::string(stored.begin(), stored.end());
  }).value_or("");
  if (!first.empty() && reason.find(first) == std::string::npos) {
    abortReason_ += strCat(" [first error in the group: ", first, "]");
  }
  // Closing every connection makes each peer's pending operation fail at once
  // (EOF), which cascades the error to the whole group; with keepLinksOnError the ranks
  // learn of it another way, and a shrink keeps the sealed links (an explicit abort, not an
  // error, still closes them).
  const bool keep = keepLinksOnError_.load() && !abortRequested_.load();
  for (size_t i = 0; i < channels_.size(); ++i) {
    auto& ch = channels_[i];
    if (ch && !(keep && i < static_cast<size_t>(size_) && ch->keepable())) {
      ch->close();
    }
  }
  return abortReason_;
}

std::optional<std::string> Communicator::askStore(std::function<std::string(Rendezvous&)> ask,
                                                  std::chrono::milliseconds limit) {
  if (!rendezvous_ || storeSilent_) return std::nullopt;
  auto answer = askStoreWithin(rendezvous_, limit, std::move(ask));
  if (!answer) {
    storeSilent_ = true;  // the next error path or teardown does not wait for it again
    logDebug(strCat("rank ", rank_, ": the store did not answer within ", limit.count(),
                    " ms; going on without it"));
  }
  return answer;
}

std::vector<int> Communicator::deadPeers() const {
  std::lock_guard<std::mutex> lock(linksMutex_);
  std::vector<int> dead;
  for (int r = 0; r < size_; ++r) {
    if (channels_[r] && channels_[r]->peerDead()) dead.push_back(r);
  }
  return dead;
}

std::vector<Channel::SendTotals> Communicator::sendTotals() const {
  std::lock_guard<std::mutex> lock(linksMutex_);
  std::vector<Channel::SendTotals> totals(static_cast<size_t>(size_));  // lanes after size_
  for (size_t r = 0; r < totals.size(); ++r) {
    if (!channels_[r]) continue;
    totals[r] = channels_[r]->sendTotals();
    for (const Channel* link : lanesOf_[r]) {  // the lanes run beside it: busy in parallel
      const auto lane = link->sendTotals();
      totals[r].bytesAcked += lane.bytesAcked;
      totals[r].busyUs = std::max(totals[r].busyUs, lane.busyUs);
      totals[r].unacknowledged += lane.unacknowledged;
    }
  }
  return totals;
}

std::vector<int64_t> Communicator::quietMs() const {
  std::lock_guard<std::mutex> lock(linksMutex_);
  std::vector<int64_t> quiet(static_cast<size_t>(size_), -1);
  for (size_t r = 0; r < quiet.size(); ++r) {
    if (!channels_[r]) continue;
    quiet[r] = channels_[r]->quietMs();
    for (const Channel* lane : lanesOf_[r]) {  // data on any lane is a sign of life
      const int64_t ms = lane->quietMs();
      if (ms >= 0 && quiet[r] >= 0) quiet[r] = std::min(quiet[r], ms);
    }
  }
  return quiet;
}

int Communicator::capSendRate(uint64_t bytesPerSecond) {
  std::lock_guard<std::mutex> lock(linksMutex_);
  int capped = 0;
  for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
    if (!channels_[r]) continue;
    capped += channels_[r]->capSendRate(bytesPerSecond);
    for (Channel* lane : lanesOf_[r]) capped += lane->capSendRate(bytesPerSecond);
  }
  return capped;
}

int64_t Communicator::addBy(const std::string& key, int64_t delta, Clock::time_point deadline) {
  // At least kStoreOnErrorMs for the one add each rank makes at a zero-wait close.
  const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                             kStoreOnErrorMs);
  const auto answer = askStore([key, delta](Rendezvous& store) {
    return std::to_string(store.add(key, delta));
  }, left);
  if (!answer || answer->empty()) {
    storeSilent_ = true;
    RINGDIST_FAIL("the store gave no answer within ", left.count(), " ms");
  }
  return std::stoll(*answer);
}

void Communicator::close(std::chrono::milliseconds maxWait) {
  if (closed_) {
    return;
  }
  closed_ = true;
  // Without a wait the marks would still cost three store round trips (0.3 s at RTT 100 ms)
  // that nobody reads.
  if (!aborted_ && size_ > 1 && rendezvous_ && maxWait.count() > 0) {
    try {
      const auto deadline = Clock::now() + maxWait;
      // Every rank closing: nobody needs our last bytes any more.
      addBy("ringdist/closing", 1, deadline);
      awaitCount("ringdist/closing", deadline, /*watchPeers=*/true);
      // Rank 0 leaves last. In a plain env:// launch its process hosts the store: a peer
      // still polling it after it exited would fail (and TCPStore logs a stack trace). Peers
      // that are done close their links now, so this wait does not watch them.
      addBy("ringdist/closed", 1, deadline);
      if (rank_ == 0) {
        awaitCount("ringdist/closed", deadline, /*watchPeers=*/false);
      }
    } catch (const std::exception& e) {
      logDebug(strCat("rank ", rank_, ": teardown barrier skipped: ", e.what()));
    }
  }
  if (keepLinks_.load()) {
    return;  // releaseLinks closes those a shrink does not keep
  }
  for (auto& ch : channels_) {
    if (ch) {
      ch->close();
    }
  }
}

int Communicator::peerInNextOp(std::string* op) {
  for (int peer = 0; peer < size_; ++peer) {
    Channel* ch = channels_[peer].get();
    if (peer == rank_ || ch == nullptr) continue;
    // Every collective publishes its header on the board before it sends anything.
    const OpHeader published = board_.exists() ? board_.lastPublished(peer) : OpHeader{};
    OpHeader header{};
    uint8_t byte = 0;
    if (published.seq > seq_) {
      header = published;
    } else if (!ch->peek(&header, sizeof header) && !ch->peek(&byte, 1)) {
      continue;  // nothing from this peer that an operation of ours did not take
    }
    *op = header.magic == kOpMagic ? strCat("its ", opTypeName(static_cast<OpType>(header.type)))
                                   : std::string("an operation");
    return peer;
  }
  return -1;
}

void Communicator::awaitCount(const std::string& key, Clock::time_point deadline,
                              bool watchPeers) {
  auto sleep = std::chrono::milliseconds(1);
  while (addBy(key, 0, deadline) < size_ && Clock::now() < deadline) {
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
        // A peer waiting in an operation with us would wait until its deadline: fail it now.
        std::string op;
        const int ahead = peerInNextOp(&op);
        if (ahead >= 0) {
          logWarning(strCat("rank ", rank_, ": leaving while rank ", ahead, " waits in ", op,
                            ", which this rank never called: its links are closed so that "
                            "the call fails now"));
          RINGDIST_FAIL("rank ", ahead, " is in ", op, ", which this rank never called");
        }
      } catch (const std::exception&) {
        // Or it closed them because the count was complete: then this wait is over too.
        if (addBy(key, 0, deadline) >= size_) {
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
