#include "csrc/common/cpu.h"

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

}  // namespace ringdist
