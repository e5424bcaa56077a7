// torch.ops.ringdist: synchronous collectives on a ringdist group as torch
// operators (torch_ringdist.direct_all_reduce / direct_all_gather in Python).
// They skip c10d's ProcessGroup dispatch and hand the caller no Work or
// Future: the backend's own call runs on the caller's thread when the group is
// idle (the latency path, Worker::runNow) and returns when done. Same
// engine and result bits as dist.all_reduce. Meta kernels let torch.compile
// trace them (all_reduce_ declares its mutation).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/library.h>

#include "csrc/backend/process_group.h"

namespace ringdist {

namespace {

c10d::ReduceOp reduceOpNamed(const std::string& name) {
  static const std::pair<const char*, c10d::ReduceOp::RedOpType> kOps[] = {
      {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG},
      {"product", c10d::ReduceOp::PRODUCT}, {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX}, {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR}, {"bxor", c10d::ReduceOp::BXOR}};
  for (const auto& [known, op] : kOps) {
    if (name == known) return c10d::ReduceOp(op);
  }
  TORCH_CHECK(false, "ringdist direct all_reduce: unknown reduce op '", name,
              "' (sum, avg, product, min, max, band, bor, bxor)");
}

// The ringdist backend of the group registered under `groupName` (torch's
// group_name); the registry keeps it alive during the call.
ProcessGroupRingdist& ringdistGroup(const char* what, const std::string& groupName) {
  return ringdistOf(c10d::resolve_process_group(groupName), what);
}

void allReduce(at::Tensor& tensor, const std::string& op, const std::string& groupName) {
  ringdistGroup("ringdist direct all_reduce", groupName).directAllreduce(tensor, reduceOpNamed(op));
}

// The ranks' inputs stacked along dimension 0, as all_gather_into_tensor.
std::vector<int64_t> gatheredShape(const at::Tensor& input, int64_t ranks) {
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) {
    shape.push_back(ranks);
  } else {
    shape[0] *= ranks;
  }
  return shape;
}

at::Tensor allGather(const at::Tensor& input, const std::string& groupName) {
  auto& group = ringdistGroup("ringdist direct all_gather", groupName);
  at::Tensor output = at::empty(gatheredShape(input, group.getSize()), input.options());
  group.directAllgather(output, input);
  return output;
}

void allReduceMeta(at::Tensor&, const std::string&, const std::string&) {}

at::Tensor allGatherMeta(const at::Tensor& input, const std::string& groupName) {
  const int64_t ranks = c10d::resolve_process_group(groupName)->getSize();
  return at::empty(gatheredShape(input, ranks), input.options());
}

}  // namespace

TORCH_LIBRARY(ringdist, m) {
  // Returns nothing: functionalization (torch.compile) takes no aliased outputs of custom ops.
  m.def("all_reduce_(Tensor(a!) tensor, str op, str group_name) -> ()");
  m.def("all_gather(Tensor input, str group_name) -> Tensor");
}

TORCH_LIBRARY_IMPL(ringdist, CPU, m) {
  m.impl("all_reduce_", &allReduce);
  m.impl("all_gather", &allGather);
}

TORCH_LIBRARY_IMPL(ringdist, Meta, m) {
  m.impl("all_reduce_", &allReduceMeta);
  m.impl("all_gather", &allGatherMeta);
}

}  // namespace ringdist
