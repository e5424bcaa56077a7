#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringdist {

// Lossy wire codecs for compressed allreduce. Values are float32 in memory;
// only the wire carries the narrow form, and every sum is taken in float32.
//
// Terms:
//   block          kCodecBlock consecutive elements, counted from the start of
//                  the buffer being encoded (the last block may be shorter).
//                  Block-scaled codecs store one float32 scale per block.
//   encoded block  [scale (4 bytes, block-scaled codecs only)][payload].
//   aligned piece  a range of a buffer that starts on a block boundary. An
//                  aligned piece encodes to exactly the bytes it has inside
//                  the whole buffer's encoding, at offset encodedBytes(start),
//                  so a buffer can be cut into chunks and segments freely.
//
// Codecs:
//   fp16  float16 payload with a power-of-two scale per block chosen so the
//         block's largest magnitude lands in [2^14, 2^15): no overflow for
//         any finite float32, no underflow for values within 2^-29 of their
//         block's maximum. The scale is exact, so the only error is fp16
//         rounding (relative 2^-11). 2.016 bytes per element.
//   bf16  bfloat16 payload, round to nearest even; same range as float32.
//         2 bytes per element.
//   int8  int8 payload, scale = block max |x| / 127, round to nearest; error
//         at most half a step (max|x| / 254) per element. 1.016 bytes per
//         element (0.254x of float32).
//   int4  4-bit two's-complement payload in [-7, 7], two per byte (element
//         2k of a block in the low nibble of payload byte k, a zero nibble
//         after an odd last element), scale = block max |x| / 7, round to
//         nearest even; error at most max|x| / 14 per element. 0.516 bytes
//         per element (0.129x of float32): for DiLoCo's pseudo-gradients,
//         where error feedback carries what it loses into the next round.
// A NaN or infinity in a block of a block-scaled codec turns the whole
// decoded block into NaN (it is never silently dropped); bf16 keeps them per
// element.
enum class Codec : uint8_t {
  kFp16 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kInt4 = 4,
};

// Elements sharing one scale: 4 scale bytes per 256 elements cost under 2%
// of the payload, while a block stays small enough that one outlier degrades
// only its own neighbourhood.
constexpr size_t kCodecBlock = 256;

const char* codecName(Codec codec);
// False for an unknown name ("fp16", "bf16", "int8", "int4" are known).
bool codecFromName(const std::string& name, Codec* out);
bool isKnownCodec(uint8_t value);

// Bytes of the encoding of `count` elements (count from a block boundary).
size_t encodedBytes(Codec codec, size_t count);

// out (encodedBytes(codec, count) bytes) = encoding of in[0..count).
void encode(Codec codec, const float* in, size_t count, void* out);
// out[i] = decoded value i.
void decode(Codec codec, const void* in, size_t count, float* out);
// acc[i] += decoded value i (float32 accumulation).
void decodeAdd(Codec codec, const void* in, size_t count, float* acc);
// out[i] = decode(encode(in))[i]: what a rank's contribution becomes on the
// wire (error feedback keeps in - out). out may alias in.
void roundTrip(Codec codec, const float* in, size_t count, float* out);
// err[i] = in[i] - decode(encode(in))[i]. err may alias in.
void roundTripError(Codec codec, const float* in, size_t count, float* err);

}  // namespace ringdist
