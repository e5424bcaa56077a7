#include "csrc/backend/tensor_ops.h"

#include <ATen/ATen.h>

#include "csrc/backend/dtypes.h"
#include "csrc/codec/codec.h"
#include "csrc/gpu/stage/device_stage.h"
#include "csrc/reduce/outer_step.h"
#include "csrc/topk/topk.h"
#ifdef RINGDIST_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "csrc/gpu/cuda/codec.h"
#include "csrc/gpu/cuda/topk.h"
#endif

namespace ringdist {

namespace {

#ifdef RINGDIST_CUDA
// The GPU round trip, queued on the current stream: the same encode/decode
// as the wire path (csrc/gpu/cuda/codec.h), so the residual is exactly what the
// compressed allreduce loses.
void cudaRoundTrip(Codec codec, const at::Tensor& in, at::Tensor& result, bool residual) {
  const size_t count = static_cast<size_t>(in.numel());
  if (count == 0) {
    return;
  }
  c10::cuda::CUDAGuard guard(in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(in.device().index()).stream();
  at::Tensor wire = at::empty({static_cast<int64_t>(encodedBytes(codec, count))},
                              in.options().dtype(at::kByte));
  cuda::encode(codec, in.data_ptr<float>(), count, wire.data_ptr(), stream);
  cuda::decode(codec, wire.data_ptr(), count, result.data_ptr<float>(), stream);
  if (residual) {
    at::sub_out(result, in, result);  // one IEEE subtraction per element, as on the CPU
  }
}
#endif

// The top-k kernels' and DiLoCo passes' operands: contiguous float32 tensors on one device,
// the CPU or (CUDA builds, top-k) a GPU.
void checkFloat32Operand(const char* what, const at::Tensor& t, const char* name,
                         const at::Device& device) {
  TORCH_CHECK(t.device() == device && t.layout() == at::kStrided &&
                  t.scalar_type() == at::kFloat && t.is_contiguous(),
              "ringdist ", what, ": ", name, " must be a contiguous float32 tensor on ", device,
              ", got ", t.scalar_type(), " on ", t.device());
}

at::Device topkDevice(const char* what, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() || (t.is_cuda() && kCudaCompiled), "ringdist ", what,
              ": expected tensors on the CPU", kCudaCompiled ? " or a GPU" : "", ", got ",
              t.device(), kCudaCompiled ? "" : " (this build of ringdist has no CUDA kernels)");
  return t.device();
}

}  // namespace

at::Tensor codecRoundTrip(const at::Tensor& tensor, const std::string& name,
                          std::optional<at::Tensor> out, bool residual) {
  Codec codec = parseCodec(name);
  TORCH_CHECK((tensor.device().is_cpu() || (tensor.is_cuda() && kCudaCompiled)) &&
                  tensor.layout() == at::kStrided && tensor.scalar_type() == at::kFloat,
              "ringdist codec_roundtrip: expected a dense float32 CPU",
              kCudaCompiled ? " or CUDA" : "", " tensor, got ", tensor.scalar_type(), " on ",
              tensor.device());
  at::Tensor in = tensor.contiguous();
  at::Tensor result = out.has_value() ? *out : at::empty_like(in);
  TORCH_CHECK(result.scalar_type() == at::kFloat && result.is_contiguous() &&
                  result.numel() == in.numel() && result.device() == in.device(),
              "ringdist codec_roundtrip: out must be a contiguous float32 tensor of ",
              in.numel(), " elements on ", in.device());
#ifdef RINGDIST_CUDA
  if (in.is_cuda()) {
    cudaRoundTrip(codec, in, result, residual);
    return result;
  }
#endif
  if (residual) {
    roundTripError(codec, in.data_ptr<float>(), static_cast<size_t>(in.numel()),
                   result.data_ptr<float>());
  } else {
    roundTrip(codec, in.data_ptr<float>(), static_cast<size_t>(in.numel()),
              result.data_ptr<float>());
  }
  return result;
}

size_t codecEncodedBytes(const std::string& codec, size_t count) {
  return encodedBytes(parseCodec(codec), count);
}

void topkSelect(const at::Tensor& grad, std::optional<at::Tensor> residual, int64_t k,
                at::Tensor& packed) {
  const char* what = "topk_select";
  const at::Device device = topkDevice(what, grad);
  checkFloat32Operand(what, grad, "grad", device);
  checkFloat32Operand(what, packed, "packed", device);
  const int64_t n = grad.numel();
  TORCH_CHECK(k >= 0 && k <= n && packed.numel() == 2 * k, "ringdist topk_select: k = ", k,
              " of ", n, " entries with packed of ", packed.numel(), " (want 2k)");
  float* res = nullptr;
  if (residual.has_value()) {
    checkFloat32Operand(what, *residual, "residual", device);
    TORCH_CHECK(residual->numel() == n, "ringdist topk_select: residual has ", residual->numel(),
                " entries, grad ", n);
    res = residual->data_ptr<float>();
  }
  float* values = packed.data_ptr<float>();
  auto* indices = reinterpret_cast<int32_t*>(values + k);
#ifdef RINGDIST_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    at::Tensor workspace = at::empty(
        {static_cast<int64_t>(cuda::topkSelectWorkspaceBytes(static_cast<size_t>(n)))},
        grad.options().dtype(at::kByte));
    cuda::topkSelect(grad.data_ptr<float>(), res, static_cast<size_t>(n), static_cast<size_t>(k),
                     values, indices, workspace.data_ptr(),
                     c10::cuda::getCurrentCUDAStream(device.index()).stream());
    return;
  }
