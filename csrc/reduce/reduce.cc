#include "csrc/reduce/reduce.h"

#include <cstdint>
#include <cstring>

#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/reduce/elementwise.h"
#include "csrc/reduce/half.h"

// Every kernel is written once as an always-inline template. On x86-64 it is
// instantiated twice, a baseline family and an AVX2+F16C+FMA family
// (vcvtph2ps for float16), picked once from cpuid. On aarch64 once: NEON is
// part of the base architecture, so the compiler vectorises the templates
// with it (fcvtl/fcvtn for float16) in either family.

namespace ringdist {

namespace {

// The ops and their integer wrapping are shared with the CUDA kernels.
using elementwise::And;
using elementwise::Max;
using elementwise::Min;
using elementwise::Or;
using elementwise::Prod;
using elementwise::Sum;
using elementwise::Wrap;
using elementwise::Xor;

// elementwise::combine, over arrays: W-typed pointers let the compiler
// vectorise the wrapping integer ops.
template <typename T, typename Op>
RD_INLINE void loop(void* dst, const void* a, const void* b, size_t n) {
  using W = typename Wrap<T>::type;
  auto* d = static_cast<W*>(dst);
  const auto* x = static_cast<const W*>(a);
  const auto* y = static_cast<const W*>(b);
  if constexpr (std::is_same<W, T>::value) {
    for (size_t i = 0; i < n; ++i) d[i] = Op::apply(x[i], y[i]);
  } else {
    // Min/Max must compare as signed; sums/products/bit ops wrap as unsigned.
    if constexpr (elementwise::kComparesSigned<Op>) {
      auto* ds = static_cast<T*>(dst);
      const auto* xs = static_cast<const T*>(a);
      const auto* ys = static_cast<const T*>(b);
      for (size_t i = 0; i < n; ++i) ds[i] = Op::apply(xs[i], ys[i]);
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<W>(Op::apply(x[i], y[i]));
    }
  }
}

// Half types: widen a block to float32, combine, round back. The block fits
// in L1 so the extra passes cost little next to the memory traffic.
constexpr size_t kHalfBlock = 512;

using half::Bf16;
using half::Fp16;

template <typename Half, typename Op>
RD_INLINE void halfLoop(void* dst, const void* a, const void* b, size_t n) {
  alignas(64) float fa[kHalfBlock];
  alignas(64) float fb[kHalfBlock];
  for (size_t off = 0; off < n; off += kHalfBlock) {
    size_t m = std::min(kHalfBlock, n - off);
    Half::widen(fa, static_cast<const uint16_t*>(a) + off, m);
    Half::widen(fb, static_cast<const uint16_t*>(b) + off, m);
    for (size_t i = 0; i < m; ++i) fa[i] = Op::apply(fa[i], fb[i]);
    Half::narrow(static_cast<uint16_t*>(dst) + off, fa, m);
  }
}

template <typename Op>
RD_INLINE void dispatchFloatLike(DataType dtype, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DataType::kFloat32: return loop<float, Op>(dst, a, b, n);
    case DataType::kFloat64: return loop<double, Op>(dst, a, b, n);
    case DataType::kFloat16: return halfLoop<Fp16, Op>(dst, a, b, n);
    case DataType::kBFloat16: return halfLoop<Bf16, Op>(dst, a, b, n);
    default: break;
  }
}

template <typename Op>
RD_INLINE void dispatchInt(DataType dtype, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DataType::kInt8: return loop<int8_t, Op>(dst, a, b, n);
    case DataType::kUInt8: return loop<uint8_t, Op>(dst, a, b, n);
    case DataType::kBool: return loop<uint8_t, Op>(dst, a, b, n);
    case DataType::kInt32: return loop<int32_t, Op>(dst, a, b, n);
    case DataType::kInt64: return loop<int64_t, Op>(dst, a, b, n);
    default: break;
  }
}

// One function per (dtype, op) per family, generated below.
#define RD_KERNEL(FAMILY, ATTR, NAME, DTYPE, OP, DISPATCH)                                  \
  ATTR void FAMILY##_##NAME(void* dst, const void* a, const void* b, size_t n) {            \
    DISPATCH<OP>(DataType::DTYPE, dst, a, b, n);                                            \
  }

