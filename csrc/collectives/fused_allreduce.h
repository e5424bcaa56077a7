#pragma once

// The one-pass allreduce among ranks that share one GPU
// (same_gpu_allreduce.h): one kernel, queued by the group's leader, reads every
// rank's tensor and writes the result into every rank's tensor, so the
// device moves 2·P·S bytes and nothing else. Each element is combined in the
// order the host path combines it (the same rule as device_allreduce.cc),
// so the results are bit for bit the CPU path's. Written once here for the
// CUDA kernel (csrc/cuda/fused.cu) and for the CPU run of the same element
// code that tests check against the engine.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "csrc/reduce/elementwise.h"

namespace ringdist {

// Most ranks one fused kernel serves (its arguments are fixed-size arrays).
constexpr int kMaxFusedRanks = 8;

// Elements [begin, end) are all combined in the same rank order.
struct FusedSpan {
  uint64_t begin;
  uint64_t end;
  int8_t order[kMaxFusedRanks];
};

// Everything the kernel needs, passed by value (well under the 4 KiB limit
// on kernel arguments).
struct FusedArgs {
  int ranks = 0;
  int spanCount = 0;
  int divisor = 0;  // AVG: the rank count, else 0 (no division)
  int vectors = 0;  // 1: every data pointer is 16-byte aligned (16-byte loads and stores)
  void* data[kMaxFusedRanks] = {};  // each rank's tensor (read, then written), in the leader's address space
  FusedSpan spans[kMaxFusedRanks] = {};
  // Nonzero: the group was aborted (a rank missed its deadline); skip the work.
  const volatile uint32_t* abort = nullptr;
};

// The spans of a `count`-element allreduce among `ranks` ranks. small: the
// host path combines every element in rank order (oneRoundAllreduce);
// otherwise chunk c (the ring's even split) is combined starting from the
// rank after ring position c, as the ring's reduce-scatter does. ringRank(p)
// is the rank at ring position p (p taken modulo ranks).
template <typename RingRank>
std::vector<FusedSpan> fusedSpans(uint64_t count, int ranks, bool small, RingRank ringRank) {
  std::vector<FusedSpan> spans;
  const uint64_t n = static_cast<uint64_t>(ranks);
  const uint64_t base = count / n;
  const uint64_t extra = count % n;
  for (uint64_t c = 0; c < (small ? 1 : n); ++c) {
    FusedSpan span{};
    span.begin = small ? 0 : c * base + (c < extra ? c : extra);
    span.end = small ? count : span.begin + base + (c < extra ? 1 : 0);
    for (int k = 0; k < ranks; ++k) {
      span.order[k] = static_cast<int8_t>(small ? k : ringRank(static_cast<int>(c) + k + 1));
    }
    if (span.end > span.begin) spans.push_back(span);
  }
  return spans;
}

// Element i of a span: combined from every rank in the span's order, divided
// for AVG, and written to every rank. Reads all before writing any, so it is
// safe in place.
template <typename T, typename Op>
RD_HOST_DEVICE void fusedElement(const FusedArgs& args, const FusedSpan& span, uint64_t i) {
  using S = typename elementwise::Storage<T>::type;
  S acc = static_cast<const S*>(args.data[span.order[0]])[i];
  for (int k = 1; k < args.ranks; ++k) {
    acc = elementwise::apply<T, Op>(acc, static_cast<const S*>(args.data[span.order[k]])[i]);
  }
  if (args.divisor > 1) acc = elementwise::divide<T>(acc, args.divisor);
  for (int r = 0; r < args.ranks; ++r) static_cast<S*>(args.data[r])[i] = acc;
}

// 16 bytes of elements, loaded and stored at once where the pointers allow.
struct alignas(16) FusedVector {
  uint32_t words[4];
};

// Elements [16/sizeof(S) * v, ...) of a span's aligned middle: the same
// arithmetic as fusedElement, lane by lane.
template <typename T, typename Op>
RD_HOST_DEVICE void fusedVector(const FusedArgs& args, const FusedSpan& span, uint64_t v) {
  using S = typename elementwise::Storage<T>::type;
  constexpr int kLanes = sizeof(FusedVector) / sizeof(S);
  // Lanes go through memcpy (one 16-byte load or store each), never a cast.
  S acc[kLanes];
  FusedVector loaded = static_cast<const FusedVector*>(args.data[span.order[0]])[v];
  std::memcpy(acc, &loaded, sizeof(loaded));
  for (int k = 1; k < args.ranks; ++k) {
    S other[kLanes];
    loaded = static_cast<const FusedVector*>(args.data[span.order[k]])[v];
    std::memcpy(other, &loaded, sizeof(loaded));
    for (int j = 0; j < kLanes; ++j) acc[j] = elementwise::apply<T, Op>(acc[j], other[j]);
  }
  if (args.divisor > 1) {
    for (int j = 0; j < kLanes; ++j) acc[j] = elementwise::divide<T>(acc[j], args.divisor);
  }
  FusedVector result;
  std::memcpy(&result, acc, sizeof(result));
  for (int r = 0; r < args.ranks; ++r) static_cast<FusedVector*>(args.data[r])[v] = result;
}

// The whole of one span, shared among `workers` workers of which this is
// `worker` (a GPU thread in the grid; the CPU run is one worker): the
// unaligned head and tail element by element, the middle 16 bytes at a time.
template <typename T, typename Op>
RD_HOST_DEVICE void fusedSpan(const FusedArgs& args, const FusedSpan& span, uint64_t worker,
                              uint64_t workers) {
  using S = typename elementwise::Storage<T>::type;
  constexpr uint64_t kLanes = sizeof(FusedVector) / sizeof(S);
  uint64_t first = (span.begin + kLanes - 1) / kLanes;  // vectors [first, last)
  uint64_t last = span.end / kLanes;
  if (args.vectors == 0 || first >= last) first = last = span.end;  // element by element
  const uint64_t headEnd = args.vectors == 0 || first == last ? span.end : first * kLanes;
  for (uint64_t i = span.begin + worker; i < headEnd; i += workers) fusedElement<T, Op>(args, span, i);
  for (uint64_t v = first + worker; v < last; v += workers) fusedVector<T, Op>(args, span, v);
  const uint64_t tailBegin = first == last ? span.end : last * kLanes;
  for (uint64_t i = tailBegin + worker; i < span.end; i += workers) fusedElement<T, Op>(args, span, i);
}

}  // namespace ringdist
