#include "csrc/backend/testing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "csrc/backend/dtypes.h"
#include "csrc/common/cpu.h"
#include "csrc/codec/codec.h"
#include "csrc/collectives/ring.h"
#include "csrc/codec/elementwise_codec.h"
#include "csrc/reduce/elementwise.h"
#include "csrc/topk/topk_math.h"
#ifdef RINGDIST_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "csrc/gpu/cuda/codec.h"
#include "csrc/gpu/cuda/reduce.h"
#endif
#include "csrc/reduce/half.h"
#include "csrc/reduce/reduce.h"

namespace ringdist::testing {

ReduceOp opFromName(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                      ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    if (name == reduceOpName(op)) return op;
  }
  TORCH_CHECK(false, "ringdist testing: unknown reduce op '", name, "'");
}

namespace {

namespace ew = elementwise;

void checkPair(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device().is_cpu() && a.is_contiguous() && b.is_contiguous() &&
                  a.scalar_type() == b.scalar_type() && a.numel() == b.numel(),
              "ringdist testing: expected two contiguous CPU tensors of one dtype and size");
}

#ifdef RINGDIST_CUDA
DataType cudaOperandType(const at::Tensor& t) {
  DataType dtype;
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && toDataType(t.scalar_type(), &dtype),
              "ringdist testing: expected a contiguous CUDA tensor of a supported dtype");
  return dtype;
}
#endif

}  // namespace

// The CPU kernel the collectives use: reduceFunction(dtype, op).
at::Tensor reduceWithKernel(const at::Tensor& a, const at::Tensor& b, const std::string& opName) {
  checkPair(a, b);
  DataType dtype;
  TORCH_CHECK(toDataType(a.scalar_type(), &dtype), "ringdist testing: unsupported dtype");
  at::Tensor out = at::empty_like(a);
  reduceFunction(dtype, opFromName(opName))(out.data_ptr(), a.data_ptr(), b.data_ptr(),
                                            static_cast<size_t>(a.numel()));
  return out;
}

// The same reduction, one element at a time through elementwise.h (what the
// CUDA kernels compute), with the CPU's verdict on (dtype, op) and its bool
// mapping.
at::Tensor reduceWithShared(const at::Tensor& a, const at::Tensor& b, const std::string& opName) {
  checkPair(a, b);
  DataType dtype;
  TORCH_CHECK(toDataType(a.scalar_type(), &dtype), "ringdist testing: unsupported dtype");
  at::Tensor out = at::empty_like(a);
  const int64_t n = a.numel();
  visitReduction(dtype, opFromName(opName), [&](auto elementTag, auto opTag) {
    using T = typename decltype(elementTag)::type;
    using Op = typename decltype(opTag)::type;
    using S = typename ew::Storage<T>::type;
    const S* x = static_cast<const S*>(a.data_ptr());
    const S* y = static_cast<const S*>(b.data_ptr());
    S* d = static_cast<S*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) d[i] = ew::apply<T, Op>(x[i], y[i]);
  });
  return out;
}

// float32 -> fp16/bf16 bits and back: the CPU kernels' conversion
// (half.h: F16C on x86) or the shared bit arithmetic.
at::Tensor narrow(const at::Tensor& f, const std::string& to, bool shared) {
  TORCH_CHECK(f.scalar_type() == at::kFloat && f.is_contiguous() && f.device().is_cpu(),
              "ringdist testing: expected a contiguous float32 CPU tensor");
  TORCH_CHECK(to == "fp16" || to == "bf16", "ringdist testing: narrow to fp16 or bf16");
  at::Tensor out = at::empty(f.sizes(), f.options().dtype(at::kShort));
  const float* in = f.data_ptr<float>();
  auto* h = reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>());
  const size_t n = static_cast<size_t>(f.numel());
  if (to == "bf16") {
    for (size_t i = 0; i < n; ++i) h[i] = shared ? ew::floatToBf16(in[i]) : half::floatToBf16(in[i]);
  } else if (shared) {
    for (size_t i = 0; i < n; ++i) h[i] = ew::floatToFp16(in[i]);
  } else {
    half::Fp16::narrow(h, in, n);
  }
  return out;
}

