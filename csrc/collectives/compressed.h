#pragma once

#include <cstddef>

#include "csrc/codec/codec.h"
#include "csrc/collectives/communicator.h"

namespace ringdist {

// In place: data (count float32 elements) becomes the sum (or, with
// average, the mean) over all ranks, sent on the wire in `codec`. Each
// element is quantised exactly twice (once as a rank's contribution, once as
// the reduced value), whatever the world size; the sum is taken in float32
// in rank order; every rank decodes the same bytes, so results are bitwise
// identical on all ranks. See compressed_allreduce.cc.
void compressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                         bool average);

}  // namespace ringdist
