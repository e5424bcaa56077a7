// Wire codecs (terms in codec.h). Every kernel is an always-inline template
// instantiated per kernel family (csrc/common/cpu.h): the generic family, and
// on x86-64 and aarch64 the vector family, whose full blocks take the
// intrinsics of vector_blocks.h. Loops are written so the compiler vectorises
// them: per-lane partial maxima instead of a serial reduction, and rounding
// by adding and subtracting 1.5 * 2^23 instead of calling a libm function.
#include "csrc/codec/codec.h"

#include <cmath>
#include <cstring>

#include "csrc/codec/block_math.h"
#include "csrc/codec/vector_blocks.h"
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

// Max |x| and finiteness of one block; full blocks take the vector kernel.
template <bool kVector>
RD_INLINE BlockStats statsOf(const float* x, size_t n) {
#if defined(RD_VECTOR_TARGET)
  if constexpr (kVector) {
    if (n == kCodecBlock) return vec::stats(x);
  }
#endif
  return blockStats(x, n);
}

// ------------------------------------------------------------ int8, int4

// q[i] = clamp(round(x[i] * inverse), +-127). The integer codecs' products
// stay within +-levels (|x| <= max), so int4 shares int8's clamp.
template <bool kVector>
RD_INLINE void quantise(const float* x, size_t n, float inverse, int8_t* q) {
#if defined(RD_VECTOR_TARGET)
  if constexpr (kVector) {
    if (n == kCodecBlock) return vec::int8Quantise(x, inverse, q);
  }
#endif
  for (size_t i = 0; i < n; ++i) {
    float v = x[i] * inverse;
    v = (v + kRound) - kRound;
    // |x| <= max, but x * (127 / max) may round a hair above 127.
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(v));
  }
}

template <bool kAdd, bool kVector>
RD_INLINE void dequantise(const int8_t* q, size_t n, float scale, float* out) {
#if defined(RD_VECTOR_TARGET)
  if constexpr (kVector) {
    if (n == kCodecBlock) return vec::int8Decode<kAdd>(q, scale, out);
  }
#endif
  for (size_t i = 0; i < n; ++i) {
    float v = static_cast<float>(q[i]) * scale;
    out[i] = kAdd ? out[i] + v : v;
  }
}

template <bool kVector>
RD_INLINE void int8EncodeBlock(const float* x, size_t n, char* out) {
  const BlockStats st = statsOf<kVector>(x, n);
  const auto s = blockmath::intScales(st.maxAbs, st.finite, blockmath::kInt8Levels);
  std::memcpy(out, &s.scale, kScaleBytes);
  quantise<kVector>(x, n, s.inverse, reinterpret_cast<int8_t*>(out + kScaleBytes));
}

template <bool kAdd, bool kVector>
RD_INLINE void int8DecodeBlock(const char* in, size_t n, float* out) {
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
  dequantise<kAdd, kVector>(reinterpret_cast<const int8_t*>(in + kScaleBytes), n, scale, out);
}

// int4 quantises like int8 into a stack block, then packs two per byte.
template <bool kVector>
RD_INLINE void int4EncodeBlock(const float* x, size_t n, char* out) {
  const BlockStats st = statsOf<kVector>(x, n);
  const auto s = blockmath::intScales(st.maxAbs, st.finite, blockmath::kInt4Levels);
  std::memcpy(out, &s.scale, kScaleBytes);
  alignas(64) int8_t q[kCodecBlock];
  quantise<kVector>(x, n, s.inverse, q);
  auto* packed = reinterpret_cast<uint8_t*>(out + kScaleBytes);
  for (size_t k = 0; k < n / 2; ++k) packed[k] = blockmath::int4Pack(q[2 * k], q[2 * k + 1]);
  if (n % 2) packed[n / 2] = blockmath::int4Pack(q[n - 1], 0);
}

template <bool kAdd, bool kVector>
RD_INLINE void int4DecodeBlock(const char* in, size_t n, float* out) {
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
  const auto* packed = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
  alignas(64) int8_t q[kCodecBlock];
  for (size_t k = 0; k < (n + 1) / 2; ++k) {
    q[2 * k] = blockmath::int4Unpack(packed[k], false);
    q[2 * k + 1] = blockmath::int4Unpack(packed[k], true);
  }
  dequantise<kAdd, kVector>(q, n, scale, out);
}

// ------------------------------------------------------------------ fp16

template <bool kVector>
RD_INLINE void fp16EncodeBlock(const float* x, size_t n, char* out) {
  const BlockStats st = statsOf<kVector>(x, n);
  const auto s = blockmath::fp16Scales(st.maxAbs, st.finite);
  const float scale = s.scale;  // decode multiplier
  const float up = s.up;        // encode multiplier, 1 / scale (exact: powers of two)
  std::memcpy(out, &scale, kScaleBytes);
#if defined(RD_VECTOR_TARGET)
  if constexpr (kVector) {
    if (n == kCodecBlock) return vec::fp16Scale(x, up, out + kScaleBytes);
  }
#endif
  auto* h = reinterpret_cast<half::Fp16::Bits*>(out + kScaleBytes);
  for (size_t i = 0; i < n; ++i) h[i] = half::Fp16::fromFloat(x[i] * up);
}