at::Tensor widen(const at::Tensor& bits, const std::string& from, bool shared) {
  TORCH_CHECK(bits.scalar_type() == at::kShort && bits.is_contiguous() && bits.device().is_cpu(),
              "ringdist testing: expected a contiguous int16 CPU tensor of fp16/bf16 bits");
  TORCH_CHECK(from == "fp16" || from == "bf16", "ringdist testing: widen from fp16 or bf16");
  at::Tensor out = at::empty(bits.sizes(), bits.options().dtype(at::kFloat));
  const auto* h = reinterpret_cast<const uint16_t*>(bits.data_ptr<int16_t>());
  float* f = out.data_ptr<float>();
  const size_t n = static_cast<size_t>(bits.numel());
  if (from == "bf16") {
    for (size_t i = 0; i < n; ++i) f[i] = shared ? ew::bf16ToFloat(h[i]) : half::bf16ToFloat(h[i]);
  } else if (shared) {
    for (size_t i = 0; i < n; ++i) f[i] = ew::fp16ToFloat(h[i]);
  } else {
    half::Fp16::widen(f, h, n);
  }
  return out;
}

// The GPU reduce kernel (csrc/gpu/cuda/reduce.cu) on the caller's current stream.
at::Tensor reduceWithCudaKernel(const at::Tensor& a, const at::Tensor& b, const std::string& opName) {
#ifdef RINGDIST_CUDA
  const DataType dtype = cudaOperandType(a);
  TORCH_CHECK(b.device() == a.device() && b.scalar_type() == a.scalar_type() &&
                  b.numel() == a.numel() && b.is_contiguous(),
              "ringdist testing: b must match a (device, dtype, size)");
  c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty_like(a);
  cuda::reduce(dtype, opFromName(opName), out.data_ptr(), a.data_ptr(), b.data_ptr(),
               static_cast<size_t>(a.numel()), c10::cuda::getCurrentCUDAStream().stream());
  return out;
#else
  TORCH_CHECK(false, "ringdist testing: this build of ringdist has no CUDA kernels");
#endif
}

at::Tensor divideWithCudaKernel(const at::Tensor& x, int64_t divisor) {
#ifdef RINGDIST_CUDA
  const DataType dtype = cudaOperandType(x);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = x.clone();
  cuda::divide(dtype, out.data_ptr(), static_cast<size_t>(out.numel()), static_cast<int>(divisor),
               c10::cuda::getCurrentCUDAStream().stream());
  return out;
#else
  TORCH_CHECK(false, "ringdist testing: this build of ringdist has no CUDA kernels");
#endif
}

at::Tensor divideWithKernel(const at::Tensor& x, int64_t divisor) {
  DataType dtype;
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && toDataType(x.scalar_type(), &dtype),
              "ringdist testing: expected a contiguous CPU tensor of a supported dtype");
  at::Tensor out = x.clone();
  divideInPlace(out.data_ptr(), static_cast<size_t>(out.numel()), dtype, static_cast<int>(divisor));
  return out;
}

// ---------------------------------------------------------------- codecs

// impl: "cpu" (the CPU codec kernels), "shared" (block_math.h on the host)
// or "cuda" (the GPU kernels; tensors on the GPU, current stream).
at::Tensor codecEncode(const at::Tensor& x, const std::string& name, const std::string& impl) {
  const Codec codec = parseCodec(name);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(),
              "ringdist testing: expected a contiguous float32 tensor");
  const size_t n = static_cast<size_t>(x.numel());
  at::Tensor out = at::empty({static_cast<int64_t>(encodedBytes(codec, n))},
                             x.options().dtype(at::kByte));
  if (impl == "cuda") {
#ifdef RINGDIST_CUDA
    TORCH_CHECK(x.is_cuda(), "ringdist testing: impl='cuda' needs a CUDA tensor");
    c10::cuda::CUDAGuard guard(x.device());
    cuda::encode(codec, x.data_ptr<float>(), n, out.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
    return out;
#else
    TORCH_CHECK(false, "ringdist testing: this build of ringdist has no CUDA kernels");
#endif
  }
  TORCH_CHECK(x.device().is_cpu() && (impl == "cpu" || impl == "shared"),
              "ringdist testing: impl must be cpu, shared or cuda");
  if (impl == "cpu") {
    encode(codec, x.data_ptr<float>(), n, out.data_ptr());
  } else {
    encodeElementwise(codec, x.data_ptr<float>(), n, static_cast<char*>(out.data_ptr()));
  }
  return out;
}

