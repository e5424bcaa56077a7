// Top-k selection and scatter for the `topk` DDP hook (terms in topk.h). These
// are hook kernels, not a wire codec: the hook all-gathers their output.
//
// Selection without sorting the bucket:
//   pass 1  x = grad + residual, written into the residual; every
//           kSampleStride-th magnitude is copied into a sample.
//   cut     the sample's q-th largest magnitude, q a little above the sample's
//           share of k, is a threshold that about kSlack * k entries reach.
//   pass 2  every entry at or above the threshold is a candidate (index order).
//   exact   nth_element over the candidates finds the k-th best (magnitude,
//           lower index first); a pass over the candidates, still in index
//           order, keeps exactly those at or above it. Too few candidates (an
//           unlucky sample) lowers the threshold and scans again.
// Every entry above the threshold is a candidate and at least k are, so the
// result is the exact top k, whatever the sample.
#include "csrc/topk/topk.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/topk/topk_math.h"

#if defined(RINGDIST_X86)
#include <immintrin.h>
#elif defined(RINGDIST_ARM)
#include <arm_neon.h>
#endif

#define RD_INLINE inline __attribute__((always_inline))

namespace ringdist {

namespace {

// One sampled magnitude per 64 entries: the sample costs 1/64 of a pass to
// order, and still holds thousands of values for a 1% cut of a 1 MB bucket.
constexpr size_t kSampleStride = 64;
// The threshold aims at kSlack * k candidates plus kSampleExtra sample steps,
// so a sample that misjudges the cut by a few percent still leaves >= k.
constexpr double kSlack = 1.25;
constexpr size_t kSampleExtra = 4;
// Below this many entries the sample is too small to trust: all are candidates.
constexpr size_t kMinSampled = 1 << 15;

RD_INLINE uint32_t magnitude(const float* x, size_t i) { return topkmath::magnitudeKey(x[i]); }

// Larger packs are better: magnitude first, then the lower index. Unique.
RD_INLINE uint64_t pack(uint32_t mag, size_t i) {
  return (static_cast<uint64_t>(mag) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

RD_INLINE uint32_t unpackIndex(uint64_t p) {
  return 0xffffffffu - static_cast<uint32_t>(p & 0xffffffffu);
}

// Pass 1: residual += grad block by block, sampling each block's first entry.
RD_INLINE void addAndSample(const float* grad, float* residual, size_t n, uint32_t* sample) {
  size_t s = 0;
  for (size_t b = 0; b < n; b += kSampleStride) {
    size_t m = std::min(kSampleStride, n - b);
    float* r = residual + b;
    const float* g = grad + b;
    for (size_t j = 0; j < m; ++j) r[j] += g[j];
    sample[s++] = magnitude(r, 0);
  }
}

RD_INLINE void onlySample(const float* x, size_t n, uint32_t* sample) {
  size_t s = 0;
  for (size_t b = 0; b < n; b += kSampleStride) sample[s++] = magnitude(x, b);
}

// Pass 2 over [begin, end), portable: candidates (magnitude >= threshold)
// appended to out in index order; returns how many.
RD_INLINE size_t scanGeneric(const float* x, size_t begin, size_t end, uint32_t threshold,
                             uint64_t* out) {
  size_t c = 0;
  for (size_t i = begin; i < end; ++i) {
    uint32_t mag = magnitude(x, i);
    if (mag >= threshold) out[c++] = pack(mag, i);
  }
  return c;
}

#if defined(RINGDIST_X86)
// Pass 2, AVX2: compare eight magnitudes at once and branch only on hits
// (about 1 in 80 entries for a 1% cut). Magnitudes are below 2^31, so a
// signed compare orders them.
__attribute__((target("avx2"))) size_t scanVector(const float* x, size_t begin, size_t end,
                                                 uint32_t threshold, uint64_t* out) {
  const __m256i absMask = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(threshold) - 1);
  size_t c = 0;
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256i mag = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                   absMask);
    auto hits = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(mag, below))));
    while (hits != 0) {
      size_t j = i + static_cast<size_t>(__builtin_ctz(hits));
      hits &= hits - 1;
      out[c++] = pack(magnitude(x, j), j);
    }
  }
  return c + scanGeneric(x, i, end, threshold, out + c);
}

// Pass 1 with AVX2 code for the residual update.
__attribute__((target("avx2,fma"))) void addAndSampleVector(const float* g, float* r, size_t n,
                                                            uint32_t* sample) {
  addAndSample(g, r, n, sample);
}
#elif defined(RINGDIST_ARM)
// Pass 2, NEON: test eight magnitudes at once and look at them one by one
// only when one reaches the threshold (about 1 in 80 entries for a 1% cut).
size_t scanVector(const float* x, size_t begin, size_t end, uint32_t threshold, uint64_t* out) {
  const uint32x4_t absMask = vdupq_n_u32(0x7fffffffu);
  const uint32x4_t cut = vdupq_n_u32(threshold);
  const auto* bits = reinterpret_cast<const uint32_t*>(x);
  size_t c = 0;
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    uint32x4_t a = vandq_u32(vld1q_u32(bits + i), absMask);
    uint32x4_t b = vandq_u32(vld1q_u32(bits + i + 4), absMask);
    if (vmaxvq_u32(vorrq_u32(vcgeq_u32(a, cut), vcgeq_u32(b, cut))) != 0) {
      c += scanGeneric(x, i, i + 8, threshold, out + c);
    }
  }
  return c + scanGeneric(x, i, end, threshold, out + c);
}

