#pragma once

// One pass over the memory of every rank that shares a GPU: the kernel the
// group's leader queues for a same-GPU collective (same_gpu.h) reads every
// rank's input once and writes every rank's output once. The work is a list
// of spans; each span reads `length` elements from `terms` ranks' inputs (in
// the order that gives the host path's bits), combines them, and writes the
// result to every rank's output or to one rank's. Allreduce, reduce, reduce-scatter,
// allgather, broadcast and alltoall are span lists (the builders below). Written once
// for the CUDA kernel (csrc/gpu/cuda/same_gpu.cu) and the CPU run of the same
// code that tests check against the engine.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "csrc/reduce/elementwise.h"

namespace ringdist {

// Most ranks one fused kernel serves (its arguments are fixed-size arrays).
constexpr int kMaxFusedRanks = 8;
// An alltoall has one span per (sender, receiver) pair.
constexpr int kMaxFusedSpans = kMaxFusedRanks * kMaxFusedRanks;

struct FusedSpan {
  uint64_t length;    // elements
  uint64_t inBegin;   // first element read from each input
  uint64_t outBegin;  // first element written in each output
  int8_t order[kMaxFusedRanks];  // the ranks whose inputs are combined, in this order
  int8_t terms;       // how many of order (1: a copy)
  int8_t writer;      // -1: every rank's output; else that rank's only
  int8_t head;        // elements before the 16-byte aligned middle; -1: none aligned
  int8_t owner;       // split (several GPUs): the rank whose kernel runs it; -1: any (shared out)
};

// Everything the kernel needs, passed by value (well under the 4 KiB limit
// on kernel arguments).
struct FusedArgs {
  int ranks = 0;
  int spanCount = 0;
  int divisor = 0;  // AVG: the rank count, else 0 (no division)
  // Each rank's input and output, in the leader's address space (they may be
  // the same memory: everything of an element is read before it is written).
  const void* inputs[kMaxFusedRanks] = {};
  void* outputs[kMaxFusedRanks] = {};
  FusedSpan spans[kMaxFusedSpans] = {};
  // Nonzero: the group was aborted (a rank missed its deadline); skip the work.
  const volatile uint32_t* abort = nullptr;
};
static_assert(sizeof(FusedArgs) <= 4096, "FusedArgs must fit CUDA's 4 KiB of kernel arguments");

// 16 bytes of elements, loaded and stored at once where the pointers allow.
struct alignas(16) FusedVector {
  uint32_t words[4];
};

// ---------------------------------------------------------------- span lists

// Part k of `length` elements cut in `parts` even parts (the first length %
// parts one longer), as the ring cuts a buffer into chunks (ring.h).
inline uint64_t evenPartBegin(uint64_t length, uint64_t parts, uint64_t k) {
  return k * (length / parts) + (k < length % parts ? k : length % parts);
}
inline uint64_t evenPartLength(uint64_t length, uint64_t parts, uint64_t k) {
  return length / parts + (k < length % parts ? 1 : 0);
}

// Allreduce of `count` elements in place: small, every element is combined in
// rank order (the host's one-round path); otherwise chunk c of the ring's
// even split is combined starting from the rank after ring position c, as
// the ring's reduce-scatter does. ringRank(p): the rank at ring position p
// (p taken modulo ranks). Every rank gets every result.
template <typename RingRank>
std::vector<FusedSpan> allreduceSpans(uint64_t count, int ranks, bool small, RingRank ringRank) {
  std::vector<FusedSpan> spans;
  const uint64_t n = static_cast<uint64_t>(ranks);
  for (uint64_t c = 0; c < (small ? 1 : n); ++c) {
    FusedSpan span{};
    const uint64_t begin = small ? 0 : evenPartBegin(count, n, c);
    span.length = small ? count : evenPartLength(count, n, c);
    span.inBegin = span.outBegin = begin;
    span.terms = static_cast<int8_t>(ranks);
    span.writer = -1;
    span.owner = static_cast<int8_t>(small ? -1 : ringRank(static_cast<int>(c)));
    for (int k = 0; k < ranks; ++k) {
      span.order[k] = static_cast<int8_t>(small ? k : ringRank(static_cast<int>(c) + k + 1));
    }
    if (span.length > 0) spans.push_back(span);
  }
  return spans;
}

// Reduce to `root`: the allreduce's ring spans (the host path reduces to a
// root by the ring's reduce-scatter at every size), written to the root only.
template <typename RingRank>
std::vector<FusedSpan> reduceSpans(uint64_t count, int ranks, int root, RingRank ringRank) {
  std::vector<FusedSpan> spans = allreduceSpans(count, ranks, /*small=*/false, ringRank);
  for (FusedSpan& span : spans) span.writer = static_cast<int8_t>(root);
  return spans;
}

// Reduce-scatter of blocks of `count` elements: rank r's output is block r of
// every input, combined from the rank after r's ring position on (the host
// path's order). ringPos(r): rank r's ring position.
template <typename RingRank, typename RingPos>
std::vector<FusedSpan> reduceScatterSpans(uint64_t count, int ranks, RingRank ringRank,
                                          RingPos ringPos) {
  std::vector<FusedSpan> spans;
  for (int r = 0; r < ranks && count > 0; ++r) {
    FusedSpan span{};
    span.length = count;
    span.inBegin = static_cast<uint64_t>(r) * count;
    span.outBegin = 0;
    span.terms = static_cast<int8_t>(ranks);
    span.writer = span.owner = static_cast<int8_t>(r);
    for (int k = 0; k < ranks; ++k) {
      span.order[k] = static_cast<int8_t>(ringRank(ringPos(r) + k + 1));
    }
    spans.push_back(span);
  }
  return spans;
}

// Allgather of `count` elements per rank: rank r's input lands at block r of
// every output.
inline std::vector<FusedSpan> allgatherSpans(uint64_t count, int ranks) {
  std::vector<FusedSpan> spans;
  for (int r = 0; r < ranks && count > 0; ++r) {
    FusedSpan span{};
    span.length = count;
    span.inBegin = 0;
    span.outBegin = static_cast<uint64_t>(r) * count;
    span.order[0] = span.owner = static_cast<int8_t>(r);
    span.terms = 1;
    span.writer = -1;
    spans.push_back(span);
  }
  return spans;
}

// Broadcast of `count` elements from root into every rank's output.
inline std::vector<FusedSpan> broadcastSpans(uint64_t count, int root) {
  if (count == 0) return {};
  FusedSpan span{};
  span.length = count;
  span.order[0] = static_cast<int8_t>(root);
  span.terms = 1;
  span.writer = -1;
  span.owner = -1;
  return {span};
}

// Alltoall in bytes: bytes[s][r] go from rank s's input to rank r's output,
// each rank's sends one after another in rank order, and each rank's
// receipts likewise. Each receiver's kernel owns what it receives.
inline std::vector<FusedSpan> alltoallSpans(const std::vector<std::vector<uint64_t>>& bytes) {
  const int ranks = static_cast<int>(bytes.size());
  std::vector<FusedSpan> spans;
  for (int r = 0; r < ranks; ++r) {
    uint64_t outBegin = 0;
    for (int s = 0; s < ranks; ++s) {
      const std::vector<uint64_t>& sends = bytes[static_cast<size_t>(s)];
      FusedSpan span{};
      span.length = sends[static_cast<size_t>(r)];
      for (int k = 0; k < r; ++k) span.inBegin += sends[static_cast<size_t>(k)];
      span.outBegin = outBegin;
      span.order[0] = static_cast<int8_t>(s);
      span.terms = 1;
      span.writer = span.owner = static_cast<int8_t>(r);
      outBegin += span.length;
      if (span.length > 0) spans.push_back(span);
    }
  }
  return spans;
}

// The spans `rank`'s kernel runs when every rank runs its share (split): those
// it owns, and its part of each unowned span (cut in `ranks` even parts; each
// element keeps its order, so the bits do not change).
inline std::vector<FusedSpan> shareOf(const std::vector<FusedSpan>& spans, int rank, int ranks) {
  std::vector<FusedSpan> mine;
  for (const FusedSpan& span : spans) {
    if (span.owner == rank) mine.push_back(span);
    if (span.owner >= 0) continue;
    const uint64_t n = static_cast<uint64_t>(ranks);
    const uint64_t k = static_cast<uint64_t>(rank);
    const uint64_t begin = evenPartBegin(span.length, n, k);
    FusedSpan part = span;
    part.length = evenPartLength(span.length, n, k);
    part.inBegin += begin;
    part.outBegin += begin;
    part.owner = static_cast<int8_t>(rank);
    if (part.length > 0) mine.push_back(part);
  }
  return mine;
}

// Sets each span's head: the elements before every pointer it touches is
// 16-byte aligned, or -1 when they are not aligned alike (element by element).
inline void alignSpans(FusedArgs& args, size_t elementBytes) {
  for (int s = 0; s < args.spanCount; ++s) {
    FusedSpan& span = args.spans[s];
    const uint64_t inAt = span.inBegin * elementBytes;
    const uint64_t outAt = span.outBegin * elementBytes;
    const uint64_t misaligned =
        (reinterpret_cast<uintptr_t>(args.inputs[span.order[0]]) + inAt) % sizeof(FusedVector);
    bool alike = misaligned % elementBytes == 0;
    for (int k = 0; k < span.terms; ++k) {
      alike = alike &&
              (reinterpret_cast<uintptr_t>(args.inputs[span.order[k]]) + inAt) % sizeof(FusedVector) ==
                  misaligned;
    }
    for (int r = 0; r < args.ranks; ++r) {
      if (span.writer >= 0 && r != span.writer) continue;
      alike = alike &&
              (reinterpret_cast<uintptr_t>(args.outputs[r]) + outAt) % sizeof(FusedVector) == misaligned;
    }
    const uint64_t head = misaligned == 0 ? 0 : (sizeof(FusedVector) - misaligned) / elementBytes;
    span.head = alike ? static_cast<int8_t>(head < span.length ? head : span.length) : int8_t{-1};
  }
}

// ---------------------------------------------------------------- the work

// Element i of a span (counted from its begin).
template <typename T, typename Op>
RD_HOST_DEVICE void fusedElement(const FusedArgs& args, const FusedSpan& span, uint64_t i) {
  using S = typename elementwise::Storage<T>::type;
  S acc = static_cast<const S*>(args.inputs[span.order[0]])[span.inBegin + i];
  for (int k = 1; k < span.terms; ++k) {
    acc = elementwise::apply<T, Op>(acc, static_cast<const S*>(args.inputs[span.order[k]])[span.inBegin + i]);
  }
  if (args.divisor > 1) acc = elementwise::divide<T>(acc, args.divisor);
  for (int r = 0; r < args.ranks; ++r) {
    if (span.writer < 0 || r == span.writer) static_cast<S*>(args.outputs[r])[span.outBegin + i] = acc;
  }
}

// The 16 bytes at element i of a span (i past its head, so aligned): the same
// arithmetic lane by lane. Lanes go through memcpy, never a cast.
template <typename T, typename Op>
RD_HOST_DEVICE void fusedVector(const FusedArgs& args, const FusedSpan& span, uint64_t i) {
  using S = typename elementwise::Storage<T>::type;
  constexpr int kLanes = sizeof(FusedVector) / sizeof(S);
  auto load = [&](int rank, S* lanes) {
    const FusedVector v = *reinterpret_cast<const FusedVector*>(
        static_cast<const S*>(args.inputs[rank]) + span.inBegin + i);
    std::memcpy(lanes, &v, sizeof(v));
  };
  S acc[kLanes];
  load(span.order[0], acc);
  for (int k = 1; k < span.terms; ++k) {
    S other[kLanes];
    load(span.order[k], other);
    for (int j = 0; j < kLanes; ++j) acc[j] = elementwise::apply<T, Op>(acc[j], other[j]);
  }
  if (args.divisor > 1) {
    for (int j = 0; j < kLanes; ++j) acc[j] = elementwise::divide<T>(acc[j], args.divisor);
  }
  FusedVector result;
  std::memcpy(&result, acc, sizeof(result));
  for (int r = 0; r < args.ranks; ++r) {
    if (span.writer < 0 || r == span.writer) {
      *reinterpret_cast<FusedVector*>(static_cast<S*>(args.outputs[r]) + span.outBegin + i) = result;
    }
  }
}

// The whole of one span, shared among `workers` workers of which this is
// `worker` (a GPU thread of the grid; the CPU run is one worker): the head
// and tail element by element, the aligned middle 16 bytes at a time.
template <typename T, typename Op>
RD_HOST_DEVICE void fusedSpan(const FusedArgs& args, const FusedSpan& span, uint64_t worker,
                              uint64_t workers) {
  using S = typename elementwise::Storage<T>::type;
  constexpr uint64_t kLanes = sizeof(FusedVector) / sizeof(S);
  const uint64_t head = span.head < 0 ? span.length : static_cast<uint64_t>(span.head);
  const uint64_t vectors = (span.length - head) / kLanes;
  const uint64_t tail = head + vectors * kLanes;
  for (uint64_t i = worker; i < head; i += workers) fusedElement<T, Op>(args, span, i);
  for (uint64_t v = worker; v < vectors; v += workers) fusedVector<T, Op>(args, span, head + v * kLanes);
  for (uint64_t i = tail + worker; i < span.length; i += workers) fusedElement<T, Op>(args, span, i);
}

}  // namespace ringdist
