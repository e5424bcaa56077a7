#pragma once

// The arithmetic of one element, written once for the CPU kernels
// (csrc/reduce/reduce.cc) and the CUDA kernels (csrc/gpu/cuda/): reduce ops and
// float <-> fp16/bf16 conversions. Everything here is plain integer and
// single float operations, so CPU and GPU give the same bits: CUDA code
// built from it must not contract a * b + c into a fused multiply-add
// (csrc/gpu/cuda/ compiles with -fmad=false). tests/test_shared_arithmetic.py
// checks these functions, run on the CPU, against the CPU kernels.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "csrc/common/types.h"

#if defined(__CUDACC__)
#define RD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RD_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace ringdist {
namespace elementwise {

// ------------------------------------------------------------------ reduce ops

struct Sum { template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return a + b; } };
struct Prod { template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return a * b; } };
// NaN-propagating, like torch.minimum / torch.maximum.
struct Min {
  template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct Max {
  template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};
struct And { template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return a & b; } };
struct Or { template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return a | b; } };
struct Xor { template <typename T> static RD_HOST_DEVICE T apply(T a, T b) { return a ^ b; } };

// Integer sums and products wrap (two's complement) like torch's integer
// arithmetic; computing in the unsigned type keeps that well defined in C++.
template <typename T> struct Wrap { using type = T; };
template <> struct Wrap<int8_t> { using type = uint8_t; };
template <> struct Wrap<int32_t> { using type = uint32_t; };
template <> struct Wrap<int64_t> { using type = uint64_t; };

// Min and Max compare as T (signed); every other op works in Wrap<T>.
template <typename Op>
constexpr bool kComparesSigned = std::is_same<Op, Min>::value || std::is_same<Op, Max>::value;

// a (op) b for one element of an integer or float32/float64 type.
template <typename T, typename Op>
RD_HOST_DEVICE T combine(T a, T b) {
  using W = typename Wrap<T>::type;
  if constexpr (std::is_same<W, T>::value || kComparesSigned<Op>) {
    return Op::apply(a, b);
  } else {
    return static_cast<T>(static_cast<W>(Op::apply(static_cast<W>(a), static_cast<W>(b))));
  }
}

// ------------------------------------------------------------------ conversions

RD_HOST_DEVICE uint32_t floatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

RD_HOST_DEVICE float bitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

RD_HOST_DEVICE float bf16ToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; a NaN stays a NaN (quiet, sign kept).
RD_HOST_DEVICE uint16_t floatToBf16(float f) {
  uint32_t bits = floatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Exact. A signalling NaN comes back quiet with its payload, as x86's
// vcvtph2ps does.
RD_HOST_DEVICE float fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 31) {
    return bitsFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent == 0) {
    // Subnormal (or zero): mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return bitsFloat(sign | floatBits(magnitude));
  }
  return bitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round to nearest even, overflow to infinity; a NaN comes back quiet with
// its payload's top bits, as x86's vcvtps2ph does.
RD_HOST_DEVICE uint16_t floatToFp16(float f) {
  const uint32_t bits = floatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) {  // at or past the midpoint of 65504 and 65536
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {  // a normal fp16: rebias 127 -> 15, round 23 -> 10 bits
    uint32_t h = magnitude - 0x38000000u;
    h += 0xfffu + ((h >> 13) & 1u);
    return static_cast<uint16_t>(sign | (h >> 13));
  }
  if (magnitude <= 0x33000000u) {  // at most half the smallest subnormal: ties to even zero
    return static_cast<uint16_t>(sign);
  }
  // A subnormal fp16: round(significand * 2^(exponent - 150 + 24)).
  const uint32_t exponent = magnitude >> 23;  // 102 .. 112
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;     // 14 .. 24
  uint32_t q = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (q & 1u) != 0)) {
    ++q;
  }
  return static_cast<uint16_t>(sign | q);
}

