#pragma once

#include <memory>
#include <string>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/transport/board.h"
#include "csrc/transport/channel.h"
#include "csrc/transport/host_identity.h"

namespace ringdist {
namespace shm {

// Connects this rank to the other ranks of `local` (sorted, this rank among
// them; all on this host) through one shared-memory segment: the lowest
// local rank creates it (random name, mode 0600) and publishes its name, the
// others map it, and the creator unlinks the name as soon as every local
// rank has mapped it, so nothing stays in /dev/shm, crash or not. Returns
// only once the name is gone, on every local rank. Sets channels[peer] for
// each local peer, and `board` to the local ranks' board areas (by rank).
// Every local rank returns the same choice of copy.
SameHostCopy connectLocal(Rendezvous& rendezvous, int rank, const std::vector<int>& local,
                          const MeshOptions& options,
                          std::vector<std::unique_ptr<Channel>>& channels,
                          std::shared_ptr<Board>* board);

}  // namespace shm
}  // namespace ringdist