// NEON is the base architecture's: the portable pass is already vectorised.
void addAndSampleVector(const float* g, float* r, size_t n, uint32_t* sample) {
  addAndSample(g, r, n, sample);
}
#else
// No vector family on this architecture (useVectorKernels() is false).
size_t scanVector(const float* x, size_t begin, size_t end, uint32_t threshold, uint64_t* out) {
  return scanGeneric(x, begin, end, threshold, out);
}

void addAndSampleVector(const float* g, float* r, size_t n, uint32_t* sample) {
  addAndSample(g, r, n, sample);
}
#endif

// Pass 2 over the whole bucket into cand (grown as needed, a block at a time
// so the kernels need no bounds checks).
size_t scan(bool vector, const float* x, size_t n, uint32_t threshold,
            std::vector<uint64_t>& cand) {
  constexpr size_t kScanBlock = 4096;
  size_t c = 0;
  for (size_t b = 0; b < n; b += kScanBlock) {
    size_t e = std::min(n, b + kScanBlock);
    if (cand.size() < c + (e - b)) cand.resize(std::max(2 * cand.size(), c + (e - b)));
    c += vector ? scanVector(x, b, e, threshold, cand.data() + c)
                : scanGeneric(x, b, e, threshold, cand.data() + c);
  }
  return c;
}

void addAndSampleGeneric(const float* g, float* r, size_t n, uint32_t* sample) {
  addAndSample(g, r, n, sample);
}

}  // namespace

void topkSelect(const float* grad, float* residual, size_t n, size_t k, float* values,
                int32_t* indices) {
  RINGDIST_CHECK(k <= n && n < (size_t{1} << 31), "ringdist topk: k = ", k, " of n = ", n,
                 " (need k <= n < 2^31)");
  const bool vector = useVectorKernels();
  const float* x = residual != nullptr ? residual : grad;
  const size_t samples = (n + kSampleStride - 1) / kSampleStride;
  // Kept per thread: the hook runs on DDP's autograd thread every step.
  thread_local std::vector<uint32_t> sample;
  thread_local std::vector<uint64_t> cand;
  sample.resize(samples);
  if (residual != nullptr) {
    (vector ? addAndSampleVector : addAndSampleGeneric)(grad, residual, n, sample.data());
  } else {
    onlySample(x, n, sample.data());
  }
  if (k == 0) {
    return;
  }
  if (k == n) {  // everything is sent
    for (size_t i = 0; i < n; ++i) {
      values[i] = x[i];
      indices[i] = static_cast<int32_t>(i);
    }
    if (residual != nullptr) std::memset(residual, 0, n * sizeof(float));
    return;
  }

  // Sample rank of the cut: kSlack times the sample's share of k, plus a margin.
  size_t q = n < kMinSampled ? samples
                             : static_cast<size_t>(kSlack * static_cast<double>(k) *
                                                   static_cast<double>(samples) /
                                                   static_cast<double>(n)) + kSampleExtra;
  size_t count = 0;
  for (;;) {
    uint32_t threshold = 0;
    if (q < samples) {
      std::nth_element(sample.begin(), sample.begin() + static_cast<ptrdiff_t>(q), sample.end(),
                       std::greater<uint32_t>());
      threshold = sample[q];
    }
    count = scan(vector, x, n, threshold, cand);
    if (count >= k) break;
    q *= 4;  // the sample overestimated the cut: lower the threshold
  }

  // Exact cut among the candidates, then keep them in index order.
  thread_local std::vector<uint64_t> order;
  order.assign(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(count));
  std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(k - 1), order.end(),
                   std::greater<uint64_t>());
  const uint64_t kth = order[k - 1];
  size_t out = 0;
  for (size_t c = 0; c < count; ++c) {
    if (cand[c] >= kth) {
      uint32_t i = unpackIndex(cand[c]);
      values[out] = x[i];
      indices[out] = static_cast<int32_t>(i);
      ++out;
    }
  }
  if (residual != nullptr) {
    for (size_t j = 0; j < k; ++j) residual[indices[j]] = 0.0f;  // sent: leaves the residual
  }
  // A bucket of mostly equal magnitudes (zeros) makes every entry a
  // candidate: do not keep that much memory for the next call.
  if (cand.size() > 4 * k + (size_t{1} << 20)) {
    cand = {};
    order = {};
  }
}

void topkScatter(const float* parts, size_t world, size_t k, size_t n, float* out) {
  std::memset(out, 0, n * sizeof(float));
  const float divisor = static_cast<float>(world);
  for (size_t r = 0; r < world; ++r) {
    const float* values = parts + r * 2 * k;
    const auto* idx = reinterpret_cast<const int32_t*>(values + k);
    for (size_t j = 0; j < k; ++j) {
      auto i = static_cast<uint32_t>(idx[j]);
      RINGDIST_CHECK(i < n, "ringdist topk: rank ", r, " sent index ", idx[j],
                     " for a bucket of ", n, " entries");
      out[i] = topkmath::scatterAdd(out[i], values[j], divisor);
    }
  }
}

}  // namespace ringdist
