#include "csrc/backend/sparse_allreduce.h"

#include <ATen/ATen.h>
#include <ATen/native/SparseTensorUtils.h>

#include <algorithm>
#include <vector>

#include "csrc/backend/dtypes.h"
#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

// Every rank's `count` int64 values; out[r * count + i] is rank r's i-th.
std::vector<int64_t> allgatherInts(Communicator& comm, const std::vector<int64_t>& mine) {
  const size_t count = mine.size();
  std::vector<int64_t> all(count * static_cast<size_t>(comm.size()));
  std::vector<void*> outputs;
  for (int r = 0; r < comm.size(); ++r) outputs.push_back(all.data() + static_cast<size_t>(r) * count);
  allgather(comm, mine.data(), outputs.data(), count, DataType::kInt64);
  return all;
}

std::string shapeText(const int64_t* meta, const int64_t* sizes, int64_t dims) {
  std::string text = "[";
  for (int64_t d = 0; d < dims; ++d) text += strCat(d > 0 ? ", " : "", sizes[d]);
  return strCat(text, "] with ", meta[1], " sparse and ", meta[2], " dense dims");
}

// Each rank's block of `tensor` (`elements` per rank) gathered into blocks[r].
void allgatherBlocks(Communicator& comm, const at::Tensor& mine, std::vector<at::Tensor>& blocks,
                     DataType dtype) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<const void*> inputs(n, mine.data_ptr());
  std::vector<uint64_t> sendCounts(n, static_cast<uint64_t>(mine.numel()));
  std::vector<void*> outputs;
  std::vector<uint64_t> recvCounts;
  for (auto& block : blocks) {
    outputs.push_back(block.data_ptr());
    recvCounts.push_back(static_cast<uint64_t>(block.numel()));
  }
  alltoall(comm, inputs.data(), sendCounts, outputs.data(), recvCounts, dtype);
}

}  // namespace

void sparseAllreduce(Communicator& comm, at::Tensor tensor) {
  const int n = comm.size();
  const int64_t dims = tensor.dim();
  // Coalesced first (as gloo does): repeated rows are summed before they travel.
  const at::Tensor local = tensor.coalesce();
  const int64_t coalescedNnz = local._nnz();
  // Layout first: ranks must agree on it before they exchange sizes.
  const std::vector<int64_t> meta = allgatherInts(
      comm, {dims, tensor.sparse_dim(), tensor.dense_dim(), coalescedNnz});
  for (int r = 0; r < n; ++r) {
    const int64_t* theirs = meta.data() + 4 * r;
    RINGDIST_CHECK(theirs[0] == dims && theirs[1] == tensor.sparse_dim(), "rank ", r,
                   " has a sparse tensor of ", theirs[0], " dims (", theirs[1],
                   " sparse), this rank one of ", dims, " (", tensor.sparse_dim(), " sparse)");
  }
  std::vector<int64_t> mySizes(tensor.sizes().begin(), tensor.sizes().end());
  const std::vector<int64_t> sizes = allgatherInts(comm, mySizes);
  for (int r = 0; r < n; ++r) {
    const int64_t* theirs = sizes.data() + dims * r;
    RINGDIST_CHECK(std::equal(mySizes.begin(), mySizes.end(), theirs), "rank ", r,
                   " has a sparse tensor of shape ", shapeText(meta.data() + 4 * r, theirs, dims),
                   ", this rank one of ", shapeText(meta.data() + 4 * comm.rank(), mySizes.data(), dims));
  }

  const at::Tensor indices = local._indices().contiguous();
  const at::Tensor values = local._values().contiguous();
  DataType dtype = DataType::kFloat32;
  toDataType(values.scalar_type(), &dtype);  // checked at the call
  std::vector<at::Tensor> indexBlocks, valueBlocks;
  for (int r = 0; r < n; ++r) {
    const int64_t nnz = meta[static_cast<size_t>(4 * r + 3)];
    indexBlocks.push_back(at::empty({indices.size(0), nnz}, indices.options()));
    std::vector<int64_t> rowShape(values.sizes().begin(), values.sizes().end());
    rowShape[0] = nnz;
    valueBlocks.push_back(at::empty(rowShape, values.options()));
  }
  allgatherBlocks(comm, indices, indexBlocks, DataType::kInt64);
  allgatherBlocks(comm, values, valueBlocks, dtype);
  // Each block is a rank's coalesced tensor: summing them in rank order is a linear merge
  // each (sparse add of coalesced operands), cheaper than sorting the concatenation.
  at::Tensor result;
  for (int r = 0; r < n; ++r) {
    at::Tensor part = at::_sparse_coo_tensor_unsafe(indexBlocks[static_cast<size_t>(r)],
                                                    valueBlocks[static_cast<size_t>(r)],
                                                    tensor.sizes(), values.options());
    part._coalesced_(true);
    result = r == 0 ? part : result.add(part);
  }
  // The result's indices and values become the tensor's (what copy_ would do, minus the copy).
  at::sparse::get_sparse_impl(tensor)->set_indices_and_values_unsafe(result._indices(),
                                                                     result._values());
  tensor._coalesced_(true);
}

}  // namespace ringdist
