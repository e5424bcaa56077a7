#include "csrc/gpu/platform/stream_signals.h"

#include <new>

#include "csrc/common/error.h"

namespace ringdist {

namespace {
constexpr uint64_t kPageMagic = 0x5244534947303031ull;  // "RDSIG001"
static_assert(sizeof(SignalPage) <= SharedPage::kBytes, "the signals fit one page");

// Raises a counter to `value` (cyclically), never lowering it.
void raiseTo(SignalWord& word, uint32_t value) {
  uint32_t now = word.value.load(std::memory_order_acquire);
  while (!reached(now, value) &&
         !word.value.compare_exchange_weak(now, value, std::memory_order_acq_rel)) {
  }
}
}  // namespace

SharedPage SharedPage::create() {
  SharedPage page;
  page.mapping_ = SharedMapping::create(kBytes);
  auto* signals = new (page.mapping_.base()) SignalPage{};  // zero-filled: every counter at 0
  std::atomic_thread_fence(std::memory_order_release);
  signals->magic = kPageMagic;
  return page;
}

SharedPage SharedPage::open(const std::string& name) {
  SharedPage page;
  page.mapping_ = SharedMapping::open(name, kBytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  RINGDIST_CHECK(page.signals()->magic == kPageMagic, "ringdist: shared memory ", name,
                 " is not a ringdist signal page");
  return page;
}

StreamSignals::StreamSignals(SignalPage* page, int rank, int ranks, int leader)
    : page_(page), rank_(rank), ranks_(ranks), leader_(leader) {
  RINGDIST_CHECK(ranks >= 1 && ranks <= kMaxFusedRanks && rank >= 0 && rank < ranks &&
                     leader >= kSplit && leader < ranks,
                 "ringdist: stream signals for rank ", rank, " of ", ranks, " (leader ", leader,
                 "): at most ", kMaxFusedRanks, " ranks");
}

uint32_t StreamSignals::queueOp(SignalQueue& queue, const FusedArgs& args, DataType dtype,
                                ReduceOp op) {
  const uint32_t seq = ++seq_;
  auto waitForOthers = [&](SignalWord* words) {
    for (int r = 0; r < ranks_; ++r) {
      if (r != rank_) queue.waitFor(&words[r], seq);
    }
  };
  if (split()) {
    queue.write(&page_->ready[rank_], seq);
    waitForOthers(page_->ready);
    queue.combine(args, dtype, op);
    queue.write(&page_->done[rank_], seq);
    waitForOthers(page_->done);  // the others write into this rank's output
  } else if (isLeader()) {
    waitForOthers(page_->ready);
    queue.combine(args, dtype, op);
    queue.write(&page_->done[rank_], seq);
  } else {
    queue.write(&page_->ready[rank_], seq);
    queue.waitFor(&page_->done[leader_], seq);
  }
  return seq;
}

uint32_t StreamSignals::queueSend(SignalQueue& post, SignalQueue& done, int peer) {
  MessageWords& words = page_->messages[rank_][peer];
  const uint32_t k = ++sent_[peer];
  words.sent.value.store(k, std::memory_order_release);  // before any rank waits for k
  SignalWord* slot = &words.taken[k % kMessageSlots];
  if (k > static_cast<uint32_t>(kMessageSlots)) post.waitFor(slot, k - kMessageSlots);
  post.write(&words.posted, k);
  done.waitFor(slot, k);
  return k;
}

void StreamSignals::queueReceive(SignalQueue& queue, int source, uint32_t k, const FusedArgs& copy) {
  MessageWords& words = page_->messages[source][rank_];
  queue.waitFor(&words.posted, k);
  queue.combine(copy, DataType::kUInt8, ReduceOp::kSum);
  queue.write(&words.taken[k % kMessageSlots], k);
}

bool StreamSignals::delivered(int source, int receiver, uint32_t k) const {
  const SignalWord& slot = page_->messages[source][receiver].taken[k % kMessageSlots];
  return reached(slot.value.load(std::memory_order_acquire), k);
}

bool StreamSignals::finished(uint32_t seq) const {
  auto done = [&](int r) { return reached(page_->done[r].value.load(std::memory_order_acquire), seq); };
  if (!split()) return done(leader_);
  for (int r = 0; r < ranks_; ++r) {
    if (!done(r)) return false;
  }
  return true;
}

bool StreamSignals::aborted() const {
  return page_->abort.value.load(std::memory_order_acquire) != 0;
}

std::string StreamSignals::abortReason() const {
  const uint32_t by = page_->abort.value.load(std::memory_order_acquire);
  if (by == 0) return "";
  const uint32_t at = page_->abortedAt.value.load(std::memory_order_acquire);
  switch (static_cast<AbortCause>(page_->abortCause.value.load(std::memory_order_acquire))) {
    case AbortCause::kMapping:
      return strCat("rank ", by - 1, " could not map another rank's memory for GPU operation #", at);
    case AbortCause::kMessageDeadline:
      return strCat("rank ", by - 1, " found its GPU message #", at,
                    " (send or receive) unfinished at its deadline");
    case AbortCause::kMessageMismatch:
      return strCat("rank ", by - 1, " received GPU message #", at,
                    " with another size or type than its receive expected");
    case AbortCause::kShutdown:
      return strCat("rank ", by - 1, " ended the group with GPU operation #", at, " unfinished");
    default:
      return strCat("rank ", by - 1, " found GPU operation #", at, " unfinished at its deadline");
  }
}

void StreamSignals::abort(AbortCause cause, uint32_t at, uint32_t seq) {
  // The cause goes in before the abort word: a rank that sees the word reads them.
  uint32_t none = 0;
  if (page_->abortCause.value.compare_exchange_strong(none, static_cast<uint32_t>(cause),
                                                      std::memory_order_acq_rel)) {
    page_->abortedAt.value.store(at, std::memory_order_release);
    page_->abort.value.store(static_cast<uint32_t>(rank_) + 1, std::memory_order_release);
  }
  // Another rank won: its abort word follows its cause at once, and must be
  // set before any wait is released (the kernel reads it to skip its work).
  while (page_->abort.value.load(std::memory_order_acquire) == 0) {
  }
  for (int r = 0; r < ranks_; ++r) {
    raiseTo(page_->ready[r], seq);
    raiseTo(page_->done[r], seq);
  }
  // Every wait on a pair's words is for a message up to its sent count.
  for (int s = 0; s < ranks_; ++s) {
    for (int r = 0; r < ranks_; ++r) {
      MessageWords& words = page_->messages[s][r];
      const uint32_t sent = words.sent.value.load(std::memory_order_acquire);
      raiseTo(words.posted, sent);
      for (SignalWord& slot : words.taken) raiseTo(slot, sent);
    }
  }
}

}  // namespace ringdist
