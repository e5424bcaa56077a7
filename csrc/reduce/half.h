#pragma once

// float32 <-> float16 / bfloat16 conversions shared by the reduce kernels and
// the wire codecs. Always inlined so each kernel family compiles them with its
// own instruction set (vcvtph2ps / vcvtps2ph with F16C, fcvt on aarch64).

#include <cstddef>
#include <cstdint>

#include "csrc/reduce/elementwise.h"

#ifndef RD_INLINE
#define RD_INLINE inline __attribute__((always_inline))
#endif

namespace ringdist {
namespace half {

using elementwise::bf16ToFloat;
using elementwise::floatToBf16;

// Conversions between float32 buffers and packed 16-bit ones.
struct Bf16 {
  static RD_INLINE void widen(float* out, const void* in, size_t n) {
    const auto* h = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(h[i]);
  }
  static RD_INLINE void narrow(void* out, const float* in, size_t n) {
    auto* h = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < n; ++i) h[i] = floatToBf16(in[i]);
  }
};

// Round to nearest even, as torch's float -> half cast: the compiler's half
// type (the hardware conversion with F16C on x86-64, fcvt on aarch64, whose
// g++ has __fp16 but no _Float16 in C++); elsewhere elementwise's bit
// arithmetic, the conversion the GPU kernels use.
struct Fp16 {
#if defined(__aarch64__) || defined(__FLT16_MAX__)
#if defined(__aarch64__)
  using Bits = __fp16;
#else
  using Bits = _Float16;
#endif
  static RD_INLINE float toFloat(Bits h) { return static_cast<float>(h); }
  static RD_INLINE Bits fromFloat(float x) { return static_cast<Bits>(x); }
#else
  using Bits = uint16_t;
  static RD_INLINE float toFloat(Bits h) { return elementwise::fp16ToFloat(h); }
  static RD_INLINE Bits fromFloat(float x) { return elementwise::floatToFp16(x); }
#endif
  static RD_INLINE void widen(float* out, const void* in, size_t n) {
    const auto* h = static_cast<const Bits*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = toFloat(h[i]);
  }
  static RD_INLINE void narrow(void* out, const float* in, size_t n) {
    auto* h = static_cast<Bits*>(out);
    for (size_t i = 0; i < n; ++i) h[i] = fromFloat(in[i]);
  }
};

}  // namespace half
}  // namespace ringdist
