#pragma once

// Data parallelism for LibTorch programs over a ringdist group:
//
//   auto group = torch_ringdist::init();
//   torch_ringdist::DataParallel dp(group, model->parameters());   // rank 0's values everywhere
//   for (...) {
//     optimizer.zero_grad();
//     loss_fn(model->forward(my_shard_of_the_batch)).backward();
//     dp.synchronizeGradients();                                  // every rank: the mean gradient
//     optimizer.step();
//   }
//
// It is not torch's DistributedDataParallel, which exists only in Python: the
// gradients are averaged after backward() returns, not while it runs (DDP
// hooks autograd to start each bucket's allreduce as soon as its gradients are
// ready, overlapping communication with the rest of backward). Here the
// buckets' allreduces run together after backward, so a step costs backward +
// allreduce rather than about the larger of the two. What DDP's no_sync()
// does needs no API: call backward() on several micro-batches and
// synchronizeGradients() once, before the optimizer step.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "torch_ringdist/export.h"

namespace torch_ringdist {

struct DataParallelOptions {
  // Gradients travel in flat buckets of at most this many bytes (one
  // allreduce each, all in flight together); DDP's default bucket_cap_mb.
  size_t bucketBytes = 25u << 20;
  // "" for exact averaging; "fp16", "bf16", "int8" or "int4": ringdist's compressed
  // allreduce (float32 gradients, summed in float32), as the Python hooks.
  std::string codec;
};

class TORCH_RINGDIST_API DataParallel {
 public:
  // Copies rank 0's parameter values to every rank (collective: every rank
  // constructs it with the same parameters, in the same order).
  DataParallel(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<at::Tensor> parameters,
               DataParallelOptions options = {});

  // Replaces every parameter's .grad with its mean over the ranks (a
  // parameter without a gradient counts as zeros, and gets that mean, as in
  // DDP). Collective: every rank calls it at the same point.
  void synchronizeGradients();

  // Copies rank `root`'s values of `tensors` into every rank's (e.g. the
  // model's buffers, which DDP broadcasts before each forward).
  static void broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                        const std::vector<at::Tensor>& tensors, int root = 0);

  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

 private:
  // Parameters of one device and dtype, flattened back to back.
  struct Bucket {
    std::vector<size_t> members;  // indices into parameters_
    at::Tensor flat;
  };

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> parameters_;
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
};

}  // namespace torch_ringdist