// Decodes `count` values; into a copy of `acc` (decode-add) when given.
at::Tensor codecDecode(const at::Tensor& bytes, const std::string& name, int64_t count,
                       const std::string& impl, std::optional<at::Tensor> acc) {
  const Codec codec = parseCodec(name);
  const size_t n = static_cast<size_t>(count);
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous() &&
                  static_cast<size_t>(bytes.numel()) == encodedBytes(codec, n),
              "ringdist testing: expected the ", encodedBytes(codec, n), " encoded bytes of ",
              count, " values as a contiguous uint8 tensor");
  at::Tensor out = acc.has_value() ? acc->contiguous().clone()
                                   : at::empty({count}, bytes.options().dtype(at::kFloat));
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.numel() == count && out.device() == bytes.device(),
              "ringdist testing: acc must be float32 with count values on the bytes' device");
  if (impl == "cuda") {
#ifdef RINGDIST_CUDA
    c10::cuda::CUDAGuard guard(bytes.device());
    auto stream = c10::cuda::getCurrentCUDAStream().stream();
    acc.has_value() ? cuda::decodeAdd(codec, bytes.data_ptr(), n, out.data_ptr<float>(), stream)
                    : cuda::decode(codec, bytes.data_ptr(), n, out.data_ptr<float>(), stream);
    return out;
#else
    TORCH_CHECK(false, "ringdist testing: this build of ringdist has no CUDA kernels");
#endif
  }
  TORCH_CHECK(bytes.device().is_cpu() && (impl == "cpu" || impl == "shared"),
              "ringdist testing: impl must be cpu, shared or cuda");
  if (impl == "shared") {
    decodeElementwise(codec, static_cast<const char*>(bytes.data_ptr()), n, out.data_ptr<float>(),
                 acc.has_value());
  } else if (acc.has_value()) {
    decodeAdd(codec, bytes.data_ptr(), n, out.data_ptr<float>());
  } else {
    decode(codec, bytes.data_ptr(), n, out.data_ptr<float>());
  }
  return out;
}

// ---------------------------------------------------------------- top-k

namespace {

// The passes of the radix select over x (n entries): per pass a histogram of
// the digits and the digit holding the cut of the k largest magnitudes.
// Returns the cut's key and how many entries equal to it are taken.
topkmath::RadixState radixPasses(const float* x, size_t n, uint32_t k) {
  namespace tm = topkmath;
  tm::RadixState s{0u, k};
  std::vector<uint32_t> hist(tm::kMaxRadixBins);
  for (int pass = 0; pass < tm::kRadixPasses; ++pass) {
    std::fill(hist.begin(), hist.end(), 0u);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t key = tm::magnitudeKey(x[i]);
      if (tm::inPrefix(key, s, pass)) ++hist[tm::radixDigit(key, pass)];
    }
    // Every digit is tested, as the GPU's threads do: exactly one may hold the cut.
    uint32_t above = 0;
    int holders = 0;
    tm::RadixState next = s;
    for (int d = static_cast<int>(tm::radixBins(pass)) - 1; d >= 0; --d) {
      if (tm::holdsCut(above, hist[d], s.remaining)) {
        next = tm::narrowTo(s, pass, static_cast<uint32_t>(d), above);
        ++holders;
      }
      above += hist[d];
    }
    TORCH_CHECK(holders == 1, "ringdist testing: pass ", pass, ": ", holders,
                " digits hold the cut, want 1");
    s = next;
  }
  return s;
}

}  // namespace