#define RD_FAMILY(FAMILY, ATTR)                                                              \
  RD_KERNEL(FAMILY, ATTR, f32_sum, kFloat32, Sum, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f32_prod, kFloat32, Prod, dispatchFloatLike)                       \
  RD_KERNEL(FAMILY, ATTR, f32_min, kFloat32, Min, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f32_max, kFloat32, Max, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f64_sum, kFloat64, Sum, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f64_prod, kFloat64, Prod, dispatchFloatLike)                       \
  RD_KERNEL(FAMILY, ATTR, f64_min, kFloat64, Min, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f64_max, kFloat64, Max, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f16_sum, kFloat16, Sum, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f16_prod, kFloat16, Prod, dispatchFloatLike)                       \
  RD_KERNEL(FAMILY, ATTR, f16_min, kFloat16, Min, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, f16_max, kFloat16, Max, dispatchFloatLike)                         \
  RD_KERNEL(FAMILY, ATTR, bf16_sum, kBFloat16, Sum, dispatchFloatLike)                       \
  RD_KERNEL(FAMILY, ATTR, bf16_prod, kBFloat16, Prod, dispatchFloatLike)                     \
  RD_KERNEL(FAMILY, ATTR, bf16_min, kBFloat16, Min, dispatchFloatLike)                       \
  RD_KERNEL(FAMILY, ATTR, bf16_max, kBFloat16, Max, dispatchFloatLike)                       \
  RD_INT_KERNELS(FAMILY, ATTR, i8, kInt8)                                                    \
  RD_INT_KERNELS(FAMILY, ATTR, u8, kUInt8)                                                   \
  RD_INT_KERNELS(FAMILY, ATTR, i32, kInt32)                                                  \
  RD_INT_KERNELS(FAMILY, ATTR, i64, kInt64)                                                  \
  RD_KERNEL(FAMILY, ATTR, b8_and, kBool, And, dispatchInt)                                   \
  RD_KERNEL(FAMILY, ATTR, b8_or, kBool, Or, dispatchInt)                                     \
  RD_KERNEL(FAMILY, ATTR, b8_xor, kBool, Xor, dispatchInt)

