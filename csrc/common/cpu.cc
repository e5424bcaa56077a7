#include "csrc/common/cpu.h"

#include <algorithm>
#include <cstring>

#if defined(RINGDIST_ARM)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "csrc/common/options.h"

namespace ringdist {

namespace {

CpuFeatures detect() {
#if defined(RINGDIST_X86)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  return {avx2 ? KernelFamily::kAvx2 : KernelFamily::kGeneric,
          static_cast<bool>(__builtin_cpu_supports("sse4.2"))};
#elif defined(RINGDIST_ARM)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  return {(hwcap & HWCAP_ASIMD) != 0 ? KernelFamily::kNeon : KernelFamily::kGeneric,
          (hwcap & HWCAP_CRC32) != 0};
#else
  return {KernelFamily::kGeneric, false};
#endif
}

CpuFeatures& features() {
  static CpuFeatures detected = detect();
  return detected;
}

const char* familyName(KernelFamily family) {
  switch (family) {
    case KernelFamily::kAvx2: return "avx2";
    case KernelFamily::kNeon: return "neon";
    case KernelFamily::kGeneric: break;
  }
  return "generic";
}

}  // namespace

const CpuFeatures& cpuFeatures() { return features(); }

const char* kernelFamily() { return familyName(features().family); }

bool selectKernelFamily(const char* name) {
  const KernelFamily best = detect().family;
  for (KernelFamily family : {KernelFamily::kGeneric, best}) {
    if (std::strcmp(name, familyName(family)) == 0) {
      features().family = family;
      return true;
    }
  }
  return false;
}

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
