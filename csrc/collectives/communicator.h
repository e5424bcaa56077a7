#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/collectives/board.h"
#include "csrc/collectives/op_header.h"
#include "csrc/collectives/route_model.h"
#include "csrc/collectives/single_copy.h"
#include "csrc/collectives/waiter.h"
#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/common/types.h"
#include "csrc/transport/board.h"
#include "csrc/transport/channel.h"

namespace ringdist {

// Receives in flight per channel in the ring pipelines (>= 2 so receiving
// segment i+1 overlaps reducing segment i).
constexpr size_t kRecvWindow = 4;

// Ranks arranged in a ring (members by position; we sit at pos): all of a
// group, or part of it for the two-level allreduce.
struct SubRing {
  std::vector<int> members;
  int pos = 0;
  int size() const { return static_cast<int>(members.size()); }
  int left() const { return members[static_cast<size_t>((pos + size() - 1) % size())]; }
  int right() const { return members[static_cast<size_t>((pos + 1) % size())]; }
};

// One process group's view of its peers: channels, ring order, the
// operation's lifecycle (headers, deadline, abort, teardown). It composes the
// wait policy (Waiter), the board's protocol (BoardProtocol) and single copy
// (SingleCopy), and forwards what the collectives call of them.
// Single-threaded: only the backend's worker thread calls into it, except
// where a method says "any thread".
class Communicator {
 public:
  // ring: ranks in ring order (a permutation of 0..size-1), the ranks of
  // each host consecutive; hostOf: host index of each rank.
  // board: every rank on this host over shared memory (Mesh::board), else null.
  // lanes: more TCP connections to peers on other hosts (Mesh::lanes), each knowing its peer.
  Communicator(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
               std::vector<int> ring, std::vector<int> hostOf,
               std::shared_ptr<Rendezvous> rendezvous, const CollectiveOptions& options,
               std::shared_ptr<Board> board = nullptr,
               std::vector<std::unique_ptr<Channel>> lanes = {});
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  Channel& channel(int peer);
  // The connections to `peer`: channel(peer) is lane 0; peers on other hosts over long links
  // have more (TcpOptions::lanes), which the pair exchange sends its buffer's parts on.
  int laneCount(int peer) const { return 1 + static_cast<int>(lanesOf_[static_cast<size_t>(peer)].size()); }
  Channel& lane(int peer, int k);
  // Every other rank, starting with the one after us (so that when all ranks
  // post to all peers, not every rank hits rank 0 first).
  std::vector<int> others() const;

  // Ring order: ring()[pos] is the rank at position pos; left sends to us.
  const SubRing& ring() const { return ring_; }
  int ringPos() const { return ring_.pos; }
  int ringRank(int pos) const {
    return ring_.members[static_cast<size_t>(((pos % size_) + size_) % size_)];
  }
  int left() const { return ring_.left(); }
  int right() const { return ring_.right(); }

  // Two-level rings, set when there are >= 2 hosts, each with the same number
  // (>= 2) of ranks, and options().hierarchical: the ranks of our host, and
  // one rank per host (ours and those at our position elsewhere).
  bool hierarchical() const { return hierarchical_; }
  // Number of distinct hosts in the group (1: every peer shares our machine).
  int hostCount() const { return hostCount_; }
  const SubRing& hostRing() const { return hostRing_; }
  const SubRing& crossRing() const { return crossRing_; }

