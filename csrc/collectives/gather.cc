// Gather: every rank's input lands in the root's output blocks, straight
// from each rank over the mesh (rooted.h).
#include "csrc/collectives/collectives.h"
#include "csrc/collectives/rooted.h"

namespace ringdist {

void gather(Communicator& comm, const void* input, void* const* outputs, size_t count,
            DataType dtype, int root) {
  // The input is only read: a send, or the root's copy into its own block.
  rootedTransfers(comm, OpType::kGather, count, dtype, root, true, outputs,
                  const_cast<void*>(input));
}

}  // namespace ringdist
