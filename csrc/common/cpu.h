#pragma once

#include <cstddef>

#include "torch_ringdist/export.h"

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
TORCH_RINGDIST_API const char* kernelFamily();

// memmove of a large buffer, in pieces of kCopyPieceBytes (options.h) that
// glibc copies with `rep movsb`: on AMD CPUs it switches to a vector loop
// above the L2 size, which ran 25-35% slower here (a 4 MiB allgather's own
// block: 98-106 -> 69-74 us, docs/perf/single_copy.md). Overlap-safe.
void copyBytes(void* dst, const void* src, size_t bytes);

}  // namespace ringdist
