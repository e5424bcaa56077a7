#pragma once

#include <cstddef>
#include <string>

#include "csrc/common/error.h"
#include "csrc/common/types.h"
#include "csrc/reduce/elementwise.h"

namespace ringdist {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b. Half types
// (float16, bfloat16) are widened to float32, combined, and rounded once.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Returns the kernel for (dtype, op); AVG uses the SUM kernel (the owner of a
// chunk divides once, see divideInPlace). Throws for unsupported pairs.
ReduceFn reduceFunction(DataType dtype, ReduceOp op);

// The op a reduction of bool tensors performs: SUM and MAX are logical or,
// PRODUCT and MIN logical and (as NCCL); bitwise ops stay; AVG (undefined on
// bool) stays AVG for the caller to reject.
ReduceOp boolReduceOp(ReduceOp op);

// Calls fn(Tag<T>{}, Tag<Op>{}) (elementwise.h) with the element type and
// element operation that reduce (dtype, op), element by element code (the
// CUDA kernels, tests): the CPU kernels' supported pairs (throws for the
// others, as reduceFunction) and their bool mapping.
template <typename Fn>
void visitReduction(DataType dtype, ReduceOp op, Fn&& fn) {
  reduceFunction(dtype, op);
  const ReduceOp mapped = dtype == DataType::kBool ? boolReduceOp(op) : op;
  bool visited = false;
  elementwise::visitOp(mapped, [&](auto opTag) {
    using Op = typename decltype(opTag)::type;
    visited = elementwise::visitElementType<Op>(dtype, [&](auto elementTag) { fn(elementTag, opTag); });
  });
  RINGDIST_CHECK(visited, "ringdist: reduce op ", reduceOpName(op), " has no element kernel for ",
                 dataTypeName(dtype));
}

// Empty string when (dtype, op) is supported, else the reason.
std::string unsupportedReason(DataType dtype, ReduceOp op);

// data[i] /= divisor (AVG finalisation). Integers truncate toward zero.
void divideInPlace(void* data, size_t count, DataType dtype, int divisor);

}  // namespace ringdist
