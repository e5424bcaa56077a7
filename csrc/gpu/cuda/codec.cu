// Codec kernels. Block-scaled codecs (int8, int4, fp16): the full codec
// blocks of 16-byte aligned values run one warp each, several per thread
// block, each lane holding 8 consecutive values (two 16-byte loads); the
// warp finds the largest magnitude (an exact max, so order does not matter)
// and whether everything is finite, lane 0 writes the scale, and each lane
// writes its values' encoding with 4-byte stores (a block's payload follows
// its 4-byte scale, so it is 4-byte aligned). A last partial block, and
// unaligned values, run one thread block of kCodecBlock threads per codec
// block, a thread per element (int4: even threads write a byte holding their
// odd neighbour's nibble too). bf16 is element-wise, 8 values per thread where
// aligned. All arithmetic is
// csrc/codec/block_math.h, compiled with -fmad=false, so both kernels give
// the same bytes.
#include "csrc/gpu/cuda/codec.h"

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

// Encoded buffers are byte tensors that may start at any offset: the
// element-wise kernels move the 4-byte scale and 16-bit values a byte at a time
// (little-endian, the CPU codec's layout); a typed access there faults.
__device__ uint32_t loadBytes(const char* p, int n) {
  uint32_t w = 0;
  for (int b = 0; b < n; ++b) w |= static_cast<uint32_t>(static_cast<uint8_t>(p[b])) << (8 * b);
  return w;
}

__device__ void storeBytes(char* p, uint32_t w, int n) {
  for (int b = 0; b < n; ++b) p[b] = static_cast<char>((w >> (8 * b)) & 0xffu);
}

__device__ float loadScale(const char* p) { return __uint_as_float(loadBytes(p, 4)); }
__device__ void storeScale(char* p, float s) { storeBytes(p, __float_as_uint(s), 4); }

constexpr int kPerLane = static_cast<int>(kCodecBlock) / 32;  // 8 values
constexpr int kBlocksPerCta = 8;                               // codec blocks (warps) per thread block

