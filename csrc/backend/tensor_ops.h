#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "torch_ringdist/export.h"

namespace ringdist {

// The codec and top-k kernels of the DDP hooks on tensors: CPU tensors, or
// (CUDA builds) tensors of one GPU, queued on its current stream. Bound as
// torch_ringdist._C.codec_roundtrip, codec_encoded_bytes, topk_select, topk_scatter.

// decode(encode(tensor)) for a float32 tensor: what it becomes as one rank's
// contribution to a compressed allreduce; with residual, tensor - that (the
// error that error feedback carries to the next step). Into `out` if given.
TORCH_RINGDIST_API at::Tensor codecRoundTrip(const at::Tensor& tensor, const std::string& codec,
                                             std::optional<at::Tensor> out, bool residual);

// Bytes of the encoding of `count` float32 values.
TORCH_RINGDIST_API size_t codecEncodedBytes(const std::string& codec, size_t count);

// Top-k of x = grad + residual by magnitude, ties to the lower index:
// packed[:k] = values, packed[k:] = int32 indices (float32 bits), ascending.
// The residual becomes x with the selected entries zeroed.
TORCH_RINGDIST_API void topkSelect(const at::Tensor& grad, std::optional<at::Tensor> residual,
                                   int64_t k, at::Tensor& packed);

// out = zeros, then out[idx] += value / world for each rank's packed block
// of parts, in rank order.
TORCH_RINGDIST_API void topkScatter(const at::Tensor& parts, int64_t world, int64_t k,
                                    at::Tensor& out);

// DiLoCo's round passes (csrc/reduce/outer_step.h) on a fragment's parameters, contiguous
// float32 CPU tensors, read and written in place. dilocoDelta: out = params - theta, sent =
// out + residual. dilocoOuterStep: theta stepped by SGD with gradient -avg (buffer: the momentum
// buffer, given with a momentum other than 0; firstRound: it starts as the gradient), then the
// parameters set to theta, or with alpha mixed: alpha * params + (1 - alpha) * theta.
TORCH_RINGDIST_API void dilocoDelta(const std::vector<at::Tensor>& params,
                                    const at::Tensor& theta, at::Tensor& out,
                                    std::optional<at::Tensor> residual,
                                    std::optional<at::Tensor> sent);
TORCH_RINGDIST_API void dilocoOuterStep(const std::vector<at::Tensor>& params, at::Tensor& theta,
                                        const at::Tensor& avg, std::optional<at::Tensor> buffer,
                                        bool firstRound, double lr, double momentum,
                                        bool nesterov, std::optional<double> alpha);

}  // namespace ringdist
