#pragma once

// float32 <-> float16 / bfloat16 conversions shared by the reduce kernels and
// the wire codecs. Always inlined so each kernel family (baseline, AVX2+F16C)
// compiles them with its own instruction set (vcvtph2ps / vcvtps2ph there).

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

// Round to nearest even, as torch's float -> half cast. The hardware
// conversion (F16C) on x86; elementwise::fp16ToFloat / floatToFp16 are the
// same conversions in portable bit arithmetic, for the GPU.
struct Fp16 {
  static RD_INLINE void widen(float* out, const void* in, size_t n) {
    const auto* h = static_cast<const _Float16*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(h[i]);
  }
  static RD_INLINE void narrow(void* out, const float* in, size_t n) {
    auto* h = static_cast<_Float16*>(out);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<_Float16>(in[i]);
  }
};

}  // namespace half
}  // namespace ringdist
