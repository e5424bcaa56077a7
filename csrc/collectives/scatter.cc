// Scatter: the root's input block r goes straight to rank r over the mesh
// (rooted.h).
#include "csrc/collectives/collectives.h"
#include "csrc/collectives/rooted.h"

namespace ringdist {

void scatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
             DataType dtype, int root) {
  // The root's inputs are only read (sends, and the copy of its own block).
  rootedTransfers(comm, OpType::kScatter, count, dtype, root, false,
                  const_cast<void* const*>(inputs), output);
}

}  // namespace ringdist
