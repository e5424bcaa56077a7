#pragma once

// The wire codecs on the GPU (csrc/codec/codec.h for terms and formats): the
// same bytes as the CPU codecs, computed by csrc/codec/block_math.h, so a
// compressed allreduce of CUDA tensors encodes on the GPU and only encoded
// bytes cross PCIe and the network. Built only with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <cstddef>

#include "csrc/codec/codec.h"

namespace ringdist {
namespace cuda {

// Device pointers, queued on stream; sizes as csrc/codec/codec.h.
void encode(Codec codec, const float* in, size_t count, void* out, cudaStream_t stream);
void decode(Codec codec, const void* in, size_t count, float* out, cudaStream_t stream);
void decodeAdd(Codec codec, const void* in, size_t count, float* acc, cudaStream_t stream);

}  // namespace cuda
}  // namespace ringdist
