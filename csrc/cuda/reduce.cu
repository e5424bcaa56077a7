// One grid-stride kernel per (element type, op), instantiated from the
// element functions of csrc/reduce/elementwise.h through its visitors; the
// pairs supported and the bool mapping are the CPU's (reduceFunction,
// boolReduceOp). Compiled with
// -fmad=false so no multiply-add is fused behind the shared arithmetic's back.
#include "csrc/cuda/reduce.h"

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
    if (count > 0) {
      combineKernel<T, Op><<<blocksFor(count), kThreads, 0, stream>>>(
          static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), count);
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
