#include "csrc/common/cpu.h"

#include <algorithm>
#include <cstring>

#include "csrc/common/options.h"

namespace ringdist {

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures features{
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
          __builtin_cpu_supports("f16c"),
      static_cast<bool>(__builtin_cpu_supports("sse4.2")),
  };
  return features;
}

const char* kernelFamily() { return cpuFeatures().avx2Family ? "avx2" : "generic"; }

void copyBytes(void* dst, const void* src, size_t bytes) {
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  if (to > from && to < from + bytes) {  // overlapping, destination after: last piece first
    for (size_t end = bytes; end > 0;) {
      const size_t piece = std::min(end, kCopyPieceBytes);
      end -= piece;
      std::memmove(to + end, from + end, piece);
    }
    return;
  }
  for (size_t at = 0; at < bytes; at += kCopyPieceBytes) {
    std::memmove(to + at, from + at, std::min(kCopyPieceBytes, bytes - at));
  }
}

}  // namespace ringdist
