#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/communicator.h"
#include "csrc/common/types.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

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

  size_t count;
  size_t chunks;
  size_t segmentElems;
  size_t base;
  size_t extra;
  size_t segmentsPerChunk;
};

inline size_t modPos(long value, int n) {
  long m = value % n;
  return static_cast<size_t>(m < 0 ? m + n : m);
}

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
