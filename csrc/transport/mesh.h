#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "csrc/common/rendezvous.h"
#include "csrc/transport/channel.h"

namespace ringdist {

struct MeshOptions {
  std::string bindIp;                 // listen here; never a wildcard address
  std::chrono::milliseconds timeout;  // for the whole connect phase
};

// Connects this rank to every other rank of the group through the
// rendezvous: each rank publishes its listening address, higher ranks dial
// lower ones, and every connection proves it belongs to this group (a random
// per-group token published by rank 0) before it becomes a Channel.
// Returns one channel per rank; the entry for this rank is null.
std::vector<std::unique_ptr<Channel>> connectMesh(Rendezvous& rendezvous, int rank, int size,
                                                  const MeshOptions& options);

}  // namespace ringdist