#endif
  topkSelect(grad.data_ptr<float>(), res, static_cast<size_t>(n), static_cast<size_t>(k), values,
             indices);
}

void topkScatter(const at::Tensor& parts, int64_t world, int64_t k, at::Tensor& out) {
  const char* what = "topk_scatter";
  const at::Device device = topkDevice(what, out);
  checkFloat32Operand(what, parts, "parts", device);
  checkFloat32Operand(what, out, "out", device);
  TORCH_CHECK(world >= 1 && k >= 0 && parts.numel() == 2 * k * world,
              "ringdist topk_scatter: parts has ", parts.numel(), " entries, want 2 x k (", k,
              ") x world (", world, ")");
#ifdef RINGDIST_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    at::Tensor flag = at::empty({8}, out.options().dtype(at::kByte));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    cuda::topkScatter(parts.data_ptr<float>(), static_cast<size_t>(world), static_cast<size_t>(k),
                      static_cast<size_t>(out.numel()), out.data_ptr<float>(), flag.data_ptr(),
                      stream);
    return;
  }
#endif
  topkScatter(parts.data_ptr<float>(), static_cast<size_t>(world), static_cast<size_t>(k),
              static_cast<size_t>(out.numel()), out.data_ptr<float>());
}

// ------------------------------------------------------------ DiLoCo's round passes

namespace {

// A fragment's parameters (contiguous float32 CPU tensors) as spans; their total in `total`.
std::vector<FloatSpan> fragmentSpans(const char* what, const std::vector<at::Tensor>& params,
                                     int64_t& total) {
  std::vector<FloatSpan> spans;
  spans.reserve(params.size());
  total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    checkFloat32Operand(what, p, c10::str("parameter ", i).c_str(), at::kCPU);
    spans.push_back(FloatSpan{p.data_ptr<float>(), static_cast<size_t>(p.numel())});
    total += p.numel();
  }
  return spans;
}

// A flat operand of the fragment's length.
float* fragmentFlat(const char* what, const at::Tensor& t, const char* name, int64_t total) {
  checkFloat32Operand(what, t, name, at::kCPU);
  TORCH_CHECK(t.numel() == total, "ringdist ", what, ": ", name, " has ", t.numel(),
              " elements, the parameters ", total);
  return t.data_ptr<float>();
}

// Written through its pointer: autograd sees the change as after an in-place op.
void bumpVersion(const at::Tensor& t) { t.unsafeGetTensorImpl()->bump_version(); }

}  // namespace

void dilocoDelta(const std::vector<at::Tensor>& params, const at::Tensor& theta, at::Tensor& out,
                 std::optional<at::Tensor> residual, std::optional<at::Tensor> sent) {
  const char* what = "diloco_delta";
  int64_t total = 0;
  const std::vector<FloatSpan> spans = fragmentSpans(what, params, total);
  const float* res = residual ? fragmentFlat(what, *residual, "residual", total) : nullptr;
  float* kept = sent ? fragmentFlat(what, *sent, "sent", total) : nullptr;
  roundDelta(spans, fragmentFlat(what, theta, "theta", total),
             fragmentFlat(what, out, "out", total), res, kept);
  bumpVersion(out);
  if (sent) bumpVersion(*sent);
}

void dilocoOuterStep(const std::vector<at::Tensor>& params, at::Tensor& theta,
                     const at::Tensor& avg, std::optional<at::Tensor> buffer, bool firstRound,
                     double lr, double momentum, bool nesterov, std::optional<double> alpha) {
  const char* what = "diloco_outer_step";
  int64_t total = 0;
  const std::vector<FloatSpan> spans = fragmentSpans(what, params, total);
  TORCH_CHECK((momentum != 0) == buffer.has_value(), "ringdist ", what, ": a momentum buffer ",
              "goes with a momentum other than 0 (momentum ", momentum, ")");
  float* buf = buffer ? fragmentFlat(what, *buffer, "buffer", total) : nullptr;
  // Scalars as torch rounds them for float32 tensors.
  const OuterStep step{static_cast<float>(lr), static_cast<float>(momentum), nesterov, firstRound,
                       alpha.has_value(), static_cast<float>(alpha.value_or(1.0)),
                       static_cast<float>(1.0 - alpha.value_or(1.0))};
  outerStep(spans, fragmentFlat(what, theta, "theta", total), fragmentFlat(what, avg, "avg", total),
            buf, step);
  bumpVersion(theta);
  if (buffer) bumpVersion(*buffer);
  for (const at::Tensor& p : params) bumpVersion(p);
}

}  // namespace ringdist
