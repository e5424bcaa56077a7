#pragma once

// The top-k hook's kernels on the GPU (terms and contract in
// csrc/topk/topk.h): the same selection and the same dense result as the CPU
// kernels, bit for bit, computed through csrc/topk/topk_math.h. So a CUDA
// bucket never leaves the GPU; only the selection crosses to the host for the
// allgather. Built only with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ringdist {
namespace cuda {

// Device memory topkSelect needs beside its operands for a bucket of n entries.
size_t topkSelectWorkspaceBytes(size_t n);

// As ringdist::topkSelect, device pointers, queued on stream (no host wait).
// workspace: topkSelectWorkspaceBytes(n) bytes of device memory.
void topkSelect(const float* grad, float* residual, size_t n, size_t k, float* values,
                int32_t* indices, void* workspace, cudaStream_t stream);

// As ringdist::topkScatter, device pointers, on stream. Waits for the GPU to
// check every index and throws, naming the rank and index, on one outside
// [0, n). flag: 8 bytes of device memory.
void topkScatter(const float* parts, size_t world, size_t k, size_t n, float* out, void* flag,
                 cudaStream_t stream);

}  // namespace cuda
}  // namespace ringdist