// The half types are combined in float32 and rounded once.
struct Fp16Bits {
  static RD_HOST_DEVICE float widen(uint16_t h) { return fp16ToFloat(h); }
  static RD_HOST_DEVICE uint16_t narrow(float f) { return floatToFp16(f); }
};
struct Bf16Bits {
  static RD_HOST_DEVICE float widen(uint16_t h) { return bf16ToFloat(h); }
  static RD_HOST_DEVICE uint16_t narrow(float f) { return floatToBf16(f); }
};

template <typename Half, typename Op>
RD_HOST_DEVICE uint16_t combineHalf(uint16_t a, uint16_t b) {
  return Half::narrow(Op::apply(Half::widen(a), Half::widen(b)));
}

// ------------------------------------------------------------------ element types

// Element type T of a dtype is stored as Storage<T>: itself, or 16 bits for
// the half types (Fp16Bits, Bf16Bits), which are combined in float32.
template <typename T> struct Storage { using type = T; };
template <> struct Storage<Fp16Bits> { using type = uint16_t; };
template <> struct Storage<Bf16Bits> { using type = uint16_t; };
template <typename T>
constexpr bool kIsHalf = std::is_same<T, Fp16Bits>::value || std::is_same<T, Bf16Bits>::value;

// a (op) b for one stored element of element type T.
template <typename T, typename Op>
RD_HOST_DEVICE typename Storage<T>::type apply(typename Storage<T>::type a,
                                               typename Storage<T>::type b) {
  if constexpr (kIsHalf<T>) {
    return combineHalf<T, Op>(a, b);
  } else {
    return combine<T, Op>(a, b);
  }
}

// x / divisor, as AVG finalises: integers truncate toward zero, halves
// divide in float32 and round once.
template <typename T>
RD_HOST_DEVICE typename Storage<T>::type divide(typename Storage<T>::type x, int divisor) {
  if constexpr (kIsHalf<T>) {
    return T::narrow(T::widen(x) / static_cast<float>(divisor));
  } else {
    return static_cast<T>(x / static_cast<T>(divisor));
  }
}

// ------------------------------------------------------------------ dispatch (host)

template <typename T> struct Tag { using type = T; };

// Calls fn(Tag<Op>{}) with op's element operation; AVG reduces like SUM (the
// owner of a chunk divides once). Bool ops are mapped first (boolReduceOp).
template <typename Fn>
void visitOp(ReduceOp op, Fn&& fn) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return fn(Tag<Sum>{});
    case ReduceOp::kProduct: return fn(Tag<Prod>{});
    case ReduceOp::kMin: return fn(Tag<Min>{});
    case ReduceOp::kMax: return fn(Tag<Max>{});
    case ReduceOp::kBand: return fn(Tag<And>{});
    case ReduceOp::kBor: return fn(Tag<Or>{});
    case ReduceOp::kBxor: return fn(Tag<Xor>{});
  }
}

// Calls fn(Tag<T>{}) with dtype's element type T when Op is defined on it
// (bitwise ops on integers and bool only); false when it is not.
template <typename Op, typename Fn>
bool visitElementType(DataType dtype, Fn&& fn) {
  constexpr bool kBitwise = std::is_same<Op, And>::value || std::is_same<Op, Or>::value ||
      std::is_same<Op, Xor>::value;
  if constexpr (!kBitwise) {
    switch (dtype) {
      case DataType::kFloat32: fn(Tag<float>{}); return true;
      case DataType::kFloat64: fn(Tag<double>{}); return true;
      case DataType::kFloat16: fn(Tag<Fp16Bits>{}); return true;
      case DataType::kBFloat16: fn(Tag<Bf16Bits>{}); return true;
      default: break;
    }
  }
  switch (dtype) {
    case DataType::kInt8: fn(Tag<int8_t>{}); return true;
    case DataType::kUInt8: case DataType::kBool: fn(Tag<uint8_t>{}); return true;
    case DataType::kInt32: fn(Tag<int32_t>{}); return true;
    case DataType::kInt64: fn(Tag<int64_t>{}); return true;
    default: return false;
  }
}

}  // namespace elementwise
}  // namespace ringdist