// The GPU's radix select (csrc/gpu/cuda/topk.cu) rehearsed on the host, step by
// step through the same shared functions: x = residual + grad, a histogram
// and the digit holding the cut per pass, then per tile of `tile` entries the
// counts, the offsets before each tile, and the writes in index order. Output
// and residual as topk_select.
void topkRadixSelect(const at::Tensor& grad, std::optional<at::Tensor> residual, int64_t k,
                     at::Tensor& packed, int64_t tile) {
  namespace tm = topkmath;
  auto floats = [](const at::Tensor& t) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
                "ringdist testing: expected contiguous float32 CPU tensors");
    return t.data_ptr<float>();
  };
  const size_t n = static_cast<size_t>(grad.numel());
  TORCH_CHECK(k >= 0 && static_cast<size_t>(k) <= n && packed.numel() == 2 * k && tile > 0,
              "ringdist testing: need 0 <= k <= n, packed of 2k and tile > 0");
  const float* g = floats(grad);
  float* res = residual.has_value() ? floats(*residual) : nullptr;
  TORCH_CHECK(res == nullptr || static_cast<size_t>(residual->numel()) == n,
              "ringdist testing: residual must match grad");
  float* values = floats(packed);
  auto* indices = reinterpret_cast<int32_t*>(values + k);
  const float* x = res != nullptr ? res : g;
  if (res != nullptr) {
    for (size_t i = 0; i < n; ++i) res[i] = res[i] + g[i];
  }
  if (k == 0) return;

  const tm::RadixState s = radixPasses(x, n, static_cast<uint32_t>(k));

  const size_t width = static_cast<size_t>(tile);
  const size_t tiles = (n + width - 1) / width;
  std::vector<uint32_t> chosenBefore(tiles), equalBefore(tiles);
  uint32_t equalSoFar = 0, chosenSoFar = 0;
  for (size_t t = 0; t < tiles; ++t) {
    uint32_t above = 0, equal = 0;
    for (size_t i = t * width; i < std::min(n, (t + 1) * width); ++i) {
      const uint32_t key = tm::magnitudeKey(x[i]);
      above += key > s.prefix ? 1u : 0u;
      equal += key == s.prefix ? 1u : 0u;
    }
    equalBefore[t] = equalSoFar;
    chosenBefore[t] = chosenSoFar;
    chosenSoFar += above + tm::equalTaken(equalSoFar, equal, s.remaining);
    equalSoFar += equal;
  }
  TORCH_CHECK(chosenSoFar == static_cast<uint32_t>(k), "ringdist testing: the tiles select ",
              chosenSoFar, " entries, want ", k);
  for (size_t t = 0; t < tiles; ++t) {
    uint32_t equalSeen = equalBefore[t];
    uint32_t place = chosenBefore[t];
    for (size_t i = t * width; i < std::min(n, (t + 1) * width); ++i) {
      const uint32_t key = tm::magnitudeKey(x[i]);
      const bool take = tm::selected(key, s.prefix, equalSeen, s.remaining);
      if (key == s.prefix) ++equalSeen;
      if (!take) continue;
      TORCH_CHECK(place < static_cast<uint32_t>(k), "ringdist testing: tile ", t,
                  " selects more than its offsets allow");
      values[place] = x[i];
      indices[place] = static_cast<int32_t>(i);
      if (res != nullptr) res[i] = 0.0f;
      ++place;
    }
  }
}

// copyBytes within one byte tensor, regions possibly overlapping.
void copyBytesWithin(at::Tensor& buffer, int64_t to, int64_t from, int64_t bytes) {
  TORCH_CHECK(buffer.scalar_type() == at::kByte && buffer.is_contiguous() && buffer.is_cpu(),
              "ringdist testing: copy_bytes takes a contiguous CPU uint8 tensor");
  TORCH_CHECK(to >= 0 && from >= 0 && bytes >= 0 && to + bytes <= buffer.numel() &&
                  from + bytes <= buffer.numel(),
              "ringdist testing: copy_bytes regions must lie inside the tensor");
  auto* base = buffer.data_ptr<uint8_t>();
  copyBytes(base + to, base + from, static_cast<size_t>(bytes));
}

int64_t ringForwardLag(int64_t roundTripUs, int64_t segmentBytes) {
  TORCH_CHECK(roundTripUs >= 0 && roundTripUs <= UINT32_MAX && segmentBytes > 0,
              "ringdist testing: ring_forward_lag takes a round trip in 0..2^32-1 us and a "
              "positive segment size");
  return static_cast<int64_t>(
      forwardLag(static_cast<uint32_t>(roundTripUs), static_cast<size_t>(segmentBytes)));
}

}  // namespace ringdist::testing
