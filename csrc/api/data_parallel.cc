// Data parallelism for C++ programs (include/torch_ringdist/data_parallel.h):
// gradients averaged in flat buckets after backward().
#include "torch_ringdist/data_parallel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "csrc/codec/codec.h"
#include "torch_ringdist/ringdist.h"

namespace torch_ringdist {

namespace {

// Groups tensors of one device and dtype, in order, into buckets of at most
// `bucketBytes` (a larger tensor gets a bucket of its own).
std::vector<std::vector<size_t>> bucketize(const std::vector<at::Tensor>& tensors,
                                           const std::vector<size_t>& indices,
                                           size_t bucketBytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bytes;
  for (size_t i : indices) {
    const at::Tensor& t = tensors[i];
    const size_t size = static_cast<size_t>(t.numel()) * t.element_size();
    bool placed = false;
    for (size_t b = 0; b < buckets.size() && !placed; ++b) {
      const at::Tensor& first = tensors[buckets[b].front()];
      if (first.device() == t.device() && first.scalar_type() == t.scalar_type() &&
          bytes[b] + size <= bucketBytes) {
        buckets[b].push_back(i);
        bytes[b] += size;
        placed = true;
      }
    }
    if (!placed) {
      buckets.push_back({i});
      bytes.push_back(size);
    }
  }
  return buckets;
}

at::Tensor flatBuffer(const std::vector<at::Tensor>& tensors, const std::vector<size_t>& members) {
  int64_t count = 0;
  for (size_t i : members) count += tensors[i].numel();
  return at::empty({count}, tensors[members.front()].options().requires_grad(false));
}

// The pieces of `flat` that hold each member, shaped as the member.
template <class Visit>
void forEachPiece(const at::Tensor& flat, const std::vector<at::Tensor>& tensors,
                  const std::vector<size_t>& members, Visit visit) {
  int64_t offset = 0;
  for (size_t i : members) {
    const int64_t n = tensors[i].numel();
    visit(i, flat.narrow(0, offset, n).view(tensors[i].sizes()));
    offset += n;
  }
}

void checkParameter(const at::Tensor& p, size_t index) {
  TORCH_CHECK(p.defined() && p.layout() == at::kStrided,
              "torch_ringdist DataParallel: parameter ", index, " is ",
              p.defined() ? "not a dense tensor" : "undefined");
}

}  // namespace

DataParallel::DataParallel(c10::intrusive_ptr<c10d::ProcessGroup> group,
                           std::vector<at::Tensor> parameters, DataParallelOptions options)
    : group_(std::move(group)), parameters_(std::move(parameters)), options_(std::move(options)) {
  ringdistBackend(group_);  // raises for a group of another backend
  TORCH_CHECK(options_.bucketBytes > 0, "torch_ringdist DataParallel: bucketBytes must be > 0");
  const std::string& codec = options_.codec;
  ringdist::Codec known;
  TORCH_CHECK(codec.empty() || ringdist::codecFromName(codec, &known),
              "torch_ringdist DataParallel: unknown codec '", codec,
              "' (known: fp16, bf16, int8, int4, or empty for exact averaging)");
  std::vector<size_t> trained;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i];
    checkParameter(p, i);
    if (!p.requires_grad()) {
      continue;  // frozen: never has a gradient, as DDP skips it
    }
    const auto type = p.scalar_type();
    TORCH_CHECK(codec.empty() || type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
                "torch_ringdist DataParallel: codec '", codec,
                "' takes float32, bfloat16 or float16 gradients; parameter ", i, " is ", type);
    trained.push_back(i);
  }
  for (auto& members : bucketize(parameters_, trained, options_.bucketBytes)) {
    at::Tensor flat = flatBuffer(parameters_, members);
    buckets_.push_back({std::move(members), std::move(flat)});
  }
  broadcast(group_, parameters_, 0);
}

void DataParallel::synchronizeGradients() {
  at::NoGradGuard noGrad;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (Bucket& bucket : buckets_) {
    forEachPiece(bucket.flat, parameters_, bucket.members, [&](size_t i, at::Tensor piece) {
      const at::Tensor& grad = parameters_[i].grad();
      if (grad.defined()) {
        piece.copy_(grad);
      } else {
        piece.zero_();
      }
    });
    if (options_.codec.empty()) {
      std::vector<at::Tensor> tensors{bucket.flat};
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::AVG;
      works.push_back(group_->allreduce(tensors, opts));
    } else {
      works.push_back(allreduceCompressed(group_, bucket.flat, options_.codec, /*average=*/true));
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    works[b]->wait();
    forEachPiece(buckets_[b].flat, parameters_, buckets_[b].members, [&](size_t i, at::Tensor piece) {
      at::Tensor& grad = parameters_[i].mutable_grad();
      if (grad.defined()) {
        grad.copy_(piece);
      } else {
        grad = piece.clone();
      }
    });
  }
}

void DataParallel::broadcast(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                             const std::vector<at::Tensor>& tensors, int root) {
  at::NoGradGuard noGrad;
  std::vector<size_t> all(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    checkParameter(tensors[i], i);
    all[i] = i;
  }
  for (const auto& members : bucketize(tensors, all, DataParallelOptions().bucketBytes)) {
    at::Tensor flat = flatBuffer(tensors, members);
    forEachPiece(flat, tensors, members, [&](size_t i, at::Tensor piece) { piece.copy_(tensors[i]); });
    std::vector<at::Tensor> buffer{flat};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    group->broadcast(buffer, opts)->wait();
    forEachPiece(flat, tensors, members, [&](size_t i, at::Tensor piece) {
      at::Tensor target = tensors[i];  // shares the storage: the copy lands in the caller's tensor
      target.copy_(piece);
    });
  }
}

}  // namespace torch_ringdist
