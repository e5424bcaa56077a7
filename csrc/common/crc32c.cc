#include "csrc/common/crc32c.h"

#include <cstring>

#include "csrc/common/cpu.h"

#if defined(RINGDIST_X86)
#include <nmmintrin.h>
#define RD_CRC_TARGET __attribute__((target("sse4.2")))
#define RD_CRC64(c, word) _mm_crc32_u64(c, word)
#define RD_CRC8(c, byte) _mm_crc32_u8(c, byte)
#elif defined(RINGDIST_ARM)
#include <arm_acle.h>
#define RD_CRC_TARGET __attribute__((target("+crc")))
#define RD_CRC64(c, word) __crc32cd(static_cast<uint32_t>(c), word)
#define RD_CRC8(c, byte) __crc32cb(c, byte)
#endif

namespace ringdist {

namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli polynomial

struct Table {
  uint32_t entries[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) {
        c = (c & 1) != 0 ? (c >> 1) ^ kPolynomial : c >> 1;
      }
      entries[i] = c;
    }
  }
};

uint32_t software(uint32_t crc, const uint8_t* p, size_t n) {
  static const Table table;
  for (size_t i = 0; i < n; ++i) {
    crc = table.entries[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  }
  return crc;
}

#if defined(RD_CRC_TARGET)
// The CRC32C instructions (SSE4.2, aarch64's CRC32 extension): 8 bytes a step.
RD_CRC_TARGET uint32_t hardware(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = RD_CRC64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) {
    c32 = RD_CRC8(c32, *p);
  }
  return c32;
}
#else
uint32_t hardware(uint32_t crc, const uint8_t* p, size_t n) { return software(crc, p, n); }
#endif

}  // namespace

uint32_t crc32cExtend(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  crc = cpuFeatures().crc32 ? hardware(crc, p, bytes) : software(crc, p, bytes);
  return ~crc;
}

}  // namespace ringdist
