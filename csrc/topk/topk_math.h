#pragma once

// The arithmetic of the top-k hook (terms in topk.h), written once for the CPU
// kernels (csrc/topk/topk.cc), the GPU kernels (csrc/gpu/cuda/topk.cu) and the
// CPU rehearsal of the GPU algorithm (_C.testing.topk_radix_select), which
// tests/test_topk_ops.py checks against the CPU kernels on every machine.
//
// The GPU selects by radix select instead of the CPU's sample and sort:
//   key        an entry's magnitude as 31 bits (magnitudeKey); larger key,
//              larger magnitude, NaN above infinity.
//   pass       kRadixPasses passes, each deciding one digit of the key of the
//              k-th largest entry (the cut), from the high digit down.
//   state      the digits decided so far (prefix) and how many entries are
//              still to be taken among those whose key starts with them
//              (remaining); entries above the prefix are all taken.
//   histogram  per pass, the count of each digit among the entries in the
//              prefix; the digit that holds the cut (holdsCut) extends it.
// After the last pass the prefix is the cut's key (threshold): every entry
// above it is selected, and of the entries equal to it the `remaining` ones
// with the lowest indices (ties to the lower index, as on the CPU).

#include <cstdint>

#include "csrc/reduce/elementwise.h"

namespace ringdist {
namespace topkmath {

RD_HOST_DEVICE uint32_t magnitudeKey(float x) { return elementwise::floatBits(x) & 0x7fffffffu; }

// 31 key bits in digits of 11, 11 and 9 bits: a histogram of 2048 counters
// fits a GPU block's shared memory, and three passes read the bucket thrice.
constexpr int kRadixPasses = 3;
constexpr uint32_t kMaxRadixBins = 2048;

RD_HOST_DEVICE int radixShift(int pass) { return pass == 0 ? 20 : (pass == 1 ? 9 : 0); }
RD_HOST_DEVICE uint32_t radixBins(int pass) { return pass == 2 ? 512u : 2048u; }

RD_HOST_DEVICE uint32_t radixDigit(uint32_t key, int pass) {
  return (key >> radixShift(pass)) & (radixBins(pass) - 1);
}

// The key bits the passes before `pass` decided.
RD_HOST_DEVICE uint32_t decidedMask(int pass) {
  if (pass == 0) return 0u;
  const int shift = radixShift(pass - 1);
  return (0x7fffffffu >> shift) << shift;
}

struct RadixState {
  uint32_t prefix;     // decided digits, in place
  uint32_t remaining;  // entries still to take among those in the prefix
};

RD_HOST_DEVICE bool inPrefix(uint32_t key, RadixState s, int pass) {
  return (key & decidedMask(pass)) == s.prefix;
}

// Digit d holds the cut when the entries of the prefix with a larger digit
// (above) are fewer than remaining, and with d's own (count) at least as many.
RD_HOST_DEVICE bool holdsCut(uint32_t above, uint32_t count, uint32_t remaining) {
  return above < remaining && above + count >= remaining;
}

RD_HOST_DEVICE RadixState narrowTo(RadixState s, int pass, uint32_t digit, uint32_t above) {
  return {s.prefix | (digit << radixShift(pass)), s.remaining - above};
}

// After the last pass (threshold = prefix, takeEqual = remaining): whether the
// entry with this key is selected, given how many entries equal to the
// threshold come before it in index order.
RD_HOST_DEVICE bool selected(uint32_t key, uint32_t threshold, uint32_t equalBefore,
                             uint32_t takeEqual) {
  return key > threshold || (key == threshold && equalBefore < takeEqual);
}

// How many of a tile's `equal` entries equal to the threshold are taken when
// `equalBefore` such entries come before the tile.
RD_HOST_DEVICE uint32_t equalTaken(uint32_t equalBefore, uint32_t equal, uint32_t takeEqual) {
  if (equalBefore >= takeEqual) return 0;
  const uint32_t left = takeEqual - equalBefore;
  return equal < left ? equal : left;
}

// One rank's entry added into the dense result: value / world, then the sum.
RD_HOST_DEVICE float scatterAdd(float acc, float value, float world) { return acc + value / world; }

}  // namespace topkmath
}  // namespace ringdist
