#pragma once

// Full codec blocks (kCodecBlock values) with the vector family's intrinsics:
// AVX2+F16C on x86-64, NEON on aarch64. The same arithmetic as the portable
// kernels in codec.cc, written with intrinsics because the compiler
// vectorises neither the float -> int8 narrowing nor the float16 loops on its
// own. Each family defines, in namespace ringdist::vec:
//   stats(x)                       max |x| and whether every x is finite
//   int8Quantise(x, inverse, q)    q = clamp(round-half-even(x * inverse), +-127)
//   int8Decode<kAdd>(q, scale, o)  o (+)= q * scale
//   fp16Scale(x, up, h)            h = float16(x * up), to nearest even
//   fp16Decode<kAdd>(h, scale, o)  o (+)= float(h) * scale
// Products and sums round separately (no fused multiply-add), as the portable
// code compiled with -ffp-contract=off. Out of line (one call per block): an
// always-inline function with a target attribute cannot be inlined into the
// portable templates.

#include <cstddef>
#include <cstdint>

#include "csrc/codec/codec.h"
#include "csrc/common/cpu.h"

#if defined(RINGDIST_X86)
#include <immintrin.h>
#elif defined(RINGDIST_ARM)
#include <arm_neon.h>
#endif

namespace ringdist {

struct BlockStats {
  float maxAbs;
  bool finite;
};

namespace vec {

#if defined(RINGDIST_X86)

#define RD_VECTOR_TARGET __attribute__((target("avx2,fma,f16c")))

RD_VECTOR_TARGET inline BlockStats stats(const float* x) {
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  __m256 m0 = zero, m1 = zero, bad0 = zero, bad1 = zero;
  for (size_t i = 0; i < kCodecBlock; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i);
    __m256 b = _mm256_loadu_ps(x + i + 8);
    m0 = _mm256_max_ps(m0, _mm256_and_ps(a, absMask));
    m1 = _mm256_max_ps(m1, _mm256_and_ps(b, absMask));
    bad0 = _mm256_add_ps(bad0, _mm256_mul_ps(a, zero));  // NaN iff a NaN or inf was seen
    bad1 = _mm256_add_ps(bad1, _mm256_mul_ps(b, zero));
  }
  __m256 m = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  __m256 bad = _mm256_add_ps(bad0, bad1);
  int finite = _mm256_movemask_ps(_mm256_cmp_ps(bad, zero, _CMP_EQ_OQ));
  return BlockStats{_mm_cvtss_f32(h), finite == 0xff};
}

RD_VECTOR_TARGET inline void int8Quantise(const float* x, float inv, int8_t* q) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 hi = _mm256_set1_ps(127.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f);
  // packs interleaves 128-bit lanes; this puts the 4-byte groups back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t i = 0; i < kCodecBlock; i += 32) {
    __m256i w[4];
    for (int j = 0; j < 4; ++j) {
      // vroundps on the rounded product: no fused multiply-add can skip
      // the product's rounding, so this is exactly round(x * inv).
      __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vinv),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      w[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    }
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]),
                                       _mm256_packs_epi32(w[2], w[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
}

template <bool kAdd>
RD_VECTOR_TARGET inline void int8Decode(const int8_t* q, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    if (kAdd) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
}

RD_VECTOR_TARGET inline void fp16Scale(const float* x, float up, char* out) {
  const __m256 vup = _mm256_set1_ps(up);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), vup),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
}

template <bool kAdd>
RD_VECTOR_TARGET inline void fp16Decode(const char* in, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m256 v = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))), s);
    if (kAdd) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
}

#elif defined(RINGDIST_ARM)

// NEON is part of the base architecture: no target attribute needed.
#define RD_VECTOR_TARGET

