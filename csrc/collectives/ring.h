#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/communicator.h"
#include "csrc/common/types.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

inline size_t modPos(long value, int n) {
  long m = value % n;
  return static_cast<size_t>(m < 0 ? m + n : m);
}

// How a ring algorithm cuts a buffer.
//   chunk    one of N near-equal parts of the buffer (sizes differ by at most
//            one element); chunk c ends up owned by ring position c.
//   segment  a piece of a chunk of at most segmentBytes (at least one
//            element); the unit that is sent, received and reduced, so
//            consecutive segments pipeline.
//   step     one hop around the ring; in step s position p sends chunk
//            (p - s - 1) mod N to its right and receives chunk (p - s - 2)
//            mod N from its left. Reduce-scatter is steps 0..N-2, allgather
//            steps N-1..2N-3; the same formula serves both.
//   transfer the pair (step, segment), numbered step * segmentsPerChunk +
//            segment; every rank sends and receives transfers in that order.
// Offsets and lengths are in elements of elementBytes each.
struct ChunkLayout {
  // segmentBytes is the largest segment; chunks of less than kPipelineDepth
  // such segments are cut finer (down to kMinPipelinedSegmentBytes) so that a
  // mid-size transfer still overlaps the sender's and receiver's copies.
  ChunkLayout(size_t count, int chunks, size_t segmentBytes, size_t elementBytes)
      : count(count), chunks(static_cast<size_t>(chunks)) {
    base = count / this->chunks;
    extra = count % this->chunks;
    size_t longest = base + (extra > 0 ? 1 : 0);
    size_t pipelined = std::max(kMinPipelinedSegmentBytes, longest * elementBytes / kPipelineDepth);
    segmentElems = std::max<size_t>(1, std::min(segmentBytes, pipelined) / elementBytes);
    segmentsPerChunk = longest == 0 ? 1 : (longest + segmentElems - 1) / segmentElems;
  }
  size_t chunkOffset(size_t c) const { return c * base + (c < extra ? c : extra); }
  size_t chunkLength(size_t c) const { return base + (c < extra ? 1 : 0); }
  // Segment j of chunk c as [offset, offset + length) in elements; may be empty.
  void segment(size_t c, size_t j, size_t* offset, size_t* length) const {
    size_t len = chunkLength(c);
    size_t begin = j * segmentElems;
    *offset = chunkOffset(c) + (begin < len ? begin : len);
    *length = begin < len ? (len - begin < segmentElems ? len - begin : segmentElems) : 0;
  }
  // The chunk ring position `pos` sends (or receives) in transfer t.
  size_t chunkOf(long pos, size_t transfer, bool sending) const {
    const long step = static_cast<long>(transfer / segmentsPerChunk);
    return modPos(pos - step - (sending ? 1 : 2), static_cast<int>(chunks));
  }
  // Transfer t's segment that ring position `pos` sends (or receives), as
  // (offset, length) in elements.
  std::pair<size_t, size_t> transferSegment(long pos, size_t transfer, bool sending) const {
    size_t offset, length;
    segment(chunkOf(pos, transfer, sending), transfer % segmentsPerChunk, &offset, &length);
    return {offset, length};
  }

  size_t count;
  size_t chunks;
  size_t segmentElems;
  size_t base;
  size_t extra;
  size_t segmentsPerChunk;
};

// The bytes a ring keeps in flight on each link: a link of
// kRingFillBitsPerSecond stays full over a round trip of roundTripUs.
inline size_t ringInFlightBytes(uint32_t roundTripUs) {
  return static_cast<size_t>(kRingFillBitsPerSecond / 8 * roundTripUs / 1e6);
}

// How many segments after its arrival the ring allreduce forwards a segment
// at least: two segments later it is still in cache.
constexpr size_t kForwardLag = 2;

// How many segments of `segmentBytes` after its arrival a segment is
// forwarded on links of roundTripUs: kForwardLag, or enough that the sends
// queued ahead of a forward hold ringInFlightBytes, so the link stays busy
// while the segment to forward crosses from the left neighbour.
inline size_t forwardLag(uint32_t roundTripUs, size_t segmentBytes) {
  const size_t segment = std::max<size_t>(1, segmentBytes);
  return std::max(kForwardLag, (ringInFlightBytes(roundTripUs) + segment - 1) / segment);
}

// How one run of ring transfers meets its operation's StageGate (the
// glossary's gate), shared by the ring allreduce, allgather and
// reduce-scatter. Of the run's transfers, the sends of step 0 (transfer <
// perStep) and the receives of reduce steps (transfer < reduceTransfers:
// they combine the input with what arrives) read the input first; the
// receives of the last reduce step and of every later (allgather) step
// finish their segment. With `needs`, the run plans those reads once, in the
// order it makes them, and asks for each before making it; with `produces`,
// it tells of each finished segment. inputBytes(transfer, sending) and
// outputBytes(transfer) give a transfer's (offset, bytes) in the gate's input
// and output; empty ranges are left out. Without a gate, nothing happens.
template <typename InputBytes, typename OutputBytes>
class RingGate {
 public:
  RingGate(StageGate* needs, StageGate* produces, size_t perStep, size_t reduceTransfers,
           InputBytes inputBytes, OutputBytes outputBytes)
      : needs_(needs), produces_(produces), perStep_(perStep),
        reduceTransfers_(reduceTransfers), inputBytes_(inputBytes), outputBytes_(outputBytes) {}