  // The settings collectives follow (segment size, latency-path threshold,
  // result checks...). setOptions is for the worker, between operations.
  const CollectiveOptions& options() const { return options_; }
  void setOptions(const CollectiveOptions& options);
  size_t segmentBytes() const { return options_.segmentBytes; }
  // The group's longest link round trip, measured at connect (Mesh::roundTripUs,
  // the same on every rank; 0: not measured), microseconds: the rings size the
  // data they keep in flight by it (ringInFlightBytes in ring.h).
  uint32_t linkRoundTripUs() const { return linkRoundTripUs_; }
  void setLinkRoundTrip(uint32_t roundTripUs) { linkRoundTripUs_ = roundTripUs; }
  // This rank's longest link round trip now (each TCP link's windowed minimum, which follows a
  // round trip that grows within net.ipv4.tcp_min_rtt_wlen), for the group to agree on again;
  // or the round trip this rank reports instead (testing; 0: measured).
  uint32_t localRoundTripUs() const { return longestRoundTripUs(channels_, reportedRoundTripUs_); }
  void setReportedRoundTrip(uint32_t roundTripUs) { reportedRoundTripUs_ = roundTripUs; }
  // The model the collectives pick their route by across hosts, from that round trip and the
  // agreed link rate (route_model.h).
  RouteModel routeModel() const {
    return linkBitsPerSecond_ > 0 ? RouteModel::forLink(linkRoundTripUs_, linkBitsPerSecond_)
                                  : RouteModel::forRoundTrip(linkRoundTripUs_);
  }
  // The group's link rate, bits/s, agreed from measured allreduces (0: none agreed yet).
  double linkBitsPerSecond() const { return linkBitsPerSecond_; }
  // Whether an allreduce of `bytes` gives a rate sample: the model serves this group (one rank
  // per host, 2 or more) and bytes >= kRateSampleBytes. The same answer on every rank.
  bool samplesRate(size_t bytes) const {
    return hostCount_ == size_ && size_ >= 2 && bytes >= kRateSampleBytes;
  }
  // Counts a sampled allreduce; true before every kRateAgreeEvery-th.
  bool rateAgreementDue() { return ++sampledCalls_ % kRateAgreeEvery == 0; }
  // Keeps the best (fastest) rate sample since the last agreement: `route` took `us`.
  void sampleRate(Route route, ModelledOp op, size_t bytes, double us);
  // This rank's best sample since the last agreement (+inf: none), and forgets it.
  double takeRateSample();
  void setLinkBitsPerSecond(double bitsPerSecond) { linkBitsPerSecond_ = bitsPerSecond; }
  // The route `op` of `bytes` (route_model.h) takes: with one rank per host, the model's (or
  // the setting's, RINGDIST_ROUTE, where allowed); else the ring. The same answer on every
  // rank: the model's inputs are agreed, the setting must be.
  Route route(ModelledOp op, size_t bytes) const;
  // The same for `op` among n ranks on n different hosts (a two-level allreduce's cross ring).
  Route routeAmongHosts(ModelledOp op, int n, size_t bytes) const;