inline BlockStats stats(const float* x) {
  const float32x4_t zero = vdupq_n_f32(0.0f);
  float32x4_t m0 = zero, m1 = zero, bad0 = zero, bad1 = zero;
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    float32x4_t a = vld1q_f32(x + i);
    float32x4_t b = vld1q_f32(x + i + 4);
    m0 = vmaxq_f32(m0, vabsq_f32(a));
    m1 = vmaxq_f32(m1, vabsq_f32(b));
    bad0 = vaddq_f32(bad0, vmulq_f32(a, zero));  // NaN iff a NaN or inf was seen
    bad1 = vaddq_f32(bad1, vmulq_f32(b, zero));
  }
  const uint32x4_t clean = vceqq_f32(vaddq_f32(bad0, bad1), zero);
  return BlockStats{vmaxvq_f32(vmaxq_f32(m0, m1)), vminvq_u32(clean) == 0xffffffffu};
}

inline void int8Quantise(const float* x, float inv, int8_t* q) {
  const float32x4_t vinv = vdupq_n_f32(inv);
  const float32x4_t hi = vdupq_n_f32(127.0f);
  const float32x4_t lo = vdupq_n_f32(-127.0f);
  for (size_t i = 0; i < kCodecBlock; i += 16) {
    int32x4_t w[4];
    for (int j = 0; j < 4; ++j) {
      // frintn: round to nearest, ties to even, of the rounded product. A NaN
      // product (non-finite block) stays NaN through min/max and converts to 0.
      float32x4_t v = vrndnq_f32(vmulq_f32(vld1q_f32(x + i + 4 * j), vinv));
      w[j] = vcvtq_s32_f32(vminq_f32(vmaxq_f32(v, lo), hi));
    }
    int16x8_t low = vcombine_s16(vqmovn_s32(w[0]), vqmovn_s32(w[1]));
    int16x8_t high = vcombine_s16(vqmovn_s32(w[2]), vqmovn_s32(w[3]));
    vst1q_s8(q + i, vcombine_s8(vqmovn_s16(low), vqmovn_s16(high)));
  }
}

template <bool kAdd>
inline void int8Decode(const int8_t* q, float scale, float* out) {
  const float32x4_t s = vdupq_n_f32(scale);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    int16x8_t wide = vmovl_s8(vld1_s8(q + i));
    float32x4_t v[2] = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))),
                        vcvtq_f32_s32(vmovl_s16(vget_high_s16(wide)))};
    for (int j = 0; j < 2; ++j) {
      float32x4_t r = vmulq_f32(v[j], s);
      if (kAdd) r = vaddq_f32(vld1q_f32(out + i + 4 * j), r);
      vst1q_f32(out + i + 4 * j, r);
    }
  }
}

inline void fp16Scale(const float* x, float up, char* out) {
  const float32x4_t vup = vdupq_n_f32(up);
  auto* h = reinterpret_cast<uint16_t*>(out);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    float16x4_t low = vcvt_f16_f32(vmulq_f32(vld1q_f32(x + i), vup));
    float16x8_t both = vcvt_high_f16_f32(low, vmulq_f32(vld1q_f32(x + i + 4), vup));
    vst1q_u16(h + i, vreinterpretq_u16_f16(both));
  }
}

template <bool kAdd>
inline void fp16Decode(const char* in, float scale, float* out) {
  const float32x4_t s = vdupq_n_f32(scale);
  const auto* h = reinterpret_cast<const uint16_t*>(in);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    float16x8_t halves = vreinterpretq_f16_u16(vld1q_u16(h + i));
    float32x4_t v[2] = {vcvt_f32_f16(vget_low_f16(halves)), vcvt_high_f32_f16(halves)};
    for (int j = 0; j < 2; ++j) {
      float32x4_t r = vmulq_f32(v[j], s);
      if (kAdd) r = vaddq_f32(vld1q_f32(out + i + 4 * j), r);
      vst1q_f32(out + i + 4 * j, r);
    }
  }
}

#endif

}  // namespace vec
}  // namespace ringdist
