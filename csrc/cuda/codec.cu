// Codec kernels. Block-scaled codecs (int8, int4, fp16) run one thread block of
// kCodecBlock threads per codec block: each thread loads one element, the
// block finds the largest magnitude (an exact max, so order does not matter)
// and whether everything is finite, thread 0 writes the scale, and every
// thread writes its element's encoding (int4: even threads write a byte
// holding their odd neighbour's nibble too). bf16 is element-wise. All arithmetic
// is csrc/codec/block_math.h, compiled with -fmad=false.
#include "csrc/cuda/codec.h"

#include <cstdint>

#include "csrc/codec/block_math.h"
#include "csrc/common/error.h"

namespace ringdist {
namespace cuda {

namespace {

namespace bm = blockmath;
namespace ew = elementwise;

constexpr int kThreads = static_cast<int>(kCodecBlock);
constexpr int kWarps = kThreads / 32;
constexpr size_t kScaleBytes = sizeof(float);

// Encoded bytes of one full block; block b starts at b * fullBlockBytes.
__host__ __device__ size_t fullBlockBytes(Codec codec) { return bm::blockBytes(codec, kCodecBlock); }

struct Stats {
  float maxAbs;
  bool finite;
};

// Largest magnitude and finiteness of this thread block's elements.
__device__ Stats blockStats(float x, bool present) {
  __shared__ float warpMax[kWarps];
  float m = present ? fabsf(x) : 0.0f;
  const bool finite = __syncthreads_and(!present || isfinite(x));
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
  }
  if (threadIdx.x % 32 == 0) warpMax[threadIdx.x / 32] = m;
  __syncthreads();
  float maxAbs = warpMax[0];
  for (int w = 1; w < kWarps; ++w) maxAbs = fmaxf(maxAbs, warpMax[w]);
  return {maxAbs, finite};
}

template <Codec kCodec>
__global__ void encodeBlocks(const float* in, size_t count, char* out) {
  const size_t first = static_cast<size_t>(blockIdx.x) * kCodecBlock;
  const size_t i = first + threadIdx.x;
  const bool present = i < count;
  const float x = present ? in[i] : 0.0f;
  const Stats st = blockStats(x, present);
  char* block = out + blockIdx.x * fullBlockBytes(kCodec);
  char* payload = block + kScaleBytes;
  if (kCodec == Codec::kFp16) {
    const bm::Fp16Scales s = bm::fp16Scales(st.maxAbs, st.finite);
    if (threadIdx.x == 0) *reinterpret_cast<float*>(block) = s.scale;
    if (present) reinterpret_cast<uint16_t*>(payload)[threadIdx.x] = bm::fp16Encode(x, s.up);
    return;
  }
  const float levels = kCodec == Codec::kInt8 ? bm::kInt8Levels : bm::kInt4Levels;
  const bm::IntScales s = bm::intScales(st.maxAbs, st.finite, levels);
  if (threadIdx.x == 0) *reinterpret_cast<float*>(block) = s.scale;
  const int8_t q = present ? bm::intEncode(x, s.inverse, levels) : 0;
  if (kCodec == Codec::kInt8) {
    if (present) reinterpret_cast<int8_t*>(payload)[threadIdx.x] = q;
    return;
  }
  // int4: each even thread packs its element with its odd neighbour's (0 past the end).
  const int8_t next = static_cast<int8_t>(__shfl_down_sync(0xffffffffu, static_cast<int>(q), 1));
  if (present && threadIdx.x % 2 == 0) {
    reinterpret_cast<uint8_t*>(payload)[threadIdx.x / 2] = bm::int4Pack(q, next);
  }
}

template <Codec kCodec, bool kAdd>
__global__ void decodeBlocks(const char* in, size_t count, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * kCodecBlock + threadIdx.x;
  if (i >= count) return;
  const char* block = in + blockIdx.x * fullBlockBytes(kCodec);
  const float scale = *reinterpret_cast<const float*>(block);
  const char* payload = block + kScaleBytes;
  float v;
  if (kCodec == Codec::kInt8) {
    v = bm::intDecode(reinterpret_cast<const int8_t*>(payload)[threadIdx.x], scale);
  } else if (kCodec == Codec::kInt4) {
    const uint8_t byte = reinterpret_cast<const uint8_t*>(payload)[threadIdx.x / 2];
    v = bm::intDecode(bm::int4Unpack(byte, threadIdx.x % 2 == 1), scale);
  } else {
    v = bm::fp16Decode(reinterpret_cast<const uint16_t*>(payload)[threadIdx.x], scale);
  }
  out[i] = kAdd ? out[i] + v : v;
}

__global__ void encodeBf16(const float* in, size_t count, uint16_t* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = ew::floatToBf16(in[i]);
  }
}

template <bool kAdd>
__global__ void decodeBf16(const uint16_t* in, size_t count, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = ew::bf16ToFloat(in[i]);
    out[i] = kAdd ? out[i] + v : v;
  }
}

