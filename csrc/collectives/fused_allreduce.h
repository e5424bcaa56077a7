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

}  // namespace ringdist
