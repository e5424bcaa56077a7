#pragma once

#include <cstddef>

#include "csrc/collectives/communicator.h"
#include "csrc/common/types.h"

namespace ringdist {

// What gather and scatter share: direct transfers over the mesh between the
// root and every other rank, one block of `count` elements each. The root
// posts all its transfers at once and lets the progress loop move them
// concurrently. toRoot: blocks travel to the root (gather) or from it
// (scatter). rootBlocks[r] is rank r's block on the root (unused elsewhere);
// own is this rank's block (the root copies it across to rootBlocks[root]).
void rootedTransfers(Communicator& comm, OpType type, size_t count, DataType dtype, int root,
                     bool toRoot, void* const* rootBlocks, void* own);

}  // namespace ringdist