  // Plans the reads of the transfers of `order`, each transfer's send then
  // its receive (the order in which the allreduce's stream makes them).
  void plan(const std::vector<size_t>& order) const {
    if (needs_ == nullptr) return;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t t : order) {
      add(&ranges, t, true);
      add(&ranges, t, false);
    }
    needs_->plan(ranges);
  }
  // Plans the reads of transfers 0..total-1, every send before any receive
  // (the order in which a loop that waits for one input piece per round
  // makes them).
  void planSendsFirst(size_t total) const {
    if (needs_ == nullptr) return;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t t = 0; t < total; ++t) add(&ranges, t, true);
    for (size_t t = 0; t < total; ++t) add(&ranges, t, false);
    needs_->plan(ranges);
  }
  // Before transfer t's send (or receive): asks for the input it reads, if
  // it reads any. Returns whether it asked (it may have waited).
  bool need(size_t transfer, bool sending) const {
    if (needs_ == nullptr || !readsInput(transfer, sending)) return false;
    const auto [offset, bytes] = inputBytes_(transfer, sending);
    if (bytes > 0) needs_->need(offset, bytes);
    return true;
  }
  // After transfer t's receive completed: tells of its segment if final.
  void produced(size_t transfer) const {
    if (produces_ == nullptr || transfer + perStep_ < reduceTransfers_) return;
    const auto [offset, bytes] = outputBytes_(transfer);
    if (bytes > 0) produces_->produced(offset, bytes);
  }

 private:
  bool readsInput(size_t transfer, bool sending) const {
    return transfer < (sending ? perStep_ : reduceTransfers_);
  }
  void add(std::vector<std::pair<size_t, size_t>>* ranges, size_t transfer, bool sending) const {
    if (!readsInput(transfer, sending)) return;
    const auto range = inputBytes_(transfer, sending);
    if (range.second > 0) ranges->push_back(range);
  }

  StageGate* const needs_;
  StageGate* const produces_;
  const size_t perStep_;
  const size_t reduceTransfers_;
  InputBytes inputBytes_;
  OutputBytes outputBytes_;
};

// How one run of ring steps meets the operation's StageGate: `needs`: its
// step-0 sends and reduce-scatter receives are the operation's first reads
// of the input; `produces`: its final segments are results; `offset`: where
// its data starts in the gated buffer (bytes).
struct StepsGate {
  StageGate* needs = nullptr;
  StageGate* produces = nullptr;
  size_t offset = 0;
};

// Steps [firstStep, endStep) of a pipelined ring allreduce over `ring` on
// `count` elements at `data` (allreduce.cc): steps 0..n-2 reduce-scatter (position p ends
// owning chunk p of ChunkLayout(count, n, segmentBytes, element size), fully reduced), steps
// n-1..2n-3 allgather. A partial range starts from data that is final for its first step.
// divisor > 0: the owner divides its chunk by it after the last reduce step (AVG). `gated`
// says how these steps meet the operation's StageGate, if any.
void ringSteps(Communicator& comm, const SubRing& ring, void* data, size_t count, DataType dtype,
               ReduceFn reduceFn, long firstStep, long endStep, int divisor,
               const StepsGate& gated = {});

// The ring reduce-scatter shared by reduce_scatter and reduce
// (reduce_scatter.cc). chunks[c] is the input chunk of ring position c
// (layout gives lengths); inputs are never written. The fully reduced chunk
// of this rank's position is written to `out`, or left in scratch when out
// is null; returns where it is. With a gate (and out), chunk c's input
// starts at byte gateAt[c] of the gate's input.
char* ringReduceScatter(Communicator& comm, const std::vector<const char*>& chunks,
                        const ChunkLayout& layout, DataType dtype, ReduceOp op, char* out,
                        StageGate* gate = nullptr, const std::vector<size_t>& gateAt = {});

// Single copy (reduce_scatter.cc), shared with the single-copy allreduce:
// sum = combine(...combine(x[pos+1], x[pos+2])..., x[pos+N-1]), the ring's
// chain order by ring position, where x[p] are the `len` elements at byte
// `offset` of the buffer ring position p lent (address, by rank). Each is
// read into `theirs`; both hold len elements.
void sumPeersInRingOrder(Communicator& comm, const std::vector<uint64_t>& address,
                         uint64_t offset, size_t len, size_t elem, ReduceFn reduceFn, char* sum,
                         char* theirs);

}  // namespace ringdist