template <bool kAdd, bool kVector>
RD_INLINE void fp16DecodeBlock(const char* in, size_t n, float* out) {
  float scale;
  std::memcpy(&scale, in, kScaleBytes);
#if defined(RD_VECTOR_TARGET)
  if constexpr (kVector) {
    if (n == kCodecBlock) return vec::fp16Decode<kAdd>(in + kScaleBytes, scale, out);
  }
#endif
  const auto* h = reinterpret_cast<const half::Fp16::Bits*>(in + kScaleBytes);
  for (size_t i = 0; i < n; ++i) {
    float v = half::Fp16::toFloat(h[i]) * scale;
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

using blockmath::blockBytes;

template <bool kVector>
RD_INLINE void encodeImpl(Codec codec, const float* in, size_t count, char* out) {
  if (codec == Codec::kBf16) {
    return bf16Encode(in, count, out);
  }
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    switch (codec) {
      case Codec::kInt8: int8EncodeBlock<kVector>(in + off, n, out); break;
      case Codec::kInt4: int4EncodeBlock<kVector>(in + off, n, out); break;
      default: fp16EncodeBlock<kVector>(in + off, n, out); break;
    }
    out += blockBytes(codec, n);
  }
}

template <bool kAdd, bool kVector>
RD_INLINE void decodeImpl(Codec codec, const char* in, size_t count, float* out) {
  if (codec == Codec::kBf16) {
    return bf16Decode<kAdd>(in, count, out);
  }
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    switch (codec) {
      case Codec::kInt8: int8DecodeBlock<kAdd, kVector>(in, n, out + off); break;
      case Codec::kInt4: int4DecodeBlock<kAdd, kVector>(in, n, out + off); break;
      default: fp16DecodeBlock<kAdd, kVector>(in, n, out + off); break;
    }
    in += blockBytes(codec, n);
  }
}

template <bool kError, bool kVector>
RD_INLINE void roundTripImpl(Codec codec, const float* in, size_t count, float* out) {
  // One block at a time through a stack buffer: no full-size temporary.
  alignas(64) char buf[kScaleBytes + 2 * kCodecBlock];
  alignas(64) float dec[kCodecBlock];
  for (size_t off = 0; off < count; off += kCodecBlock) {
    size_t n = count - off < kCodecBlock ? count - off : kCodecBlock;
    encodeImpl<kVector>(codec, in + off, n, buf);
    decodeImpl<false, kVector>(codec, buf, n, dec);
    for (size_t i = 0; i < n; ++i) out[off + i] = kError ? in[off + i] - dec[i] : dec[i];
  }
}

#define RD_CODEC_FAMILY(FAMILY, ATTR, VECTOR)                                                  \
  ATTR void FAMILY##Encode(Codec c, const float* in, size_t n, void* out) {                  \
    encodeImpl<VECTOR>(c, in, n, static_cast<char*>(out));                                     \
  }                                                                                          \
  ATTR void FAMILY##Decode(Codec c, const void* in, size_t n, float* out) {                  \
    decodeImpl<false, VECTOR>(c, static_cast<const char*>(in), n, out);                        \
  }                                                                                          \
  ATTR void FAMILY##DecodeAdd(Codec c, const void* in, size_t n, float* acc) {               \
    decodeImpl<true, VECTOR>(c, static_cast<const char*>(in), n, acc);                         \
  }                                                                                          \
  ATTR void FAMILY##RoundTrip(Codec c, const float* in, size_t n, float* out) {              \
    roundTripImpl<false, VECTOR>(c, in, n, out);                                               \
  }                                                                                          \
  ATTR void FAMILY##RoundTripError(Codec c, const float* in, size_t n, float* err) {         \
    roundTripImpl<true, VECTOR>(c, in, n, err);                                                \
  }

RD_CODEC_FAMILY(generic, , false)
#if defined(RD_VECTOR_TARGET)
RD_CODEC_FAMILY(vector, RD_VECTOR_TARGET, true)
#define RD_CODEC_CALL(NAME, ...) \
  (useVectorKernels() ? vector##NAME(__VA_ARGS__) : generic##NAME(__VA_ARGS__))
#else
#define RD_CODEC_CALL(NAME, ...) generic##NAME(__VA_ARGS__)
#endif

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
    case Codec::kInt4: return "int4";
  }
  return "unknown";
}

bool codecFromName(const std::string& name, Codec* out) {
  for (Codec c : {Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
    if (name == codecName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool isKnownCodec(uint8_t value) { return value >= 1 && value <= 4; }

size_t encodedBytes(Codec codec, size_t count) {
  checkCodec(codec);
  const size_t rest = count % kCodecBlock;
  return count / kCodecBlock * blockBytes(codec, kCodecBlock) + (rest ? blockBytes(codec, rest) : 0);
}

void encode(Codec codec, const float* in, size_t count, void* out) {
  checkCodec(codec);
  RD_CODEC_CALL(Encode, codec, in, count, out);
}

void decode(Codec codec, const void* in, size_t count, float* out) {
  checkCodec(codec);
  RD_CODEC_CALL(Decode, codec, in, count, out);
}

void decodeAdd(Codec codec, const void* in, size_t count, float* acc) {
  checkCodec(codec);
  RD_CODEC_CALL(DecodeAdd, codec, in, count, acc);
}

void roundTrip(Codec codec, const float* in, size_t count, float* out) {
  checkCodec(codec);
  RD_CODEC_CALL(RoundTrip, codec, in, count, out);
}

void roundTripError(Codec codec, const float* in, size_t count, float* err) {
  checkCodec(codec);
  RD_CODEC_CALL(RoundTripError, codec, in, count, err);
}


}  // namespace ringdist
