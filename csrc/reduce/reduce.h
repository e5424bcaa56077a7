#pragma once

#include <cstddef>
#include <string>

#include "csrc/common/types.h"

namespace ringdist {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b. Half types
// (float16, bfloat16) are widened to float32, combined, and rounded once.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Returns the kernel for (dtype, op); AVG uses the SUM kernel (the owner of a
// chunk divides once, see divideInPlace). Throws for unsupported pairs.
ReduceFn reduceFunction(DataType dtype, ReduceOp op);

// Empty string when (dtype, op) is supported, else the reason.
std::string unsupportedReason(DataType dtype, ReduceOp op);

// data[i] /= divisor (AVG finalisation). Integers truncate toward zero.
void divideInPlace(void* data, size_t count, DataType dtype, int divisor);

}  // namespace ringdist
