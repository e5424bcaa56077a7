#pragma once

// Stream-ordered hand-offs among the ranks of one host that share a GPU, or
// whose GPUs reach each other's memory: counters in a page of host shared
// memory that every rank maps (and, on a GPU, registers with CUDA), written
// and awaited by the GPU's own stream memory operations, so no host waits for
// the GPU and no call needs a handshake.
//
// Operation `seq` (1, 2, ... per group, the same on every rank), on one GPU
// (a leader):
//   every other rank  writes ready[rank] = seq once its input is in place,
//                     then waits for done[leader] >= seq before anything after
//                     the op runs (the leader writes into its tensor);
//   the leader        waits for ready[r] >= seq of every other rank, runs the
//                     fused kernel (all inputs in, all outputs out), then
//                     writes done[leader] = seq.
// On several GPUs (split: no leader) every rank writes ready, waits for every
// other rank's, runs the kernel over its own share of the work, writes
// done[rank] and waits for every other rank's done.
// Counters only grow and compare cyclically (as cuStreamWaitValue32's GEQ
// does), so they never need resetting. Because the page is host memory, the
// host can see how far the GPU got (finished()) and can always release its
// own stream's waits (abort()): a rank that misses its deadline sets the
// group's abort word and writes the counters the others wait for; the kernel
// skips its work when the word is set, and every rank's op fails.
//
// Point-to-point messages (send/recv) have words of their own per ordered
// pair (sender s, receiver r), apart from the operations' counters: a send
// and its receive are not collective, and receives complete in the order
// they are matched (tags), not the order of the sends. Message k (1, 2, ...
// per pair):
//   the sender's host  sets sent = k before it queues anything;
//   its post stream    waits for the slot's previous message (k - kMessageSlots)
//                      to be taken, then writes posted = k once the data is in place;
//   its done stream    waits for taken[k % kMessageSlots] >= k (the sender's
//                      memory is in use until then);
//   the receiver       (its stream for that sender) waits for posted >= k,
//                      copies, and writes taken[k % kMessageSlots] = k.
// Sends are posted on a stream that waits for nothing of the receiver's
// (beyond a full ring of slots), so a receive queued before the matching send
// on both ranks still completes.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/common/shared_memory.h"
#include "csrc/gpu/platform/fused.h"

namespace ringdist {

struct alignas(64) SignalWord {
  std::atomic<uint32_t> value;
};

// Device messages one rank may have in flight to one peer; the next waits
// for the oldest to be taken.
constexpr int kMessageSlots = 16;

// One ordered pair's message words (see above).
struct MessageWords {
  SignalWord sent;    // the sender's host: messages issued (an abort releases up to it)
  SignalWord posted;  // the sender's post stream: messages whose data is in place
  SignalWord taken[kMessageSlots];  // the receiver's stream: message k copied, in slot k % kMessageSlots
};

struct SignalPage {
  uint64_t magic;
  SignalWord abort;                    // 0, or 1 + the rank that aborted
  SignalWord abortedAt;                // the operation it was at
  SignalWord abortCause;               // an AbortCause
  SignalWord done[kMaxFusedRanks];     // done[r] written by rank r's stream after its kernel
  SignalWord ready[kMaxFusedRanks];    // ready[r] written by rank r's stream (not the leader's)
  SignalWord probe[kMaxFusedRanks];    // probe[r]: rank r's set-up tries the stream operations
  MessageWords messages[kMaxFusedRanks][kMaxFusedRanks];  // [sender][receiver]
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "signals are plain 32-bit words");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "the GPU writes signals as 32-bit words");

// Why a rank aborted the hand-offs (told to every rank through the page).
enum class AbortCause : uint32_t {
  kDeadline = 1,  // an operation was unfinished at its deadline
  kMapping = 2,   // the leader could not map another rank's memory
  kShutdown = 3,  // the group ended with an operation unfinished
  kMessageDeadline = 4,  // a point-to-point message was unfinished at its deadline
  kMessageMismatch = 5,  // a receive got a message of another size or type
};

// a >= b in the cyclic order of 32-bit counters (what the GPU's GEQ wait uses).
inline bool reached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

// What one rank puts on its stream, in order: a GPU stream in production, the
// calling thread in the CPU run of the protocol (tests).
class SignalQueue {
 public:
  virtual ~SignalQueue() = default;
  virtual void write(SignalWord* word, uint32_t value) = 0;
  // Nothing queued after this runs before *word reaches value (cyclically).
  virtual void waitFor(SignalWord* word, uint32_t value) = 0;
  // The fused pass (fused.h) of `args`, combining as (dtype, op).
  virtual void combine(const FusedArgs& args, DataType dtype, ReduceOp op) = 0;
  // dst = src (bytes), both this rank's memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
};

// A page of host memory shared by the ranks of one group on one host.
class SharedPage {
 public:
  static SharedPage create();                     // fresh, unguessable name
  static SharedPage open(const std::string& name);  // one that a peer created

  SignalPage* signals() const { return static_cast<SignalPage*>(mapping_.base()); }
  size_t bytes() const { return kBytes; }
  const std::string& name() const { return mapping_.name(); }
  void unlinkName() { mapping_.unlinkName(); }  // once every rank opened it; the mapping stays

  static constexpr size_t kBytes = 20 * 4096;

 private:
  SharedMapping mapping_;
};

// The protocol above, for one rank of one group. leader: the rank whose
// stream runs the kernel (it maps the others' memory), or kSplit: every rank
// runs its share.
constexpr int kSplit = -1;
class StreamSignals {
 public:
  StreamSignals(SignalPage* page, int rank, int ranks, int leader);

  int rank() const { return rank_; }
  int leader() const { return leader_; }
  bool isLeader() const { return rank_ == leader_; }
  bool split() const { return leader_ == kSplit; }
  // Whether this rank's kernel runs work (the leader's, or every rank's when split).
  bool runsKernel() const { return split() || isLeader(); }
  uint32_t lastSeq() const { return seq_; }

  // Queues the sender's part of the next message to `peer` (post: the data is
  // in place, on a queue where it already is; done: the receiver took it) and
  // returns its number k.
  uint32_t queueSend(SignalQueue& post, SignalQueue& done, int peer);
  // Queues the receiver's part of message k from `source`: the wait for it,
  // `copy` (the fused pass of one copy span, skipped once aborted) and taken.
  void queueReceive(SignalQueue& queue, int source, uint32_t k, const FusedArgs& copy);
  // Whether message k from `source` to `receiver` was taken (read from the page).
  bool delivered(int source, int receiver, uint32_t k) const;

  // Queues the next operation on this rank's queue and returns its seq.
  // args: this rank's kernel's work (ignored where it runs none).
  uint32_t queueOp(SignalQueue& queue, const FusedArgs& args, DataType dtype, ReduceOp op);

  // Whether this rank's stream got past operation seq (read from the page).
  bool finished(uint32_t seq) const;
  bool aborted() const;
  // Which rank aborted the group, why, at which operation ("" while not aborted).
  std::string abortReason() const;
  // Fails the group: sets the abort word (naming this rank, the cause and
  // `at`, the operation concerned; the first abort's are kept) and writes every
  // counter up to seq (never lowering one), so every rank's queued waits up to
  // seq return, and every message word up to its pair's sent count.
  void abort(AbortCause cause, uint32_t at, uint32_t seq);

 private:
  SignalPage* page_;
  int rank_;
  int ranks_;
  int leader_;
  uint32_t seq_ = 0;
  uint32_t sent_[kMaxFusedRanks] = {};  // messages issued to each peer
};

}  // namespace ringdist
