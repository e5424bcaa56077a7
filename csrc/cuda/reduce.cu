// One grid-stride kernel per (dtype, op), instantiated from the element
// functions of csrc/reduce/elementwise.h; the dispatch mirrors the CPU's
// reduceFunction (same pairs supported, same bool mapping). Compiled with
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

template <typename T, typename Op>
__global__ void combineKernel(T* dst, const T* a, const T* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = ew::combine<T, Op>(a[i], b[i]);
  }
}

template <typename Half, typename Op>
__global__ void combineHalfKernel(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = ew::combineHalf<Half, Op>(a[i], b[i]);
  }
}

template <typename T>
__global__ void divideKernel(T* data, size_t n, T divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = static_cast<T>(data[i] / divisor);
  }
}

template <typename Half>
__global__ void divideHalfKernel(uint16_t* data, size_t n, float divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = Half::narrow(Half::widen(data[i]) / divisor);
  }
}

unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

void checkLaunch(const char* what) {
  cudaError_t err = cudaGetLastError();
  RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda ", what, ": ", cudaGetErrorString(err));
}

template <typename T, typename Op>
void launch(void* dst, const void* a, const void* b, size_t n, cudaStream_t stream) {
  combineKernel<T, Op><<<blocksFor(n), kThreads, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

template <typename Half, typename Op>
void launchHalf(void* dst, const void* a, const void* b, size_t n, cudaStream_t stream) {
  combineHalfKernel<Half, Op><<<blocksFor(n), kThreads, 0, stream>>>(
      static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
      static_cast<const uint16_t*>(b), n);
}

template <typename Op>
bool launchFor(DataType dtype, void* dst, const void* a, const void* b, size_t n,
               cudaStream_t stream) {
  constexpr bool kBitwise = std::is_same<Op, ew::And>::value || std::is_same<Op, ew::Or>::value ||
      std::is_same<Op, ew::Xor>::value;
  if constexpr (!kBitwise) {
    switch (dtype) {
      case DataType::kFloat32: launch<float, Op>(dst, a, b, n, stream); return true;
      case DataType::kFloat64: launch<double, Op>(dst, a, b, n, stream); return true;
      case DataType::kFloat16: launchHalf<ew::Fp16Bits, Op>(dst, a, b, n, stream); return true;
      case DataType::kBFloat16: launchHalf<ew::Bf16Bits, Op>(dst, a, b, n, stream); return true;
      default: break;
    }
  }
  switch (dtype) {
    case DataType::kInt8: launch<int8_t, Op>(dst, a, b, n, stream); return true;
    case DataType::kUInt8: launch<uint8_t, Op>(dst, a, b, n, stream); return true;
    case DataType::kBool: launch<uint8_t, Op>(dst, a, b, n, stream); return true;
    case DataType::kInt32: launch<int32_t, Op>(dst, a, b, n, stream); return true;
    case DataType::kInt64: launch<int64_t, Op>(dst, a, b, n, stream); return true;
    default: return false;
  }
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
            cudaStream_t stream) {
  reduceFunction(dtype, op);  // the CPU kernels' verdict on the pair: throws if unsupported
  if (count == 0) {
    return;
  }
  if (dtype == DataType::kBool) {  // as the CPU kernels (and NCCL): or / and / xor
    op = op == ReduceOp::kSum || op == ReduceOp::kMax ? ReduceOp::kBor
       : op == ReduceOp::kProduct || op == ReduceOp::kMin ? ReduceOp::kBand : op;
  }
  bool launched = false;
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg:
      launched = launchFor<ew::Sum>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kProduct: launched = launchFor<ew::Prod>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kMin: launched = launchFor<ew::Min>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kMax: launched = launchFor<ew::Max>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kBand: launched = launchFor<ew::And>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kBor: launched = launchFor<ew::Or>(dtype, dst, a, b, count, stream); break;
    case ReduceOp::kBxor: launched = launchFor<ew::Xor>(dtype, dst, a, b, count, stream); break;
  }
  RINGDIST_CHECK(launched, "ringdist cuda reduce: ", reduceOpName(op), " is not supported for ",
                 dataTypeName(dtype));
  checkLaunch("reduce");
}

void divide(DataType dtype, void* data, size_t count, int divisor, cudaStream_t stream) {
  if (count == 0) {
    return;
  }
  const unsigned blocks = blocksFor(count);
  const float d = static_cast<float>(divisor);
  switch (dtype) {
    case DataType::kFloat32:
      divideKernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<float*>(data), count, d); break;
    case DataType::kFloat64:
      divideKernel<double><<<blocks, kThreads, 0, stream>>>(static_cast<double*>(data), count, divisor); break;
    case DataType::kInt8:
      divideKernel<int8_t><<<blocks, kThreads, 0, stream>>>(static_cast<int8_t*>(data), count, divisor); break;
    case DataType::kUInt8:
      divideKernel<uint8_t><<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(data), count, divisor); break;
    case DataType::kInt32:
      divideKernel<int32_t><<<blocks, kThreads, 0, stream>>>(static_cast<int32_t*>(data), count, divisor); break;
    case DataType::kInt64:
      divideKernel<int64_t><<<blocks, kThreads, 0, stream>>>(static_cast<int64_t*>(data), count, divisor); break;
    case DataType::kFloat16:
      divideHalfKernel<ew::Fp16Bits><<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(data), count, d); break;
    case DataType::kBFloat16:
      divideHalfKernel<ew::Bf16Bits><<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(data), count, d); break;
    case DataType::kBool:
      RINGDIST_FAIL("ringdist cuda divide: AVG is not defined for bool tensors");
  }
  checkLaunch("divide");
}

}  // namespace cuda
}  // namespace ringdist
