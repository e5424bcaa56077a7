#pragma once

// Reduction kernels on the GPU: the CUDA twin of csrc/reduce/reduce.h, with
// every element computed by csrc/reduce/elementwise.h, so results are bit
// for bit those of the CPU kernels. Built only when the extension is
// compiled with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <cstddef>

#include "csrc/common/types.h"

namespace ringdist {
namespace cuda {

// dst[i] = a[i] (op) b[i] for i < count, device pointers, queued on stream.
// dst may alias a or b. AVG reduces like SUM (see divide). Throws for the
// (dtype, op) pairs the CPU kernels reject, and on a launch error.
void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
            cudaStream_t stream);

// data[i] /= divisor (AVG finalisation), as the CPU's divideInPlace.
void divide(DataType dtype, void* data, size_t count, int divisor, cudaStream_t stream);

}  // namespace cuda
}  // namespace ringdist
