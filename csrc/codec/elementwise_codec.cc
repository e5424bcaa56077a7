// The codecs element by element through block_math.h: what the GPU kernels
// compute, on the host (the reference the CPU kernels are checked against).
#include "csrc/codec/elementwise_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "csrc/codec/block_math.h"

namespace ringdist {

namespace ew = elementwise;

void encodeElementwise(Codec codec, const float* x, size_t count, char* out) {
  if (codec == Codec::kBf16) {
    auto* h = reinterpret_cast<uint16_t*>(out);
    for (size_t i = 0; i < count; ++i) h[i] = ew::floatToBf16(x[i]);
    return;
  }
  for (size_t first = 0; first < count; first += kCodecBlock) {
    const size_t n = std::min(kCodecBlock, count - first);
    float maxAbs = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(x[first + i]);
      maxAbs = a > maxAbs ? a : maxAbs;
      finite = finite && std::isfinite(x[first + i]);
    }
    char* block = out + encodedBytes(codec, first);
    if (codec == Codec::kInt8) {
      const auto s = blockmath::intScales(maxAbs, finite, blockmath::kInt8Levels);
      std::memcpy(block, &s.scale, sizeof(float));
      auto* q = reinterpret_cast<int8_t*>(block + sizeof(float));
      for (size_t i = 0; i < n; ++i) {
        q[i] = blockmath::intEncode(x[first + i], s.inverse, blockmath::kInt8Levels);
      }
    } else if (codec == Codec::kInt4) {
      const auto s = blockmath::intScales(maxAbs, finite, blockmath::kInt4Levels);
      std::memcpy(block, &s.scale, sizeof(float));
      auto* packed = reinterpret_cast<uint8_t*>(block + sizeof(float));
      for (size_t i = 0; i < n; i += 2) {
        const int8_t low = blockmath::intEncode(x[first + i], s.inverse, blockmath::kInt4Levels);
        const int8_t high = i + 1 < n
            ? blockmath::intEncode(x[first + i + 1], s.inverse, blockmath::kInt4Levels)
            : 0;
        packed[i / 2] = blockmath::int4Pack(low, high);
      }
    } else {
      const auto s = blockmath::fp16Scales(maxAbs, finite);
      std::memcpy(block, &s.scale, sizeof(float));
      auto* h = reinterpret_cast<uint16_t*>(block + sizeof(float));
      for (size_t i = 0; i < n; ++i) h[i] = blockmath::fp16Encode(x[first + i], s.up);
    }
  }
}

void decodeElementwise(Codec codec, const char* in, size_t count, float* out, bool add) {
  for (size_t i = 0; i < count; ++i) {
    float v;
    if (codec == Codec::kBf16) {
      v = ew::bf16ToFloat(reinterpret_cast<const uint16_t*>(in)[i]);
    } else {
      const char* block = in + encodedBytes(codec, i / kCodecBlock * kCodecBlock);
      float scale;
      std::memcpy(&scale, block, sizeof(float));
      const size_t j = i % kCodecBlock;
      const char* payload = block + sizeof(float);
      if (codec == Codec::kInt8) {
        v = blockmath::intDecode(reinterpret_cast<const int8_t*>(payload)[j], scale);
      } else if (codec == Codec::kInt4) {
        const uint8_t byte = reinterpret_cast<const uint8_t*>(payload)[j / 2];
        v = blockmath::intDecode(blockmath::int4Unpack(byte, j % 2 == 1), scale);
      } else {
        v = blockmath::fp16Decode(reinterpret_cast<const uint16_t*>(payload)[j], scale);
      }
    }
    out[i] = add ? out[i] + v : v;
  }
}

}  // namespace ringdist