#define RD_INT_KERNELS(FAMILY, ATTR, T, DTYPE)                                               \
  RD_KERNEL(FAMILY, ATTR, T##_sum, DTYPE, Sum, dispatchInt)                                  \
  RD_KERNEL(FAMILY, ATTR, T##_prod, DTYPE, Prod, dispatchInt)                                \
  RD_KERNEL(FAMILY, ATTR, T##_min, DTYPE, Min, dispatchInt)                                  \
  RD_KERNEL(FAMILY, ATTR, T##_max, DTYPE, Max, dispatchInt)                                  \
  RD_KERNEL(FAMILY, ATTR, T##_and, DTYPE, And, dispatchInt)                                  \
  RD_KERNEL(FAMILY, ATTR, T##_or, DTYPE, Or, dispatchInt)                                    \
  RD_KERNEL(FAMILY, ATTR, T##_xor, DTYPE, Xor, dispatchInt)

RD_FAMILY(generic, )
#if defined(RINGDIST_X86)
RD_FAMILY(avx2, __attribute__((target("avx2,fma,f16c"))))
#define RD_PICK(NAME) (useVectorKernels() ? &avx2_##NAME : &generic_##NAME)
#else
#define RD_PICK(NAME) (&generic_##NAME)
#endif

// The arithmetic ops of every numeric dtype; AVG reduces with SUM (the owner
// of a chunk divides once, see divideInPlace).
#define RD_ARITHMETIC_CASES(P)                                                \
  case ReduceOp::kSum: case ReduceOp::kAvg: return RD_PICK(P##_sum);          \
  case ReduceOp::kProduct: return RD_PICK(P##_prod);                          \
  case ReduceOp::kMin: return RD_PICK(P##_min);                               \
  case ReduceOp::kMax: return RD_PICK(P##_max);

ReduceFn floatKernel(DataType dtype, ReduceOp op) {
#define RD_FLOAT_CASE(DT, P) \
  case DataType::DT: switch (op) { RD_ARITHMETIC_CASES(P) default: return nullptr; }
  switch (dtype) {
    RD_FLOAT_CASE(kFloat32, f32)
    RD_FLOAT_CASE(kFloat64, f64)
    RD_FLOAT_CASE(kFloat16, f16)
    RD_FLOAT_CASE(kBFloat16, bf16)
    default: return nullptr;
  }
#undef RD_FLOAT_CASE
}

ReduceFn intKernel(DataType dtype, ReduceOp op) {
#define RD_INT_CASE(DT, P)                                                    \
  case DataType::DT:                                                          \
    switch (op) {                                                             \
      RD_ARITHMETIC_CASES(P)                                                  \
      case ReduceOp::kBand: return RD_PICK(P##_and);                          \
      case ReduceOp::kBor: return RD_PICK(P##_or);                            \
      case ReduceOp::kBxor: return RD_PICK(P##_xor);                          \
    }                                                                         \
    return nullptr;
  switch (dtype) {
    RD_INT_CASE(kInt8, i8)
    RD_INT_CASE(kUInt8, u8)
    RD_INT_CASE(kInt32, i32)
    RD_INT_CASE(kInt64, i64)
    case DataType::kBool:
      switch (boolReduceOp(op)) {
        case ReduceOp::kBor: return RD_PICK(b8_or);
        case ReduceOp::kBand: return RD_PICK(b8_and);
        case ReduceOp::kBxor: return RD_PICK(b8_xor);
        default: return nullptr;
      }
    default: return nullptr;
  }
#undef RD_INT_CASE
}
#undef RD_ARITHMETIC_CASES

template <typename T>
void divideLoop(void* data, size_t n, int divisor) {
  auto* p = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
}

}  // namespace

ReduceOp boolReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kMax: return ReduceOp::kBor;
    case ReduceOp::kProduct: case ReduceOp::kMin: return ReduceOp::kBand;
    default: return op;
  }
}

std::string unsupportedReason(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool && op == ReduceOp::kAvg) {
    return "AVG is not defined for bool tensors";
  }
  if (isFloating(dtype) &&
      (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor)) {
    return strCat("bitwise ", reduceOpName(op), " is not defined for ", dataTypeName(dtype),
                  " tensors");
  }
  return "";
}

ReduceFn reduceFunction(DataType dtype, ReduceOp op) {
  ReduceFn fn = isFloating(dtype) ? floatKernel(dtype, op) : intKernel(dtype, op);
  RINGDIST_CHECK(fn != nullptr, "ringdist: reduce op ", reduceOpName(op),
                 " is not supported for ", dataTypeName(dtype), ": ",
                 unsupportedReason(dtype, op));
  return fn;
}

void divideInPlace(void* data, size_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat32: return divideLoop<float>(data, count, divisor);
    case DataType::kFloat64: return divideLoop<double>(data, count, divisor);
    case DataType::kInt8: return divideLoop<int8_t>(data, count, divisor);
    case DataType::kUInt8: return divideLoop<uint8_t>(data, count, divisor);
    case DataType::kInt32: return divideLoop<int32_t>(data, count, divisor);
    case DataType::kInt64: return divideLoop<int64_t>(data, count, divisor);
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      alignas(64) float block[kHalfBlock];
      auto* h = static_cast<uint16_t*>(data);
      for (size_t off = 0; off < count; off += kHalfBlock) {
        size_t m = std::min(kHalfBlock, count - off);
        if (dtype == DataType::kFloat16) {
          Fp16::widen(block, h + off, m);
          for (size_t i = 0; i < m; ++i) block[i] /= static_cast<float>(divisor);
          Fp16::narrow(h + off, block, m);
        } else {
          Bf16::widen(block, h + off, m);
          for (size_t i = 0; i < m; ++i) block[i] /= static_cast<float>(divisor);
          Bf16::narrow(h + off, block, m);
        }
      }
      return;
    }
    case DataType::kBool:
      break;
  }
  RINGDIST_FAIL("ringdist: AVG is not defined for ", dataTypeName(dtype), " tensors");
}


}  // namespace ringdist
