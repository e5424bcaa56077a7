#pragma once

#include <memory>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/transport/channel.h"

namespace ringdist {
namespace shm {

// Connects this rank to the other ranks of `local` (sorted, this rank among
// them; all on this host) through one shared-memory segment: the lowest
// local rank creates it (random name, mode 0600) and publishes its name, the
// others map it, and the creator unlinks the name as soon as every local
// rank has mapped it, so nothing stays in /dev/shm, crash or not. Returns
// only once the name is gone, on every local rank. Sets channels[peer] for
// each local peer.
void connectLocal(Rendezvous& rendezvous, int rank, const std::vector<int>& local,
                  const MeshOptions& options, std::vector<std::unique_ptr<Channel>>& channels);

}  // namespace shm
}  // namespace ringdist
