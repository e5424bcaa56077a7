#pragma once

namespace ringdist {

// CPU features, detected once from cpuid. Kernels come in two families: a
// baseline x86-64 build and one compiled for AVX2+FMA+F16C (the same gate
// for the reduce, codec and top-k kernels, so a machine runs one family).
struct CpuFeatures {
  bool avx2Family;  // AVX2, FMA and F16C together
  bool sse42;       // crc32 instructions
};

const CpuFeatures& cpuFeatures();

// "avx2" or "generic": the kernel family this CPU runs.
const char* kernelFamily();

}  // namespace ringdist
