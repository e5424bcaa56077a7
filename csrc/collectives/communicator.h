#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/common/types.h"
#include "csrc/transport/board.h"
#include "csrc/transport/channel.h"

namespace ringdist {

// Kinds of operation; travel in op headers (append only).
enum class OpType : uint8_t {
  kAllreduce = 1,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kReduce,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kSend,
  kCompressedAllreduce,
};

const char* opTypeName(OpType type);

// Sent ahead of every operation's data to each peer it talks to, so ranks
// that disagree on the operation, its size or dtype fail with a clear error
// instead of reading each other's bytes as data. Every field is compared.
struct OpHeader {
  uint32_t magic;
  uint8_t type;          // OpType
  uint8_t dtype;         // DataType
  uint8_t op;            // ReduceOp (reductions; else SUM)
  uint8_t variant;       // allreduce: its algorithm; compressed allreduce: its codec
  uint64_t seq;          // collective sequence number in this group (0 for sends)
  uint64_t count;        // elements (all-to-all: to this peer; send: bytes)
  int32_t root;          // rooted collectives, else -1
  uint32_t segmentBytes; // collectives: how buffers are cut into segments
  int32_t tag;           // send: the message tag
  uint32_t padding;      // 0: keeps the header a multiple of 8 bytes
};
static_assert(sizeof(OpHeader) == 40, "OpHeader is a wire format");
constexpr uint32_t kOpMagic = 0x52444f50;  // "RDOP", first field of every header
// Receives in flight per channel in the ring pipelines (>= 2 so receiving
// segment i+1 overlaps reducing segment i).
constexpr size_t kRecvWindow = 4;
// Before sleeping on a shared-memory doorbell, poll this long: a peer on
// another core usually answers within microseconds, and a futex round trip
// costs more than that. Skipped when ranks outnumber cores.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(50);
// Longest single sleep; between sleeps dead peers and deadlines are checked.
constexpr auto kMaxSleep = std::chrono::milliseconds(50);
// Looks at the board before a timed wait (a pause each, ~1 us in all).
constexpr int kQuickLooks = 64;

// Data of a small operation published on the board (Communicator::publish),
// at most this many bytes; the allreduce takes that way up to it.
constexpr size_t kBoardDataBytes = 4 << 10;

// Ranks arranged in a ring (members by position; we sit at pos): all of a
// group, or part of it for the two-level allreduce.
struct SubRing {
  std::vector<int> members;
  int pos = 0;
  int size() const { return static_cast<int>(members.size()); }
  int left() const { return members[static_cast<size_t>((pos + size() - 1) % size())]; }
  int right() const { return members[static_cast<size_t>((pos + 1) % size())]; }
};

// One process group's view of its peers: channels, ring order, progress
// loop, deadlines and abort state. Single-threaded: only the backend's
// worker thread calls into it.
class Communicator {
 public:
  // ring: ranks in ring order (a permutation of 0..size-1), the ranks of
  // each host consecutive; hostOf: host index of each rank.
  // board: every rank on this host over shared memory (Mesh::board), else null.
  Communicator(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
               std::vector<int> ring, std::vector<int> hostOf,
               std::shared_ptr<Rendezvous> rendezvous, const CollectiveOptions& options,
               std::shared_ptr<Board> board = nullptr);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  Channel& channel(int peer);
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

