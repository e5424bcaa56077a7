// Wire codecs (terms in codec.h). Every kernel is an always-inline template
// instantiated twice, like csrc/reduce: a baseline x86-64 family and an
// AVX2+F16C family, picked once from cpuid. Loops are written so the
// compiler vectorises them: per-lane partial maxima instead of a serial
// reduction, and rounding by adding and subtracting 1.5 * 2^23 instead of
// calling a libm function.
#include "csrc/codec/codec.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/reduce/half.h"

namespace ringdist {

namespace {

constexpr size_t kScaleBytes = sizeof(float);
constexpr size_t kLanes = 8;
// x + kRound - kRound rounds |x| < 2^22 to the nearest integer (ties to even)
// in the default rounding mode, in one vectorisable add/sub pair.
constexpr float kRound = 12582912.0f;
// Blocks whose largest magnitude is below this encode as zeros: 127 / max
// would overflow float32, and such values are far below any gradient scale.
constexpr float kTinyBlock = 1e-30f;

struct BlockStats {
  float maxAbs;
  bool finite;
};

RD_INLINE BlockStats blockStats(const float* x, size_t n) {
  float m[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  // x * 0 is 0 for finite x and NaN for NaN or inf: the lane sums stay 0
  // exactly when the block is finite.
  float bad[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      float a = std::fabs(x[i + j]);
      m[j] = a > m[j] ? a : m[j];
      bad[j] += x[i + j] * 0.0f;
    }
  }
  for (; i < n; ++i) {
    float a = std::fabs(x[i]);
    m[0] = a > m[0] ? a : m[0];
    bad[0] += x[i] * 0.0f;
  }
  float maxAbs = 0;
  float badSum = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    maxAbs = m[j] > maxAbs ? m[j] : maxAbs;
    badSum += bad[j];
  }
  return BlockStats{maxAbs, badSum == 0.0f};
}

// Full int8 and fp16 blocks with AVX2/F16C: the same arithmetic as the
// portable kernels, written with intrinsics because the compiler vectorises
// neither the float -> int8 narrowing nor the _Float16 loops on its own.
// Out-of-line (one call per 256 elements): an always-inline function with a
// target attribute cannot be inlined into the portable templates.
#define RD_AVX2 __attribute__((target("avx2,fma,f16c")))

RD_AVX2 BlockStats blockStatsAvx2(const float* x) {
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

RD_AVX2 void int8QuantiseAvx2(const float* x, float inv, int8_t* q) {
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
RD_AVX2 void int8DecodeAvx2(const int8_t* q, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    if (kAdd) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
}

RD_AVX2 void fp16ScaleAvx2(const float* x, float up, char* out) {
  const __m256 vup = _mm256_set1_ps(up);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), vup),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
}

template <bool kAdd>
RD_AVX2 void fp16DecodeAvx2(const char* in, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < kCodecBlock; i += 8) {
    __m256 v = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))), s);
    if (kAdd) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
}

// Max |x| and finiteness of one block; full blocks take the AVX2 kernel.
template <bool kAvx2>
RD_INLINE BlockStats statsOf(const float* x, size_t n) {
  if constexpr (kAvx2) {
    if (n == kCodecBlock) return blockStatsAvx2(x);
  }
  return blockStats(x, n);
}

// ------------------------------------------------------------------ int8

template <bool kAvx2>
RD_INLINE void int8EncodeBlock(const float* x, size_t n, char* out) {
  const bool full = kAvx2 && n == kCodecBlock;
  const BlockStats st = statsOf<kAvx2>(x, n);
  float scale;
  float inv;
  if (!st.finite) {
    scale = std::numeric_limits<float>::quiet_NaN();
    inv = 0;
  } else if (st.maxAbs < kTinyBlock) {
    scale = 0;
    inv = 0;
  } else {
    scale = st.maxAbs / 127.0f;
    inv = 127.0f / st.maxAbs;
  }
  std::memcpy(out, &scale, kScaleBytes);
  auto* q = reinterpret_cast<int8_t*>(out + kScaleBytes);
  if constexpr (kAvx2) {
    if (full) return int8QuantiseAvx2(x, inv, q);
  }
  for (size_t i = 0; i < n; ++i) {
    float v = x[i] * inv;
    v = (v + kRound) - kRound;
    // |x| <= max, but x * (127 / max) may round a hair above 127.
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(v));
  }
}