  // Starts an operation: names it in errors and arms its deadline.
  // `now`: the caller's clock reading, when it has one (one read per op).
  void beginOp(OpType type, std::chrono::milliseconds timeout,
               std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  const char* opName() const { return opTypeName(opType_); }
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

  // The operation's header; a collective's is published on the board (if
  // any) unless `publish` is false, so that ranks taking the board for a
  // small operation see what every peer called (publish()).
  OpHeader makeHeader(OpType type, uint64_t count, DataType dtype, ReduceOp op, int root,
                      bool publish = true);
  // Sends `mine` to each of sendTo and checks the header from each of
  // recvFrom. sendCount/expectCount (indexed by rank) override `count` per
  // peer for operations with per-peer sizes.
  void exchangeHeaders(const OpHeader& mine, const std::vector<int>& sendTo,
                       const std::vector<int>& recvFrom,
                       const std::vector<uint64_t>* sendCount = nullptr,
                       const std::vector<uint64_t>* expectCount = nullptr);
  void exchangeRingHeaders(const OpHeader& mine);
  // One round with every peer at once (the one-round and direct-exchange paths): to each peer
  // our header (if any) and then sendTo(peer)'s bytes; from each, its header and then
  // recvFrom(peer)'s bytes. Returns once every transfer is done and every header matched ours.
  // Peers: every rank, or the members of `among` (which holds this rank at among->pos).
  using Span = std::pair<const void*, size_t>;
  using Landing = std::pair<void*, size_t>;
  void exchangeWithAll(const OpHeader* mine, const std::function<Span(int)>& sendTo,
                       const std::function<Landing(int)>& recvFrom,
                       const SubRing* among = nullptr);
  // Every rank, in rank order, as a SubRing (pos: this rank).
  SubRing everyRank() const;
  // checkHeader for each header in[i] received from recvFrom[i].
  void checkHeaders(const OpHeader& mine, const std::vector<int>& recvFrom,
                    const std::vector<OpHeader>& in, const std::vector<uint64_t>* expectCount);
  // Throws, naming both calls, if `theirs` (from peer) differs from `expected`.
  void checkHeader(const OpHeader& expected, const OpHeader& theirs, int peer) {
    checkOpHeader(expected, theirs, rank_, peer, opName());
  }

  // Throws if abort was requested or the op's deadline passed.
  void throwIfStopped();
  // Any thread: the running operation (and every later wait) fails at its
  // next wait with "aborted", instead of waiting for peers that may never come.
  // With keepLinks (a shrink), the abort and the close after it leave every link
  // open for releaseLinks; without, the abort closes them (the peers fail too).
  void requestAbort(bool keepLinks = false);
  // Once no operation runs (the worker stopped after requestAbort(true)): the links
  // to `ranks` that a shrunk group may keep (Channel::keepable), by position in
  // `ranks` (null where none); every other link is closed.
  std::vector<std::unique_ptr<Channel>> releaseLinks(const std::vector<int>& ranks);
  // Any thread: an error then closes only the links a shrink cannot keep (shared memory,
  // lanes, plaintext), not the sealed TCP links, so a shrink after it (releaseLinks) keeps
  // them warm. For callers whose ranks learn of a failure another way than a closed link
  // (DiLoCo's check of who is alive): a peer waiting on this rank then fails only its own way.
  void keepLinksOnError() { keepLinksOnError_.store(true); }

  // The board (board.h): every collective publishes its header there.
  bool hasBoard() const { return board_.exists(); }
  const char* publish(const OpHeader& header, const void* data, size_t bytes) {
    return board_.publish(header, data, bytes);
  }
  const char* published(int peer, const OpHeader& mine) { return board_.published(peer, mine); }

  // Waiting (waiter.h). waitForActivity: abort and the deadline checked,
  // then Waiter::waitForActivity until the op's deadline.
  static constexpr std::chrono::microseconds kUncappedSleep = Waiter::kUncappedSleep;
  bool progress() { return waiter_.progress(); }
  bool hasPending() const { return waiter_.hasPending(); }
  void waitForActivity(std::chrono::microseconds maxSleep = kUncappedSleep,
                       const uint64_t* wakesSeen = nullptr);
  void waitUntil(const std::function<bool()>& done,
                 std::chrono::microseconds maxSleep = kUncappedSleep);
  // Posted transfers as (channel, ticket); waitAll returns once all are done.
  using Transfers = std::vector<std::pair<Channel*, uint64_t>>;
  void waitAll(const Transfers& sends, const Transfers& recvs);
  // Progress pending point-to-point traffic between operations: returns
  // after some progress, after maxWait, or once wake() was called after the
  // caller read wakeCount() as wakesSeen.
  void progressIdle(std::chrono::milliseconds maxWait, uint64_t wakesSeen);
  void setWatched(int peer, bool on) { waiter_.setWatched(peer, on); }
  bool watchingAny() const { return waiter_.watchingAny(); }
  void wake() { waiter_.wake(); }  // any thread
  uint64_t wakeCount() const { return waiter_.wakeCount(); }
  bool spins() const { return waiter_.spins(); }
  void setSpinYields(bool yields) { waiter_.setSpinYields(yields); }
  uint64_t sharedCoreWaits() const { return waiter_.sharedCoreWaits(); }
  uint64_t sleeps() const { return waiter_.sleeps(); }

  // Single copy (single_copy.h): whether a collective of `bytes` per rank
  // copies peers' memory directly (every peer on this host, the host agreed
  // at connect time, and bytes >= singleCopyBytes); the same answer on every rank.
  bool singleCopy(size_t bytes) const {
    return singleCopy_.peersCopyable() && options_.singleCopyBytes > 0 &&
        bytes >= options_.singleCopyBytes;
  }
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const void* lent, std::vector<uint64_t>* addresses,
                                   int with = -1) {
    singleCopy_.exchangeHeadersAndAddresses(mine, peers, lent, addresses, with);
  }
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const std::vector<const void*>& lentTo,
                                   std::vector<uint64_t>* addresses, int with = -1) {
    singleCopy_.exchangeHeadersAndAddresses(mine, peers, lentTo, addresses, with);
  }
  void readPeer(int peer, uint64_t from, void* dst, size_t bytes) {
    singleCopy_.read(peer, from, dst, bytes);
  }
  void writePeer(int peer, uint64_t to, const void* src, size_t bytes) {
    singleCopy_.write(peer, to, src, bytes);
  }
  void exchangeDone(const std::vector<int>& to, const std::vector<int>& from) {
    singleCopy_.exchangeDone(to, from);
  }
  uint64_t singleCopyBytes() const { return singleCopy_.bytes(); }

  // Bytes moved over all channels and through the board so far (statistics).
  uint64_t bytesSent() const;
  uint64_t bytesReceived() const;
  // What bytesSent counts on the links to peers on other hosts (lanes included).
  uint64_t bytesSentAcrossHosts() const;

