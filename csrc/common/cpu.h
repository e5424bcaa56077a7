#pragma once

#include <cstddef>
#include <cstdint>

#include "torch_ringdist/export.h"

// Which architecture this build is for: the kernels' vector family exists on
// x86-64 (AVX2) and aarch64 (NEON); other Linux targets build the generic one.
#if defined(__x86_64__)
#define RINGDIST_X86 1
#elif defined(__aarch64__)
#define RINGDIST_ARM 1
#endif

namespace ringdist {

// The CPU kernels come in two families, the same for the reduce, codec and
// top-k kernels, so a machine runs one family: "generic" (portable C++ built
// for the architecture's baseline) and a vector family, "avx2" on x86-64
// (AVX2+FMA+F16C) or "neon" on aarch64. Both compute every element with the
// shared arithmetic (reduce/elementwise.h, codec/block_math.h), in the same
// order, so they give the same bits.
enum class KernelFamily : uint8_t { kGeneric, kAvx2, kNeon };

struct CpuFeatures {
  KernelFamily family;  // the best family this CPU runs
  bool crc32;           // CRC32C instructions: SSE4.2 on x86-64, the CRC32 extension on aarch64
};

// Detected once (cpuid on x86-64, the auxiliary vector on aarch64).
const CpuFeatures& cpuFeatures();

// Whether the vector family runs (every kernel dispatches on this).
inline bool useVectorKernels() { return cpuFeatures().family != KernelFamily::kGeneric; }

// "avx2", "neon" or "generic": the kernel family this CPU runs.
TORCH_RINGDIST_API const char* kernelFamily();

// Tests and benchmarks: run `name`'s family from now on ("generic", or this
// CPU's vector family); false if this CPU cannot. Not thread-safe: call it
// before kernels run on other threads.
TORCH_RINGDIST_API bool selectKernelFamily(const char* name);

// memmove of a large buffer, in pieces of kCopyPieceBytes (options.h) that
// glibc copies with `rep movsb`: on AMD CPUs it switches to a vector loop
// above the L2 size, which ran 25-35% slower here (a 4 MiB allgather's own
// block: 98-106 -> 69-74 us, benchmarks/notes/single_copy.md). Overlap-safe.
void copyBytes(void* dst, const void* src, size_t bytes);

}  // namespace ringdist