// Largest magnitude (NaNs skipped, as fmaxf does) and finiteness of the warp's 256 values.
__device__ Stats warpStats(const float (&x)[kPerLane]) {
  float m = fabsf(x[0]);
  bool finite = isfinite(x[0]);
  for (int k = 1; k < kPerLane; ++k) {
    m = fmaxf(m, fabsf(x[k]));
    finite = finite && isfinite(x[k]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  return {m, __all_sync(0xffffffffu, finite) != 0};
}

// The 4-byte words of a lane's encoding: int8 2, int4 1, fp16 4.
template <Codec kCodec>
constexpr int kWordsPerLane = kCodec == Codec::kInt8 ? 2 : kCodec == Codec::kInt4 ? 1 : 4;

template <Codec kCodec>
__global__ void encodeWarps(const float4* in, size_t blocks, char* out) {
  const size_t b = static_cast<size_t>(blockIdx.x) * kBlocksPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  const int lane = threadIdx.x % 32;
  float x[kPerLane];
  const float4* mine = in + (b * kCodecBlock + static_cast<size_t>(lane) * kPerLane) / 4;
  *reinterpret_cast<float4*>(&x[0]) = mine[0];
  *reinterpret_cast<float4*>(&x[4]) = mine[1];
  const Stats st = warpStats(x);
  char* block = out + b * fullBlockBytes(kCodec);
  uint32_t words[kWordsPerLane<kCodec>];
  if (kCodec == Codec::kFp16) {
    const bm::Fp16Scales s = bm::fp16Scales(st.maxAbs, st.finite);
    if (lane == 0) *reinterpret_cast<float*>(block) = s.scale;
    for (int k = 0; k < kPerLane; k += 2) {
      words[k / 2] = static_cast<uint32_t>(bm::fp16Encode(x[k], s.up)) |
                     static_cast<uint32_t>(bm::fp16Encode(x[k + 1], s.up)) << 16;
    }
  } else {
    const float levels = kCodec == Codec::kInt8 ? bm::kInt8Levels : bm::kInt4Levels;
    const bm::IntScales s = bm::intScales(st.maxAbs, st.finite, levels);
    if (lane == 0) *reinterpret_cast<float*>(block) = s.scale;
    int8_t q[kPerLane];
    for (int k = 0; k < kPerLane; ++k) q[k] = bm::intEncode(x[k], s.inverse, levels);
    if (kCodec == Codec::kInt8) {
      for (int w = 0; w < 2; ++w) {
        uint32_t word = 0;
        for (int j = 0; j < 4; ++j) word |= static_cast<uint32_t>(static_cast<uint8_t>(q[4 * w + j])) << (8 * j);
        words[w] = word;
      }
    } else {
      uint32_t word = 0;
      for (int j = 0; j < 4; ++j) word |= static_cast<uint32_t>(bm::int4Pack(q[2 * j], q[2 * j + 1])) << (8 * j);
      words[0] = word;
    }
  }
  uint32_t* payload = reinterpret_cast<uint32_t*>(block + kScaleBytes) + lane * kWordsPerLane<kCodec>;
  for (int w = 0; w < kWordsPerLane<kCodec>; ++w) payload[w] = words[w];
}

template <Codec kCodec, bool kAdd>
__global__ void decodeWarps(const char* in, size_t blocks, float4* out) {
  const size_t b = static_cast<size_t>(blockIdx.x) * kBlocksPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  const int lane = threadIdx.x % 32;
  const char* block = in + b * fullBlockBytes(kCodec);
  const float scale = *reinterpret_cast<const float*>(block);
  const uint32_t* payload = reinterpret_cast<const uint32_t*>(block + kScaleBytes) + lane * kWordsPerLane<kCodec>;
  uint32_t words[kWordsPerLane<kCodec>];
  for (int w = 0; w < kWordsPerLane<kCodec>; ++w) words[w] = payload[w];
  float v[kPerLane];
  for (int k = 0; k < kPerLane; ++k) {
    if (kCodec == Codec::kInt8) {
      v[k] = bm::intDecode(static_cast<int8_t>(words[k / 4] >> (8 * (k % 4))), scale);
    } else if (kCodec == Codec::kInt4) {
      v[k] = bm::intDecode(bm::int4Unpack(static_cast<uint8_t>(words[0] >> (8 * (k / 2))), k % 2 == 1), scale);
    } else {
      v[k] = bm::fp16Decode(static_cast<uint16_t>(words[k / 2] >> (16 * (k % 2))), scale);
    }
  }
  float4* mine = out + (b * kCodecBlock + static_cast<size_t>(lane) * kPerLane) / 4;
  for (int h = 0; h < 2; ++h) {
    float4 r = make_float4(v[4 * h], v[4 * h + 1], v[4 * h + 2], v[4 * h + 3]);
    if (kAdd) {
      const float4 a = mine[h];
      r = make_float4(a.x + r.x, a.y + r.y, a.z + r.z, a.w + r.w);
    }
    mine[h] = r;
  }
}

// One codec block per thread block, a thread per element: the last partial
// block, and values that are not 16-byte aligned.
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
    if (threadIdx.x == 0) storeScale(block, s.scale);
    if (present) storeBytes(payload + 2 * threadIdx.x, bm::fp16Encode(x, s.up), 2);
    return;
  }
  const float levels = kCodec == Codec::kInt8 ? bm::kInt8Levels : bm::kInt4Levels;
  const bm::IntScales s = bm::intScales(st.maxAbs, st.finite, levels);
  if (threadIdx.x == 0) storeScale(block, s.scale);
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
  const float scale = loadScale(block);
  const char* payload = block + kScaleBytes;
  float v;
  if (kCodec == Codec::kInt8) {
    v = bm::intDecode(reinterpret_cast<const int8_t*>(payload)[threadIdx.x], scale);
  } else if (kCodec == Codec::kInt4) {
    const uint8_t byte = reinterpret_cast<const uint8_t*>(payload)[threadIdx.x / 2];
    v = bm::intDecode(bm::int4Unpack(byte, threadIdx.x % 2 == 1), scale);
  } else {
    v = bm::fp16Decode(static_cast<uint16_t>(loadBytes(payload + 2 * threadIdx.x, 2)), scale);
  }
  out[i] = kAdd ? out[i] + v : v;
}

// 8 values per thread, two 16-byte loads and one 16-byte store (aligned pointers).
__global__ void encodeBf16x8(const float4* in, size_t groups, uint4* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const float4 a = in[2 * g];
    const float4 b = in[2 * g + 1];
    auto pair = [](float lo, float hi) {
      return static_cast<uint32_t>(ew::floatToBf16(lo)) | static_cast<uint32_t>(ew::floatToBf16(hi)) << 16;
    };
    out[g] = make_uint4(pair(a.x, a.y), pair(a.z, a.w), pair(b.x, b.y), pair(b.z, b.w));
  }
}

template <bool kAdd>
__global__ void decodeBf16x8(const uint4* in, size_t groups, float4* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const uint4 w = in[g];
    auto lo = [](uint32_t word) { return ew::bf16ToFloat(static_cast<uint16_t>(word)); };
    auto hi = [](uint32_t word) { return ew::bf16ToFloat(static_cast<uint16_t>(word >> 16)); };
    float4 r0 = make_float4(lo(w.x), hi(w.x), lo(w.y), hi(w.y));
    float4 r1 = make_float4(lo(w.z), hi(w.z), lo(w.w), hi(w.w));
    if (kAdd) {
      const float4 a = out[2 * g];
      const float4 b = out[2 * g + 1];
      r0 = make_float4(a.x + r0.x, a.y + r0.y, a.z + r0.z, a.w + r0.w);
      r1 = make_float4(b.x + r1.x, b.y + r1.y, b.z + r1.z, b.w + r1.w);
    }
    out[2 * g] = r0;
    out[2 * g + 1] = r1;
  }
}

