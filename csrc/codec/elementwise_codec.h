#pragma once

#include <cstddef>

#include "csrc/codec/codec.h"

namespace ringdist {

// The codecs computed one element at a time through block_math.h, as the GPU
// kernels compute them: the reference the CPU kernels are checked against
// (tests/test_shared_arithmetic.py, tests/engine/engine_check.cc).
// Same layout and arguments as encode / decode (add: decode-add).
void encodeElementwise(Codec codec, const float* x, size_t count, char* out);
void decodeElementwise(Codec codec, const char* in, size_t count, float* out, bool add);

}  // namespace ringdist
