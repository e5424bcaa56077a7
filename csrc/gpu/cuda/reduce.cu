// One grid-stride kernel per (element type, op), instantiated from the
// element functions of csrc/reduce/elementwise.h through its visitors; the
// pairs supported and the bool mapping are the CPU's (reduceFunction,
// boolReduceOp). Compiled with
// -fmad=false so no multiply-add is fused behind the shared arithmetic's back.
#include "csrc/gpu/cuda/reduce.h"

#include <algorithm>
#include <cstdint>

#include "csrc/common/error.h"
#include "csrc/reduce/elementwise.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {
namespace cuda {

namespace {

namespace ew = elementwise;

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU; larger counts loop in the kernel.
constexpr size_t kMaxBlocks = 4096;

template <typename T, typename Op, typename S = typename ew::Storage<T>::type>
__global__ void combineKernel(S* dst, const S* a, const S* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = ew::apply<T, Op>(a[i], b[i]);
  }
}

// The same, 16 bytes per load and store (8 halves, 4 floats...): the halves
// otherwise reach only ~60-70% of copy bandwidth with 2-byte accesses.
// Pointers 16-byte aligned; `vectors` counts 16-byte groups.
template <typename T, typename Op, typename S = typename ew::Storage<T>::type>
__global__ void combineVectorKernel(uint4* dst, const uint4* a, const uint4* b, size_t vectors) {
  constexpr int kPer = sizeof(uint4) / sizeof(S);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t v = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += stride) {
    const uint4 va = a[v];
    const uint4 vb = b[v];
    uint4 out;
    const S* ea = reinterpret_cast<const S*>(&va);
    const S* eb = reinterpret_cast<const S*>(&vb);
    S* eo = reinterpret_cast<S*>(&out);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      eo[k] = ew::apply<T, Op>(ea[k], eb[k]);
    }
    dst[v] = out;
  }
}

template <typename T, typename S = typename ew::Storage<T>::type>
__global__ void divideKernel(S* data, size_t n, int divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = ew::divide<T>(data[i], divisor);
  }
}

unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

void checkLaunch(const char* what) {
  cudaError_t err = cudaGetLastError();
  RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda ", what, ": ", cudaGetErrorString(err));
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
            cudaStream_t stream) {
  visitReduction(dtype, op, [&](auto elementTag, auto opTag) {
    using T = typename decltype(elementTag)::type;
    using Op = typename decltype(opTag)::type;
    using S = typename ew::Storage<T>::type;
    constexpr size_t kPer = sizeof(uint4) / sizeof(S);
    const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(a) |
                           reinterpret_cast<uintptr_t>(b)) % sizeof(uint4)) == 0;
    const size_t vectors = aligned ? count / kPer : 0;
    if (vectors > 0) {
      combineVectorKernel<T, Op><<<blocksFor(vectors), kThreads, 0, stream>>>(
          static_cast<uint4*>(dst), static_cast<const uint4*>(a), static_cast<const uint4*>(b),
          vectors);
    }
    const size_t done = vectors * kPer;
    if (count > done) {
      combineKernel<T, Op><<<blocksFor(count - done), kThreads, 0, stream>>>(
          static_cast<S*>(dst) + done, static_cast<const S*>(a) + done,
          static_cast<const S*>(b) + done, count - done);
    }
  });
  if (count > 0) {
    checkLaunch("reduce");
  }
}

void divide(DataType dtype, void* data, size_t count, int divisor, cudaStream_t stream) {
  if (count == 0) {
    return;
  }
  RINGDIST_CHECK(dtype != DataType::kBool, "ringdist cuda divide: AVG is not defined for bool tensors");
  ew::visitElementType<ew::Sum>(dtype, [&](auto elementTag) {
    using T = typename decltype(elementTag)::type;
    divideKernel<T><<<blocksFor(count), kThreads, 0, stream>>>(
        static_cast<typename ew::Storage<T>::type*>(data), count, divisor);
  });
  checkLaunch("divide");
}

}  // namespace cuda
}  // namespace ringdist