  // Scratch memory owned by the communicator, grown on demand, 64-byte aligned.
  char* scratch(size_t bytes);

  // Publishes `reason` in the store unless a peer's came first (one round trip), then closes
  // every link (each peer's operation fails at once); returns `reason`, naming that first
  // error if another. After abort every operation fails with that text.
  std::string abort(const std::string& reason);
  bool aborted() const { return aborted_; }
  // Peers whose process is known to be gone (Channel::peerDead); any thread.
  std::vector<int> deadPeers() const;
  // Per rank: Channel::sendTotals of its links, the bytes of its lanes added (their busy
  // times overlap: the longest counts); any thread.
  std::vector<Channel::SendTotals> sendTotals() const;
  // Per rank: Channel::quietMs of its link, the least over its lanes (-1 where unknown). Any
  // thread.
  std::vector<int64_t> quietMs() const;
  // Caps every link's sending rate (Channel::capSendRate); returns the links capped. Any thread.
  int capSendRate(uint64_t bytesPerSecond);
  const std::string& abortReason() const { return abortReason_; }
  // Adds "ringdist <op>: rank R: " and the peers known dead.
  std::string describeError(const std::string& what);

  // Orderly teardown: waits (bounded) until every rank reached close, so no
  // rank closes a connection a peer may still read from; rank 0 leaves last.
  // maxWait 0: closes the links at once, without the store round trips (every
  // rank closes so: a group re-formed or shrunk away, where nobody waits).
  void close(std::chrono::milliseconds maxWait);

 private:
  // On an error path or at teardown: ask(store)'s answer if the store gives it within `limit`,
  // else nullopt (and from then on nullopt at once: the store is out of reach). An `ask` that
  // throws answers "".
  std::optional<std::string> askStore(std::function<std::string(Rendezvous&)> ask,
                                      std::chrono::milliseconds limit = kStoreOnErrorMs);
  // Teardown: adds delta to the rendezvous counter `key` and returns it, if the store answers
  // by `deadline` (a host cut off from the network cannot reach it, and its close must not wait
  // for TCP to give up); else throws.
  int64_t addBy(const std::string& key, int64_t delta, std::chrono::steady_clock::time_point deadline);
  // Teardown: until the rendezvous counter `key` reaches the group's size or the deadline;
  // with watchPeers, moving queued sends and throwing if a peer closed its links or died first.
  void awaitCount(const std::string& key, std::chrono::steady_clock::time_point deadline,
                  bool watchPeers);
  // Teardown: a peer that began a collective this rank never joined (its header on the
  // board, or bytes on its link that no receive of ours asked for), else -1; `op` names it.
  int peerInNextOp(std::string* op);
  std::string pendingPeers() const;
  void setUpHierarchy();

  const int rank_;
  const int size_;
  // By rank (null for ourselves and where there is none), then every lane beyond the first.
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::vector<Channel*>> lanesOf_;  // by rank: lanes 1.. of that peer
  std::shared_ptr<Rendezvous> rendezvous_;
  SubRing ring_;  // every rank, host by host
  std::vector<int> hostOf_;
  CollectiveOptions options_;
  uint32_t linkRoundTripUs_ = 0;
  uint32_t reportedRoundTripUs_ = 0;
  double linkBitsPerSecond_ = 0;
  double bestRateSample_ = 0;  // 0: none since the last agreement
  uint64_t sampledCalls_ = 0;
  bool hierarchical_ = false;
  SubRing hostRing_;
  int hostCount_ = 1;
  SubRing crossRing_;
  uint64_t seq_ = 0;
  OpType opType_ = OpType::kBarrier;
  std::chrono::milliseconds opTimeout_{0};
  std::chrono::steady_clock::time_point deadline_;
  char* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  bool aborted_ = false;
  // Set once the store did not answer on an error path (askStore).
  std::atomic<bool> storeSilent_{false};
  bool closed_ = false;
  std::atomic<bool> abortRequested_{false};
  std::atomic<bool> keepLinks_{false};
  std::atomic<bool> keepLinksOnError_{false};
  // Held by the any-thread calls that read channels_ and by releaseLinks, which empties some.
  mutable std::mutex linksMutex_;
  std::string abortReason_;
  // After channels_, which they read.
  Waiter waiter_;
  BoardProtocol board_;
  SingleCopy singleCopy_;
};

}  // namespace ringdist