template <bool kAdd, bool kAvx2>
RD_INLINE void int8DecodeBlock(const char* in, size_t n, float* out) {
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
  const auto* q = reinterpret_cast<const int8_t*>(in + kScaleBytes);
  if constexpr (kAvx2) {
    if (n == kCodecBlock) return int8DecodeAvx2<kAdd>(q, scale, out);
  }
  for (size_t i = 0; i < n; ++i) {
    float v = static_cast<float>(q[i]) * scale;
    out[i] = kAdd ? out[i] + v : v;
  }
}

// ------------------------------------------------------------------ fp16

template <bool kAvx2>
RD_INLINE void fp16EncodeBlock(const float* x, size_t n, char* out) {
  const bool full = kAvx2 && n == kCodecBlock;
  const BlockStats st = statsOf<kAvx2>(x, n);
  float scale = 1.0f;  // decode multiplier
  float up = 1.0f;     // encode multiplier, 1 / scale (exact: powers of two)
  if (!st.finite) {
    scale = std::numeric_limits<float>::quiet_NaN();
    up = 0;
  } else if (st.maxAbs > 0) {
    int e = 0;
    std::frexp(st.maxAbs, &e);  // maxAbs = m * 2^e, m in [0.5, 1)
    int s = 15 - e;             // maxAbs * 2^s in [2^14, 2^15)
    s = s > 126 ? 126 : s;      // 2^s must stay a normal float32
    up = std::ldexp(1.0f, s);
    scale = std::ldexp(1.0f, -s);
  }
  std::memcpy(out, &scale, kScaleBytes);
  if constexpr (kAvx2) {
    if (full) return fp16ScaleAvx2(x, up, out + kScaleBytes);
  }
  auto* h = reinterpret_cast<_Float16*>(out + kScaleBytes);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<_Float16>(x[i] * up);
}

template <bool kAdd, bool kAvx2>
RD_INLINE void fp16DecodeBlock(const char* in, size_t n, float* out) {
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
  if constexpr (kAvx2) {
    if (n == kCodecBlock) return fp16DecodeAvx2<kAdd>(in + kScaleBytes, scale, out);
  }
  const auto* h = reinterpret_cast<const _Float16*>(in + kScaleBytes);
  for (size_t i = 0; i < n; ++i) {
    float v = static_cast<float>(h[i]) * scale;
    out[i] = kAdd ? out[i] + v : v;
  }
}

// ------------------------------------------------------------------ bf16

RD_INLINE void bf16Encode(const float* x, size_t n, char* out) {
  half::Bf16::narrow(out, x, n);
}

template <bool kAdd>
RD_INLINE void bf16Decode(const char* in, size_t n, float* out) {
  const auto* h = reinterpret_cast<const uint16_t*>(in);
  for (size_t i = 0; i < n; ++i) {
    float v = half::bf16ToFloat(h[i]);
    out[i] = kAdd ? out[i] + v : v;
  }
}

// ------------------------------------------------------------------ drivers

RD_INLINE size_t payloadBytes(Codec codec) { return codec == Codec::kInt8 ? 1 : 2; }

RD_INLINE size_t blockBytes(Codec codec, size_t n) {
  return (codec == Codec::kBf16 ? 0 : kScaleBytes) + n * payloadBytes(codec);
}

template <bool kAvx2>
RD_INLINE void encodeImpl(Codec codec, const float* in, size_t count, char* out) {
  if (codec == Codec::kBf16) {
    return bf16Encode(in, count, out);
  }
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    if (codec == Codec::kInt8) {
      int8EncodeBlock<kAvx2>(in + off, n, out);
    } else {
      fp16EncodeBlock<kAvx2>(in + off, n, out);
    }
    out += blockBytes(codec, n);
  }
}

template <bool kAdd, bool kAvx2>
RD_INLINE void decodeImpl(Codec codec, const char* in, size_t count, float* out) {
  if (codec == Codec::kBf16) {
    return bf16Decode<kAdd>(in, count, out);
  }
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    if (codec == Codec::kInt8) {
      int8DecodeBlock<kAdd, kAvx2>(in, n, out + off);
    } else {
      fp16DecodeBlock<kAdd, kAvx2>(in, n, out + off);
    }
    in += blockBytes(codec, n);
  }
}

