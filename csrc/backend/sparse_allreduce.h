#pragma once

#include <ATen/core/Tensor.h>

#include "csrc/collectives/communicator.h"

namespace ringdist {

// SUM allreduce of a sparse COO CPU tensor, in place (the tensor's indices and
// values are replaced by the result's, as gloo does). Each rank coalesces its
// tensor; every rank's indices and values go to every rank (an all-gather of
// each rank's own size) and are summed in rank order (merges of coalesced
// tensors), the same on every rank, so results are identical everywhere.
// Gathering, not a dense allreduce: a sparse gradient (the embedding rows a
// batch touched) is a small part of its dense size, and N x nnz rows cost
// far less than the whole table. Ranks whose tensors differ in shape fail
// with both shapes named. Runs on the worker.
void sparseAllreduce(Communicator& comm, at::Tensor tensor);

}  // namespace ringdist