__global__ void encodeBf16(const float* in, size_t count, char* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    storeBytes(out + 2 * i, ew::floatToBf16(in[i]), 2);
  }
}

template <bool kAdd>
__global__ void decodeBf16(const char* in, size_t count, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = ew::bf16ToFloat(static_cast<uint16_t>(loadBytes(in + 2 * i, 2)));
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

bool aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

// bf16: groups of 8 values 16 bytes at a time where both pointers allow, the rest one by one.
void encodeBf16Any(const float* in, size_t count, char* out, cudaStream_t stream) {
  const size_t groups = aligned(in, 16) && aligned(out, 16) ? count / 8 : 0;
  if (groups > 0) {
    encodeBf16x8<<<elementBlocks(groups), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(in), groups, reinterpret_cast<uint4*>(out));
  }
  if (count > 8 * groups) {
    encodeBf16<<<elementBlocks(count - 8 * groups), kThreads, 0, stream>>>(
        in + 8 * groups, count - 8 * groups, out + 16 * groups);
  }
}

template <bool kAdd>
void decodeBf16Any(const char* in, size_t count, float* out, cudaStream_t stream) {
  const size_t groups = aligned(in, 16) && aligned(out, 16) ? count / 8 : 0;
  if (groups > 0) {
    decodeBf16x8<kAdd><<<elementBlocks(groups), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(in), groups, reinterpret_cast<float4*>(out));
  }
  if (count > 8 * groups) {
    decodeBf16<kAdd><<<elementBlocks(count - 8 * groups), kThreads, 0, stream>>>(
        in + 16 * groups, count - 8 * groups, out + 8 * groups);
  }
}

// The full codec blocks by warps where the pointers allow, the rest a thread
// per element (the encoded blocks are laid out back to back, so the rest
// starts at its block's offset).
template <Codec kCodec>
void encodeBlockScaled(const float* in, size_t count, char* out, cudaStream_t stream) {
  const size_t full = aligned(in, 16) && aligned(out, 4) ? count / kCodecBlock : 0;
  if (full > 0) {
    encodeWarps<kCodec><<<static_cast<unsigned>((full + kBlocksPerCta - 1) / kBlocksPerCta),
                          32 * kBlocksPerCta, 0, stream>>>(reinterpret_cast<const float4*>(in), full,
                                                           out);
  }
  const size_t done = full * kCodecBlock;
  if (count > done) {
    encodeBlocks<kCodec><<<codecBlocks(count - done), kThreads, 0, stream>>>(
        in + done, count - done, out + full * fullBlockBytes(kCodec));
  }
}

template <Codec kCodec, bool kAdd>
void decodeBlockScaled(const char* in, size_t count, float* out, cudaStream_t stream) {
  const size_t full = aligned(in, 4) && aligned(out, 16) ? count / kCodecBlock : 0;
  if (full > 0) {
    decodeWarps<kCodec, kAdd><<<static_cast<unsigned>((full + kBlocksPerCta - 1) / kBlocksPerCta),
                                32 * kBlocksPerCta, 0, stream>>>(in, full,
                                                                 reinterpret_cast<float4*>(out));
  }
  const size_t done = full * kCodecBlock;
  if (count > done) {
    decodeBlocks<kCodec, kAdd><<<codecBlocks(count - done), kThreads, 0, stream>>>(
        in + full * fullBlockBytes(kCodec), count - done, out + done);
  }
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
      decodeBlockScaled<Codec::kInt8, kAdd>(bytes, count, out, stream);
      break;
    case Codec::kInt4:
      decodeBlockScaled<Codec::kInt4, kAdd>(bytes, count, out, stream);
      break;
    case Codec::kFp16:
      decodeBlockScaled<Codec::kFp16, kAdd>(bytes, count, out, stream);
      break;
    case Codec::kBf16:
      decodeBf16Any<kAdd>(bytes, count, out, stream);
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
      encodeBlockScaled<Codec::kInt8>(in, count, bytes, stream);
      break;
    case Codec::kInt4:
      encodeBlockScaled<Codec::kInt4>(in, count, bytes, stream);
      break;
    case Codec::kFp16:
      encodeBlockScaled<Codec::kFp16>(in, count, bytes, stream);
      break;
    case Codec::kBf16:
      encodeBf16Any(in, count, bytes, stream);
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