template <bool kError, bool kAvx2>
RD_INLINE void roundTripImpl(Codec codec, const float* in, size_t count, float* out) {
  // One block at a time through a stack buffer: no full-size temporary.
  alignas(64) char buf[kScaleBytes + 2 * kCodecBlock];
  alignas(64) float dec[kCodecBlock];
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    encodeImpl<kAvx2>(codec, in + off, n, buf);
    decodeImpl<false, kAvx2>(codec, buf, n, dec);
    for (size_t i = 0; i < n; ++i) out[off + i] = kError ? in[off + i] - dec[i] : dec[i];
  }
}

#define RD_CODEC_FAMILY(FAMILY, ATTR, AVX2)                                                  \
  ATTR void FAMILY##Encode(Codec c, const float* in, size_t n, void* out) {                  \
    encodeImpl<AVX2>(c, in, n, static_cast<char*>(out));                                     \
  }                                                                                          \
  ATTR void FAMILY##Decode(Codec c, const void* in, size_t n, float* out) {                  \
    decodeImpl<false, AVX2>(c, static_cast<const char*>(in), n, out);                        \
  }                                                                                          \
  ATTR void FAMILY##DecodeAdd(Codec c, const void* in, size_t n, float* acc) {               \
    decodeImpl<true, AVX2>(c, static_cast<const char*>(in), n, acc);                         \
  }                                                                                          \
  ATTR void FAMILY##RoundTrip(Codec c, const float* in, size_t n, float* out) {              \
    roundTripImpl<false, AVX2>(c, in, n, out);                                               \
  }                                                                                          \
  ATTR void FAMILY##RoundTripError(Codec c, const float* in, size_t n, float* err) {         \
    roundTripImpl<true, AVX2>(c, in, n, err);                                                \
  }

RD_CODEC_FAMILY(generic, , false)
RD_CODEC_FAMILY(avx2, __attribute__((target("avx2,fma,f16c"))), true)

bool useAvx2() { return cpuFeatures().avx2Family; }

void checkCodec(Codec codec) {
  RINGDIST_CHECK(isKnownCodec(static_cast<uint8_t>(codec)), "ringdist codec: unknown codec id ",
                 static_cast<int>(codec));
}

}  // namespace

const char* codecName(Codec codec) {
  switch (codec) {
    case Codec::kFp16: return "fp16";
    case Codec::kBf16: return "bf16";
    case Codec::kInt8: return "int8";
  }
  return "unknown";
}

bool codecFromName(const std::string& name, Codec* out) {
  for (Codec c : {Codec::kFp16, Codec::kBf16, Codec::kInt8}) {
    if (name == codecName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool isKnownCodec(uint8_t value) { return value >= 1 && value <= 3; }

size_t encodedBytes(Codec codec, size_t count) {
  checkCodec(codec);
  if (codec == Codec::kBf16) {
    return 2 * count;
  }
  size_t blocks = (count + kCodecBlock - 1) / kCodecBlock;
  return blocks * kScaleBytes + count * payloadBytes(codec);
}

void encode(Codec codec, const float* in, size_t count, void* out) {
  checkCodec(codec);
  useAvx2() ? avx2Encode(codec, in, count, out) : genericEncode(codec, in, count, out);
}

void decode(Codec codec, const void* in, size_t count, float* out) {
  checkCodec(codec);
  useAvx2() ? avx2Decode(codec, in, count, out) : genericDecode(codec, in, count, out);
}

void decodeAdd(Codec codec, const void* in, size_t count, float* acc) {
  checkCodec(codec);
  useAvx2() ? avx2DecodeAdd(codec, in, count, acc) : genericDecodeAdd(codec, in, count, acc);
}

void roundTrip(Codec codec, const float* in, size_t count, float* out) {
  checkCodec(codec);
  useAvx2() ? avx2RoundTrip(codec, in, count, out) : genericRoundTrip(codec, in, count, out);
}

void roundTripError(Codec codec, const float* in, size_t count, float* err) {
  checkCodec(codec);
  useAvx2() ? avx2RoundTripError(codec, in, count, err)
            : genericRoundTripError(codec, in, count, err);
}


}  // namespace ringdist
