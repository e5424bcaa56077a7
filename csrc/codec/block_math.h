#pragma once

// The arithmetic of one codec block (terms in codec.h), written once for the
// CUDA kernels (csrc/gpu/cuda/codec.cu) and checked on the CPU against the CPU
// codec kernels (tests/test_shared_arithmetic.py): the scale of a block from
// its largest magnitude, and each element's encoding and decoding. Exact
// operations and single roundings only, so CPU and GPU give the same bytes.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "csrc/codec/codec.h"
#include "csrc/reduce/elementwise.h"

namespace ringdist {
namespace blockmath {

// Blocks whose largest magnitude is below this encode as zeros (levels / max
// would overflow float32; such values are far below any gradient's scale).
constexpr float kTinyBlock = 1e-30f;

RD_HOST_DEVICE float roundHalfEven(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);  // the default rounding mode: to nearest, ties to even
#endif
}

// Encoded bytes of one block of n elements (n <= kCodecBlock); a block
// starts at (its index) * blockBytes(codec, kCodecBlock).
RD_HOST_DEVICE size_t blockBytes(Codec codec, size_t n) {
  switch (codec) {
    case Codec::kBf16: return 2 * n;
    case Codec::kFp16: return sizeof(float) + 2 * n;
    case Codec::kInt8: return sizeof(float) + n;
    case Codec::kInt4: return sizeof(float) + (n + 1) / 2;
  }
  return 0;
}

// Symmetric integer codecs (int8: 127 levels each side, int4: 7): scale =
// max|x| / levels (what decoding multiplies by) and its inverse (what
// encoding multiplies by). A block holding a NaN or infinity decodes to NaN
// throughout.
struct IntScales {
  float scale;
  float inverse;
};

constexpr float kInt8Levels = 127.0f;
constexpr float kInt4Levels = 7.0f;

RD_HOST_DEVICE IntScales intScales(float maxAbs, bool finite, float levels) {
  if (!finite) return {NAN, 0.0f};
  if (maxAbs < kTinyBlock) return {0.0f, 0.0f};
  return {maxAbs / levels, levels / maxAbs};
}

// round(x * inverse) clamped to [-levels, levels]; 0 where the product is
// NaN (non-finite blocks, whose bytes decode to NaN anyway).
RD_HOST_DEVICE int8_t intEncode(float x, float inverse, float levels) {
  float v = roundHalfEven(x * inverse);
  if (v != v) return 0;
  v = v > levels ? levels : v;
  v = v < -levels ? -levels : v;
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

RD_HOST_DEVICE float intDecode(int8_t q, float scale) { return static_cast<float>(q) * scale; }

// int4 nibbles: two's complement, element 2k low and 2k + 1 high in byte k.
RD_HOST_DEVICE uint8_t int4Pack(int8_t low, int8_t high) {
  return static_cast<uint8_t>((low & 0x0f) | ((high & 0x0f) << 4));
}

RD_HOST_DEVICE int8_t int4Unpack(uint8_t byte, bool high) {
  // Shift the wanted nibble to the top, then shift back arithmetically.
  const int8_t top = static_cast<int8_t>(high ? byte : static_cast<uint8_t>(byte << 4));
  return static_cast<int8_t>(top >> 4);
}

// fp16: a power-of-two scale putting max|x| in [2^14, 2^15), so nothing
// overflows; up = 1 / scale exactly.
struct Fp16Scales {
  float scale;
  float up;
};

RD_HOST_DEVICE Fp16Scales fp16Scales(float maxAbs, bool finite) {
  if (!finite) return {NAN, 0.0f};
  if (!(maxAbs > 0.0f)) return {1.0f, 1.0f};
  int e = 0;
  frexpf(maxAbs, &e);  // maxAbs = m * 2^e, m in [0.5, 1)
  int s = 15 - e;
  s = s > 126 ? 126 : s;  // 2^s must stay a normal float32
  return {ldexpf(1.0f, -s), ldexpf(1.0f, s)};
}

RD_HOST_DEVICE uint16_t fp16Encode(float x, float up) { return elementwise::floatToFp16(x * up); }

RD_HOST_DEVICE float fp16Decode(uint16_t h, float scale) {
  return elementwise::fp16ToFloat(h) * scale;
}

}  // namespace blockmath
}  // namespace ringdist
