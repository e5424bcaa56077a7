#pragma once

// The arithmetic of one codec block (terms in codec.h), written once for the
// CUDA kernels (csrc/cuda/codec.cu) and checked on the CPU against the CPU
// codec kernels (tests/test_shared_arithmetic.py): the scale of a block from
// its largest magnitude, and each element's encoding and decoding. Exact
// operations and single roundings only, so CPU and GPU give the same bytes.

#include <cmath>
#include <cstdint>

#include "csrc/reduce/elementwise.h"

namespace ringdist {
namespace blockmath {

// Blocks whose largest magnitude is below this encode as zeros (127 / max
// would overflow float32; such values are far below any gradient's scale).
constexpr float kTinyBlock = 1e-30f;

RD_HOST_DEVICE float roundHalfEven(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);  // the default rounding mode: to nearest, ties to even
#endif
}

// int8: scale = max|x| / 127 (what decoding multiplies by) and its inverse
// (what encoding multiplies by). A block holding a NaN or infinity decodes
// to NaN throughout.
struct Int8Scales {
  float scale;
  float inverse;
};

RD_HOST_DEVICE Int8Scales int8Scales(float maxAbs, bool finite) {
  if (!finite) return {NAN, 0.0f};
  if (maxAbs < kTinyBlock) return {0.0f, 0.0f};
  return {maxAbs / 127.0f, 127.0f / maxAbs};
}

// round(x * inverse) clamped to [-127, 127]; 0 where the product is NaN
// (non-finite blocks, whose bytes decode to NaN anyway).
RD_HOST_DEVICE int8_t int8Encode(float x, float inverse) {
  float v = roundHalfEven(x * inverse);
  if (v != v) return 0;
  v = v > 127.0f ? 127.0f : v;
  v = v < -127.0f ? -127.0f : v;
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

RD_HOST_DEVICE float int8Decode(int8_t q, float scale) { return static_cast<float>(q) * scale; }

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