unsigned codecBlocks(size_t count) {
  return static_cast<unsigned>((count + kCodecBlock - 1) / kCodecBlock);
}

unsigned elementBlocks(size_t count) {
  size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

void checkLaunch(const char* what, Codec codec) {
  cudaError_t err = cudaGetLastError();
  RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda ", what, " (", codecName(codec), "): ",
                 cudaGetErrorString(err));
}

template <bool kAdd>
void decodeAny(Codec codec, const void* in, size_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  const char* bytes = static_cast<const char*>(in);
  switch (codec) {
    case Codec::kInt8:
      decodeBlocks<Codec::kInt8, kAdd><<<codecBlocks(count), kThreads, 0, stream>>>(bytes, count, out);
      break;
    case Codec::kInt4:
      decodeBlocks<Codec::kInt4, kAdd><<<codecBlocks(count), kThreads, 0, stream>>>(bytes, count, out);
      break;
    case Codec::kFp16:
      decodeBlocks<Codec::kFp16, kAdd><<<codecBlocks(count), kThreads, 0, stream>>>(bytes, count, out);
      break;
    case Codec::kBf16:
      decodeBf16<kAdd><<<elementBlocks(count), kThreads, 0, stream>>>(
          reinterpret_cast<const uint16_t*>(bytes), count, out);
      break;
  }
  checkLaunch(kAdd ? "decode_add" : "decode", codec);
}

}  // namespace

void encode(Codec codec, const float* in, size_t count, void* out, cudaStream_t stream) {
  encodedBytes(codec, count);  // rejects an unknown codec like the CPU path
  if (count == 0) return;
  char* bytes = static_cast<char*>(out);
  switch (codec) {
    case Codec::kInt8:
      encodeBlocks<Codec::kInt8><<<codecBlocks(count), kThreads, 0, stream>>>(in, count, bytes);
      break;
    case Codec::kInt4:
      encodeBlocks<Codec::kInt4><<<codecBlocks(count), kThreads, 0, stream>>>(in, count, bytes);
      break;
    case Codec::kFp16:
      encodeBlocks<Codec::kFp16><<<codecBlocks(count), kThreads, 0, stream>>>(in, count, bytes);
      break;
    case Codec::kBf16:
      encodeBf16<<<elementBlocks(count), kThreads, 0, stream>>>(in, count,
                                                                 reinterpret_cast<uint16_t*>(bytes));
      break;
  }
  checkLaunch("encode", codec);
}

void decode(Codec codec, const void* in, size_t count, float* out, cudaStream_t stream) {
  encodedBytes(codec, count);
  decodeAny<false>(codec, in, count, out, stream);
}

void decodeAdd(Codec codec, const void* in, size_t count, float* acc, cudaStream_t stream) {
  encodedBytes(codec, count);
  decodeAny<true>(codec, in, count, acc, stream);
}

}  // namespace cuda
}  // namespace ringdist
