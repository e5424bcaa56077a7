#pragma once

#include <cstddef>
#include <cstdint>

namespace ringdist {

// CRC32C (Castagnoli), hardware-accelerated with SSE4.2 when the CPU has it.
// crc32c(data) == crc32cExtend(0, data); extending continues a running CRC.
uint32_t crc32cExtend(uint32_t crc, const void* data, size_t bytes);
inline uint32_t crc32c(const void* data, size_t bytes) { return crc32cExtend(0, data, bytes); }

}  // namespace ringdist