  // The board (Board): each rank's area holds the number (seq) of the last
  // collective it published and, by that number's parity, its header and up
  // to kBoardDataBytes of data. Every collective publishes its header there,
  // so a rank that takes the board for a small operation meets a peer that
  // took another path as a header mismatch, not a timeout.
  bool hasBoard() const { return board_ != nullptr; }
  // Publishes `header` with `bytes` of `data` (waiting, bounded, until every
  // peer published the one before, so that no one still reads the entry this
  // overwrites) and wakes the peers that sleep.
  // Returns where our data sits on the board.
  const char* publish(const OpHeader& header, const void* data, size_t bytes);
  // The data `peer` published with the collective `mine` (waits, bounded,
  // until it published it), after checking its header against ours.
  const char* published(int peer, const OpHeader& mine);
  // Sends `mine` to each of sendTo and checks the header from each of
  // recvFrom. sendCount/expectCount (indexed by rank) override `count` per
  // peer for operations with per-peer sizes.
  void exchangeHeaders(const OpHeader& mine, const std::vector<int>& sendTo,
                       const std::vector<int>& recvFrom,
                       const std::vector<uint64_t>* sendCount = nullptr,
                       const std::vector<uint64_t>* expectCount = nullptr);
  // Single copy: exchangeHeaders with each of peers both ways; our header is
  // followed by the address of the buffer we lend, and addresses[peer]
  // (indexed by rank) receives the one that follows each peer's header.
  // `with` >= 0: addresses go to and come from that peer only. The second
  // form lends each peer its own buffer, lentTo[peer] (indexed by rank).
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const void* lent, std::vector<uint64_t>* addresses,
                                   int with = -1);
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const std::vector<const void*>& lentTo,
                                   std::vector<uint64_t>* addresses, int with = -1);
  void exchangeRingHeaders(const OpHeader& mine);
  // checkHeader for each header in[i] received from recvFrom[i].
  void checkHeaders(const OpHeader& mine, const std::vector<int>& recvFrom,
                    const std::vector<OpHeader>& in, const std::vector<uint64_t>* expectCount);
  // Throws, naming both calls, if `theirs` (from peer) differs from `expected`.
  void checkHeader(const OpHeader& expected, const OpHeader& theirs, int peer);

  // Progress every channel once without blocking; true if a byte moved.
  bool progress();
  // Blocks (poll) until some channel can progress, the deadline passes or
  // maxSleep elapsed (for conditions no file descriptor signals, such as a
  // send queue draining).
  // kUncappedSleep: sleep until activity (poll slices of at most 1 s).
  static constexpr std::chrono::microseconds kUncappedSleep = std::chrono::seconds(1);
  // wakesSeen (idle waits only): wakeCount() when the caller last found
  // nothing to do; a wake() since then ends the wait.
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
  bool hasPending() const;
  // Receives from any source watch links with nothing queued on them: bytes
  // arriving there end an idle wait as well.
  void setWatched(int peer, bool on);
  bool watchingAny() const;
  // Any thread: ends the worker's idle wait (new work was queued).
  void wake();
  // Whether waits may busy-poll (every local rank has a core).
  bool spins() const { return spin_; }
  // Whether a busy-poll yields the core between looks (true: the op runs on
  // the worker, and the process's caller thread may need the core; false:
  // the caller runs it, on the latency path).
  void setSpinYields(bool yields) { spinYields_ = yields; }
  // Any thread: the running operation (and every later wait) fails at its
  // next wait with "aborted", instead of waiting for peers that may never come.
  void requestAbort();
  uint64_t wakeCount() const { return wakes_.load(); }

  // Bytes moved over all channels and through the board so far (statistics).
  uint64_t bytesSent() const;
  uint64_t bytesReceived() const;
  // Waits that slept without spinning because a peer shared this CPU.
  uint64_t sharedCoreWaits() const { return sharedCoreWaits_; }
  // Shared-memory waits that went to sleep on their doorbell.
  uint64_t sleeps() const { return sleeps_; }

  // Whether a collective of `bytes` per rank copies peers' memory
  // directly (every peer on this host, the host agreed at connect time, and
  // bytes >= singleCopyBytes); the same answer on every rank.
  bool singleCopy(size_t bytes) const {
    return peersCopyable_ && options_.singleCopyBytes > 0 && bytes >= options_.singleCopyBytes;
  }
  // Reads bytes at `from` in peer's memory into dst (writePeer: src to `to`
  // in the peer's memory), in pieces, checking abort and the deadline
  // between them.
  void readPeer(int peer, uint64_t from, void* dst, size_t bytes);
  void writePeer(int peer, uint64_t to, const void* src, size_t bytes);
  // Tells each of `to` that we are done with its memory and waits until each
  // of `from` is done with ours (one byte each way).
  void exchangeDone(const std::vector<int>& to, const std::vector<int>& from);
  // Bytes copied from or into peers' memory so far (statistics).
  uint64_t singleCopyBytes() const { return singleCopyBytes_; }

  // Scratch memory owned by the communicator, grown on demand, 64-byte aligned.
  char* scratch(size_t bytes);

  // After abort every operation fails with the first error's text.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_; }
  // Peers whose process is known to be gone (Channel::peerDead); any thread.
  std::vector<int> deadPeers() const;
  const std::string& abortReason() const { return abortReason_; }
  // Adds "ringdist <op>: rank R: " and, for lost peers, any reason a peer
  // published when it aborted.
  std::string describeError(const std::string& what);

  // Orderly teardown: waits (bounded) until every rank reached close, so no
  // rank closes a connection a peer may still read from; rank 0 leaves last.
  void close(std::chrono::milliseconds maxWait);

 private:
  // Teardown: until the rendezvous counter `key` reaches the group's size or the deadline;
  // with watchPeers, moving queued sends and throwing if a peer closed its links or died first.
  void awaitCount(const std::string& key, std::chrono::steady_clock::time_point deadline,
                  bool watchPeers);
  std::string pendingPeers() const;
  void setUpHierarchy();
  // Throws if abort was requested or the op's deadline passed.
  void throwIfStopped();
  // readPeer/writePeer's loop: copy(done, piece) for each piece of at most
  // kSingleCopyPieceBytes, abort and deadline checked and links progressed
  // between pieces; counts the bytes in singleCopyBytes_.
  template <typename Copy>
  void copyInPieces(size_t bytes, Copy copy);
  static void cpuRelax();
  // One wait of a shared-memory waiter: spins kSpinBeforeSleep if `spin`
  // (not when ranks outnumber cores, nor for a peer that last waited on this
  // CPU: the scheduler put it beside us, and it runs only once we leave the
  // core; a spinning peer answers within microseconds, a sleep costs a
  // wake-up), then sleeps on `bell` for at most `left`. kQuiet: a whole
  // sleep passed with done() still false and no wake-up.
  enum class BellWait { kDone, kWoken, kQuiet };
  template <typename Done>
  BellWait waitOnBell(Doorbell* bell, bool spin, std::chrono::microseconds left, const Done& done);
  // waitForActivity's wait on shared-memory links: until a transfer moved, a
  // watched link got bytes, or a wake-up since wakesSeen; or one sleep.
  void sleepOnDoorbell(Doorbell* bell, bool coreShared, std::chrono::milliseconds left,
                       const uint64_t* wakesSeen);
  // Until peer's board area has published at least `seq` (peers ring our
  // doorbell when they publish); deadline, abort and the peer's liveness
  // checked.
  void waitForPublished(int peer, uint64_t seq);
  // Bytes on a watched link: what progress() reports for queued receives.
  bool watchedArrival();
  bool wokenSince(const uint64_t* wakesSeen) const {
    return wakesSeen != nullptr && wakes_.load() != *wakesSeen;
  }

  const int rank_;
  const int size_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::shared_ptr<Rendezvous> rendezvous_;
  SubRing ring_;  // every rank, host by host
  std::vector<int> hostOf_;
  CollectiveOptions options_;
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
  bool closed_ = false;
  bool spin_ = false;  // busy-poll briefly before sleeping (a core per local rank)
  bool spinYields_ = true;
  uint64_t sharedCoreWaits_ = 0;
  uint64_t sleeps_ = 0;
  bool peersCopyable_ = false;  // every peer's channel copiesPeerMemory()
  uint64_t singleCopyBytes_ = 0;
  std::vector<char> watched_;  // by peer, see setWatched
  std::shared_ptr<Board> board_;
  int boardWaitsFor_ = -1;  // the peer a board wait is for (pendingPeers)
  uint64_t boardBytesPublished_ = 0;  // counted in bytesSent() / bytesReceived()
  uint64_t boardBytesRead_ = 0;
  int wakeFd_ = -1;            // eventfd written by wake(), polled by idle waits
  Doorbell* localBell_ = nullptr;  // rung by wake() when idle waits sleep on it
  std::atomic<bool> idleWaiting_{false};
  std::atomic<uint64_t> wakes_{0};
  std::atomic<bool> abortRequested_{false};
  std::string abortReason_;
};

}  // namespace ringdist
